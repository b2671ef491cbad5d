"""The public surface: the module paths users import and the names each gives
(``tests/public_surface.json``, written by ``tools/public_surface.py``) stay importable as they
are, whatever moves inside the package."""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
import public_surface  # noqa: E402

PINNED: dict[str, list[str]] = json.loads(public_surface.SNAPSHOT.read_text())


def test_the_pinned_paths_are_the_public_ones():
    assert tuple(PINNED) == public_surface.PUBLIC_PATHS


@pytest.mark.parametrize("path", list(PINNED))
def test_every_public_name_is_importable_where_it_was(path):
    module = importlib.import_module(path)
    missing = [name for name in PINNED[path] if not hasattr(module, name)]
    assert not missing, f"{path} no longer gives {missing}"
    if hasattr(module, "__all__"):
        assert sorted(module.__all__) == PINNED[path]  # nothing added to or dropped from __all__ unnoticed


def test_loading_the_old_module_paths_leaves_the_packages_functions_of_the_same_name():
    """``jitflops.flop_count`` is fvcore's function and also a module path: loading the path (the
    package loads each one first) must not replace the function on the package."""
    for path in PINNED:
        importlib.import_module(path)
    import jitflops

    assert all(callable(getattr(jitflops, name)) and not isinstance(getattr(jitflops, name), type(jitflops))
               for name in ("flop_count", "activation_count", "parameter_count"))
    assert sys.modules["jitflops.flop_count"] is sys.modules["jitflops.engine.flop_count"]
