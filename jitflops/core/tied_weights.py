"""Which of a model's parameters hold the same values, so that each is counted once.

``named_parameters`` drops a Parameter met under a second name, which is how a tie made in torch
looks (``lm_head.weight = embed_tokens.weight``). accelerate's ``init_empty_weights`` breaks that:
it wraps every parameter it registers in a new Parameter, so the tie leaves two Parameters viewing
one meta storage (transformers' tied heads and embeddings: a tied Llama-3.2-1B would count 1.50 G
parameters for its 1.24 G). The model loaded into it ties them again (``tie_weights``), so that is
the model counted. Apart from meta, two Parameters are two sets of values, as torch's optimizers
keep them.
"""

from __future__ import annotations

from typing import Hashable, Iterator

import torch
from torch import nn
from torch.multiprocessing.reductions import StorageWeakRef


def values_key(tensor: torch.Tensor) -> Hashable:
    """What tells ``tensor``'s values apart: on the meta device, the storage it views and where (a
    plain tensor or Parameter); elsewhere the tensor object itself."""
    if tensor.is_meta and type(tensor) in (torch.Tensor, nn.Parameter):
        return StorageWeakRef(tensor.untyped_storage()), tensor.storage_offset(), tuple(tensor.shape), tensor.stride(), tensor.dtype
    return id(tensor)


def distinct_named_parameters(module: nn.Module) -> Iterator[tuple[str, nn.Parameter]]:
    """``module.named_parameters()`` without the Parameters that repeat an earlier one's values
    (:func:`values_key`): each tie once, under its first name."""
    seen: set[Hashable] = set()
    for name, parameter in module.named_parameters():
        key = values_key(parameter)
        if key not in seen:
            seen.add(key)
            yield name, parameter


def distinct_parameters(module: nn.Module) -> list[nn.Parameter]:
    """The Parameters of :func:`distinct_named_parameters`."""
    return [parameter for _, parameter in distinct_named_parameters(module)]


def has_broken_ties(module: nn.Module) -> bool:
    """Whether some Parameters of ``module`` are not the same object but hold the same values
    (:func:`values_key`): ties that ``init_empty_weights`` left as two Parameters."""
    return len(distinct_parameters(module)) < len(list(module.parameters()))
