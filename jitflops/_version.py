"""The package's version: the one place it is written (``jitflops.__version__`` and ``setup.py`` read it)."""

__version__ = "0.1.0"
