"""fvcore's module path ``fvcore.nn.print_model_statistics``, kept where it was: it gives
:mod:`jitflops.reports.print_model_statistics` itself, the same module object under both names, so
that what a user sets on the old path (fvcore's ``_IGNORED_OPS``, a table entry, a monkeypatch) is
what the code reads."""

import sys

from .reports import print_model_statistics

sys.modules[__name__] = print_model_statistics
