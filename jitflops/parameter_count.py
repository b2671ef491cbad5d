"""fvcore's module path ``fvcore.nn.parameter_count``, kept where it was: it gives
:mod:`jitflops.engine.parameter_count` itself, the same module object under both names, so that what
a user sets on the old path (fvcore's ``_IGNORED_OPS``, a table entry, a monkeypatch) is what the
code reads."""

import sys

from .engine import parameter_count

sys.modules[__name__] = parameter_count
