"""The one place tables are drawn."""

from __future__ import annotations

from typing import Optional, Sequence

import tabulate


def pipe_table(rows: Sequence[Sequence[str]], headers: Sequence[str], colalign: Optional[Sequence[str]] = None) -> str:
    """A Markdown pipe table that keeps each cell's leading spaces (they show the module depth) and
    reads no cell as a number (a module named ``0`` is a name); ``colalign``: each column's
    alignment (default: left).

    fvcore flips tabulate's global ``PRESERVE_WHITESPACE`` flag, which tabulate 0.10 no longer
    reads, so fvcore's tables lose their indentation; the keyword argument is the supported way.
    """
    return tabulate.tabulate(rows, headers=list(headers), tablefmt="pipe", preserve_whitespace=True, disable_numparse=True,
                             colalign=tuple(colalign) if colalign is not None else None)
