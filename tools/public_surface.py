"""The public surface of the package, written to ``tests/public_surface.json``: the module paths
users import (the package, fvcore's module paths, the documented ones) and the public names each
defines (``__all__`` where it has one), for ``tests/test_public_surface.py`` to check that a move of
code changes none of it.

    python tools/public_surface.py          # rewrite the snapshot (only when the surface is meant to change)
"""

from __future__ import annotations

import importlib
import inspect
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
SNAPSHOT = REPO / "tests" / "public_surface.json"


def public_names(module_name: str) -> list[str]:
    """``__all__``, else every name the module itself defines (its classes, functions and constants)."""
    module = importlib.import_module(module_name)
    names = getattr(module, "__all__", None)
    if names is not None:
        return sorted(names)
    return sorted(
        name for name, value in vars(module).items()
        if not name.startswith("_") and not inspect.ismodule(value)
        and (getattr(value, "__module__", module.__name__) == module.__name__ or not callable(value) and not inspect.isclass(value))
        and name not in ("annotations", "TYPE_CHECKING")
    )


PUBLIC_PATHS = (
    "jitflops",
    # fvcore's module paths (fvcore.nn.jit_handles, ... under jitflops.)
    "jitflops.jit_handles", "jitflops.jit_analysis", "jitflops.flop_count", "jitflops.activation_count",
    "jitflops.print_model_statistics", "jitflops.parameter_count",
    # DeepSpeed's profiler module, and the paths the README and docs import from
    "jitflops.flops_profiler", "jitflops.examples", "jitflops.roofline", "jitflops.handles",
    "jitflops.integrations.transformers", "jitflops.integrations.lightning", "jitflops.planning",
)


def surface() -> dict[str, list[str]]:
    return {path: public_names(path) for path in PUBLIC_PATHS}


if __name__ == "__main__":
    SNAPSHOT.write_text(json.dumps(surface(), indent=1) + "\n")
    print(f"written: {SNAPSHOT}")
