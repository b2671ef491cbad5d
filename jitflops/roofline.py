"""The path the documentation imports the roofline from, kept where it was: it gives
:mod:`jitflops.estimates.roofline` itself, the same module object under both names, so that what a
user sets on the old path (fvcore's ``_IGNORED_OPS``, a table entry, a monkeypatch) is what the code
reads."""

import sys

from .estimates import roofline

sys.modules[__name__] = roofline
