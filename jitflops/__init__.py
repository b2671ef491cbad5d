"""jitflops: what a PyTorch model costs — parameters, FLOPs, activations and latency, per
operator and per module, in one hierarchy."""

from ._version import __version__
# The fvcore and DeepSpeed names come through their old module paths, which are loaded here: a path
# loaded later would replace the function of its name on the package (``jitflops.flop_count``).
from .activation_count import ActivationCountAnalysis, activation_count
from .core.errors import DataDependentTraceWarning, HandleError, IntegerWorkWarning, JitFallbackWarning, JitflopsError, OpShapeError, TraceError
from .deepspeed.one_call_profile import get_model_profile
from .engine.communication import CollectiveTotals, CommunicationAnalysis
from .engine.integer_count import IntegerOpCountAnalysis
from .estimates.byte_count import ByteCountAnalysis
from .estimates.generation_time import GenerationTime, predict_generation
from .estimates.memory_estimate import KVCache, MemoryEstimate, ModuleMemory
from .estimates.memory_footprint import largest_fitting, memory_footprint
from .estimates.roofline import PredictedTimeAnalysis
from .estimates.training_step_time import StepTime, predict_training_step
from .flop_count import FlopCountAnalysis, flop_count
from .flops_profiler import FlopsProfiler, FlopsProfilerConfig, get_module_duration, get_module_flops, get_module_macs
from .handles import Handle, ShapeFormula, get_shape
from .jit_analysis import JitModelAnalysis
from .named_models import model_from_name
from .parameter_count import parameter_count, parameter_count_table
from .print_model_statistics import flop_count_str, flop_count_table
from .profiling.collective_recorder import CollectiveLog, record_collectives
from .profiling.generation import GenerationCount, StepCount, count_generation
from .profiling.hierarchy import ModuleProfile, build_hierarchy
from .profiling.model_profile import ModelProfile, ProfileSummary
from .profiling.op_table import OpRow
from .profiling.per_token import LanguageModelSizes, analytic_flops_per_token, flops_per_token
from .profiling.profile import profile_model
from .reports.deepspeed_report import format_model_profile
from .reports.files import profile_to_dict, write_chrome_trace, write_json, write_ops_csv
from .reports.html_report import profile_to_html, write_html
from .reports.memory_report import memory_summary, memory_table
from .timing.timed_pass import LatencyStats, TimedPass, time_model


__all__ = [
    "ActivationCountAnalysis",
    "ByteCountAnalysis",
    "CollectiveLog",
    "CollectiveTotals",
    "CommunicationAnalysis",
    "DataDependentTraceWarning",
    "FlopCountAnalysis",
    "FlopsProfiler",
    "FlopsProfilerConfig",
    "GenerationCount",
    "GenerationTime",
    "PredictedTimeAnalysis",
    "StepTime",
    "predict_generation",
    "predict_training_step",
    "IntegerOpCountAnalysis",
    "KVCache",
    "LatencyStats",
    "MemoryEstimate",
    "ModuleMemory",
    "largest_fitting",
    "memory_footprint",
    "memory_summary",
    "memory_table",
    "ModelProfile",
    "ModuleProfile",
    "OpRow",
    "ProfileSummary",
    "StepCount",
    "TimedPass",
    "build_hierarchy",
    "count_generation",
    "format_model_profile",
    "get_model_profile",
    "get_module_duration",
    "get_module_flops",
    "get_module_macs",
    "model_from_name",
    "profile_model",
    "record_collectives",
    "profile_to_dict",
    "profile_to_html",
    "time_model",
    "write_chrome_trace",
    "write_html",
    "write_json",
    "write_ops_csv",
    "Handle",
    "HandleError",
    "IntegerWorkWarning",
    "JitFallbackWarning",
    "JitModelAnalysis",
    "LanguageModelSizes",
    "analytic_flops_per_token",
    "flops_per_token",
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
