"""fvcore's module path ``fvcore.nn.jit_analysis``, kept where it was: it gives
:mod:`jitflops.engine.jit_analysis` itself, the same module object under both names, so that what a
user sets on the old path (fvcore's ``_IGNORED_OPS``, a table entry, a monkeypatch) is what the code
reads."""

import sys

from .engine import jit_analysis

sys.modules[__name__] = jit_analysis
