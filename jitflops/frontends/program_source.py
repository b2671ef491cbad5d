"""What the export front end takes: an ``ExportedProgram``, or the path of a ``.pt2`` file.

Apart from :mod:`jitflops.frontends.export_trace` because the analyses, the profile and the CLI
ask every input whether it is one, and the export front end imports sympy (a quarter of a second,
a third of ``import jitflops``), which only a program's count or a formula needs: they import it
when asked for one.
"""

from __future__ import annotations

import os
from typing import Any, Union

import torch

from ..core.imported_classes import imported_class

ProgramSource = Union["torch.export.ExportedProgram", str, "os.PathLike[str]"]
"""An exported program, or the path of a ``.pt2`` file holding one."""


def is_program_source(value: Any) -> bool:
    """A path, or an ``ExportedProgram`` (asked without importing ``torch.export``)."""
    program = imported_class("torch.export", "ExportedProgram")
    return isinstance(value, (str, os.PathLike)) or (program is not None and isinstance(value, program))
