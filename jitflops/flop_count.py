"""fvcore's module path ``fvcore.nn.flop_count``, kept where it was: it gives
:mod:`jitflops.engine.flop_count` itself, the same module object under both names, so that what a
user sets on the old path (fvcore's ``_IGNORED_OPS``, a table entry, a monkeypatch) is what the code
reads."""

import sys

from .engine import flop_count

sys.modules[__name__] = flop_count
