"""Number formatting shared by every printout."""

from __future__ import annotations

_SI_STEPS = ((1e14, 1e15, "P"), (1e11, 1e12, "T"), (1e8, 1e9, "G"), (1e5, 1e6, "M"), (1e2, 1e3, "K"))


def format_size(value: float, sig_figs: int = 3, hide_zero: bool = False) -> str:
    """``123456789 -> '0.123G'``: fvcore's compact format (a suffix once the value passes 1e2, 1e5, ...)."""
    if hide_zero and value == 0:
        return ""
    for threshold, unit, suffix in _SI_STEPS:
        if abs(value) > threshold:
            return f"{value / unit:.{sig_figs}f}".rstrip("0").rstrip(".") + suffix
    return str(value)


def format_quantity(value: float, unit: str = "", precision: int = 2) -> str:
    """``1.23e9, 'FLOPS' -> '1.23 GFLOPS'``: DeepSpeed's style, with a space and a unit."""
    for threshold, suffix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "K")):
        if abs(value) >= threshold:
            return f"{value / threshold:.{precision}f} {suffix}{unit}"
    return f"{value:.{precision}f} {unit}".rstrip() if isinstance(value, float) and not float(value).is_integer() else f"{int(value)} {unit}".rstrip()


def format_seconds(seconds: float, precision: int = 2) -> str:
    """``0.00123 -> '1.23 ms'``."""
    for scale, suffix in ((1.0, "s"), (1e-3, "ms"), (1e-6, "us")):
        if abs(seconds) >= scale:
            return f"{seconds / scale:.{precision}f} {suffix}"
    return f"{seconds / 1e-6:.{precision}f} us"
