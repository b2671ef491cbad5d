"""Models the JIT tracer cannot count, and the dispatch backend counts instead.

The default front end is the JIT trace: fvcore's numbers, wherever it can trace. Some models it
cannot trace at all, and the default call counts those with the dispatch backend (which records
the aten ops as they run), says so once with a :class:`~jitflops.core.errors.JitFallbackWarning` naming
the reason, and records which front end counted (``analysis.counted_by``, profiles' summaries, the
JSON and the printouts). ``strict=True`` raises instead, and so does ``compute=False`` (the dispatch
backend runs the model).

Some reasons are known before tracing (:func:`untraceable_reason`), and no trace is tried: a
failed trace part-way through an FSDP2 forward would leave its parameters gathered. The others
show up as the trace fails (:func:`fallback_reason`): an error inside torch's own tracer, or any
other trace failure where the model's eager forward runs. Where the forward itself fails, the
trace's error is raised, naming the module at fault. Where torch has no JIT tracer at all
(:func:`jit_tracer_available`), the default call reads the graph ``torch.export`` makes instead,
and where export fails, the dispatch backend counts.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from ..core.imported_classes import is_compiled
from ..core.model_io import ModelCall
from ..core.process_groups import dtensor_class, fsdp_module_class

USE_DISPATCH = "use FlopCountAnalysis(..., backend='dispatch'), which records the ops as they run"


def jit_tracer_available() -> bool:
    """Whether this torch still has the JIT tracer (TorchScript is deprecated for ``torch.export``):
    without it, the default call exports the model, and counts it by dispatch where export fails."""
    return hasattr(torch._C, "_create_graph_by_tracing")


def _is_quantized(module: nn.Module) -> bool:
    """A module of torch's quantized families (``torch.ao.nn.quantized``, dynamic and static): its
    weights are packed objects, not tensors, which the tracer cannot take as inputs."""
    return type(module).__module__.startswith(("torch.ao.nn.quantized", "torch.nn.quantized"))


def _where(name: str) -> str:
    return f"module {name!r}" if name else "the root module"


def untraceable_reason(model: nn.Module, call: ModelCall) -> Optional[str]:
    """Why the JIT tracer cannot trace ``model`` on ``call``, where that is known before tracing; None
    otherwise. One pass over the modules (about 0.1 ms on MobileNetV2's 211)."""
    if is_compiled(model):
        return "the model is compiled with torch.compile, which the JIT tracer cannot follow"
    fsdp, dtensor = fsdp_module_class(), dtensor_class()
    for name, module in model.named_modules():
        if fsdp is not None and isinstance(module, fsdp):
            return f"the model is sharded by FSDP2 (fully_shard on {_where(name)}), whose hooks the JIT tracer cannot follow"
        if _is_quantized(module):
            module_type = type(module)
            return f"the model is quantized ({module_type.__module__}.{module_type.__name__} at {_where(name)}), whose packed weights the JIT tracer cannot take"
        for key, tensor in module._parameters.items():  # the module's own: named_parameters per module costs more than the rest
            if dtensor is not None and isinstance(tensor, dtensor):
                parameter = f"{name}.{key}" if name else key
                return f"the model holds DTensor parameters ({parameter!r}: tensor or sequence parallelism), which the JIT tracer cannot take"
    if dtensor is not None and any(isinstance(tensor, dtensor) for tensor in call.tensors()):
        return "the model's inputs are DTensors, which the JIT tracer cannot take"
    return None


def fallback_reason(error: Exception) -> str:
    """What a failed trace says, in one line, for the fallback's warning."""
    first_line = (str(error).strip().splitlines() or [""])[0].replace(f"; {USE_DISPATCH}", "")
    return f"the JIT trace failed: {first_line}"
