"""DeepSpeed's module path (``deepspeed.profiling.flops_profiler``), kept where it was: it gives
:mod:`jitflops.deepspeed.flops_profiler` itself, the same module object under both names, so that
what a user sets on the old path (fvcore's ``_IGNORED_OPS``, a table entry, a monkeypatch) is what
the code reads."""

import sys

from .deepspeed import flops_profiler

sys.modules[__name__] = flops_profiler
