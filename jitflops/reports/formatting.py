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


def deepspeed_number(num: float, precision: int = 2) -> str:
    """DeepSpeed's ``number_to_string``: ``3.7312e9 -> '3.73 G'``, ``38.6e6 -> '38.6 M'``, ``16 -> '16 '``.

    The ``deepspeed_*`` formats reproduce DeepSpeed's strings exactly, so that scripts which parse
    DeepSpeed's printout and ``as_string=True`` results keep working.
    """
    steps = ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "K"), (1.0, ""), (1e-3, "m"))
    magnitude, units = next(((m, u) for m, u in steps if num >= m or (m == 1.0 and num == 0)), (1e-6, "u"))
    return f"{round(num / magnitude, precision):g} {units}"


def deepspeed_params(num: float) -> str:
    """``38_600_000 -> '38.6 M'``; billions are ``B``."""
    return deepspeed_number(num).replace("G", "B").strip()


def deepspeed_macs(num: float) -> str:
    return deepspeed_number(num) + "MACs"


def deepspeed_flops(num: float) -> str:
    """FLOPs or FLOP/s with DeepSpeed's unit: ``'1.23 GFLOPS'``."""
    return deepspeed_number(num) + "FLOPS"


def deepspeed_bytes(num: float) -> str:
    """Bytes in decimal units, as nccl-tests gives sizes: ``2048 -> '2.05 KB'``."""
    return deepspeed_number(num) + "B"


def deepspeed_seconds(seconds: float) -> str:
    return deepspeed_number(seconds) + "s"
