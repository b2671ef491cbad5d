import re
from pathlib import Path

from setuptools import find_packages, setup

HERE = Path(__file__).parent
VERSION = re.search(r'__version__ = "([^"]+)"', (HERE / "jitflops" / "_version.py").read_text(encoding="utf-8")).group(1)

setup(
    name="jitflops",
    version=VERSION,
    description="What a PyTorch model costs: parameters, FLOPs, activations and latency, per operator and per module.",
    long_description=(HERE / "README.md").read_text(encoding="utf-8"),
    long_description_content_type="text/markdown",
    author="The jitflops developers",
    url="https://github.com/jitflops/jitflops",
    project_urls={"Source": "https://github.com/jitflops/jitflops", "Issues": "https://github.com/jitflops/jitflops/issues"},
    packages=find_packages(include=["jitflops", "jitflops.*"]),
    package_data={"jitflops": ["py.typed"]},
    python_requires=">=3.10",
    # tqdm: the progress bar; iopath needs it too. numpy: torch warns at its import without it ("Failed to initialize NumPy")
    install_requires=["torch>=2.10", "numpy", "tabulate>=0.10", "iopath>=0.1.9", "tqdm"],
    extras_require={
        # expecttest: torch's op database (torch.testing._internal) imports it; hypothesis: generated models
        # accelerate: transformers' Trainer needs it; pytorch-lightning: the Lightning callback's
        # tests; selenium: the HTML report in Chromium; build: the wheel built and installed outside the tree;
        # diffusers: a named diffusers component; torchao: its int8 and int4 quantized layers; pytest-xdist: the suite on two processes
        "test": ["pytest>=7", "pytest-xdist", "build", "diffusers", "fvcore==0.1.5.post20221221", "transformers>=4.50", "accelerate", "expecttest", "hypothesis", "pytorch-lightning>=2.1", "selenium>=4.10", "torchao==0.18.0"],
    },
    entry_points={"console_scripts": ["jitflops=jitflops.cli:main"]},
    license="MIT",
    license_files=["LICENSE"],
)
