"""jitflops: what a PyTorch model costs — parameters, FLOPs, activations and latency, per
operator and per module, in one hierarchy."""

from .activation_count import ActivationCountAnalysis, activation_count
from .analysis import JitModelAnalysis
from .errors import HandleError, JitflopsError, OpShapeError, TraceError
from .flop_count import FlopCountAnalysis, flop_count
from .handles import Handle, ShapeFormula, get_shape
from .parameter_count import parameter_count, parameter_count_table
from .printing import flop_count_str, flop_count_table

__version__ = "0.1.0"

__all__ = [
    "ActivationCountAnalysis",
    "FlopCountAnalysis",
    "Handle",
    "HandleError",
    "JitModelAnalysis",
    "JitflopsError",
    "OpShapeError",
    "ShapeFormula",
    "TraceError",
    "activation_count",
    "flop_count",
    "flop_count_str",
    "flop_count_table",
    "get_shape",
    "parameter_count",
    "parameter_count_table",
]
