"""What the export front end takes: an ``ExportedProgram``, or the path of a ``.pt2`` file.

Apart from :mod:`jitflops.frontends.export_trace` because the analyses, the profile and the CLI
ask every input whether it is one, and the export front end imports sympy (a quarter of a second,
a third of ``import jitflops``), which only a program's count or a formula needs: they import it
when asked for one.
"""

from __future__ import annotations

import os
import sys
from typing import Any, Union

import torch

ProgramSource = Union["torch.export.ExportedProgram", str, "os.PathLike[str]"]
"""An exported program, or the path of a ``.pt2`` file holding one."""


def is_program_source(value: Any) -> bool:
    """A path, or an ``ExportedProgram``: asked of ``torch.export`` only where it is imported, since
    no program exists before (torch 2.11 and 2.13 import it themselves)."""
    export = sys.modules.get("torch.export")
    return isinstance(value, (str, os.PathLike)) or (export is not None and isinstance(value, export.ExportedProgram))
