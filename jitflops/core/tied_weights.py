"""Which of a model's parameters hold the same values, so that each is counted once.

``named_parameters`` drops a Parameter met under a second name, which is how a tie made in torch
looks (``lm_head.weight = embed_tokens.weight``). accelerate's ``init_empty_weights`` breaks that:
it wraps every parameter it registers in a new Parameter, so the tie leaves two Parameters viewing
one meta storage (transformers' tied heads and embeddings: a tied Llama-3.2-1B would count 1.50 G
parameters for its 1.24 G), and a cast (``model.to(torch.bfloat16)``) then gives each a storage of
its own. The model loaded into it ties them again (``tie_weights``), so that is the model counted:
on the meta device, Parameters over one storage view are one, and so are those a transformers model
declares tied (``get_expanded_tied_weights_keys``, which reads its config). Apart from meta, two
Parameters are two sets of values, as torch's optimizers keep them.
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


def declared_ties(model: nn.Module) -> dict[str, str]:
    """Each parameter's name that a transformers model (``model`` or a module of it) declares tied
    to another's, mapped to that other's: ``{"lm_head.weight": "model.embed_tokens.weight"}``; none
    where the config unties them, or in transformers before 5."""
    ties = {}
    for prefix, module in model.named_modules():
        expanded = getattr(module, "get_expanded_tied_weights_keys", None)
        if callable(expanded):
            ties.update({f"{prefix}.{target}".lstrip("."): f"{prefix}.{source}".lstrip(".") for target, source in expanded().items()})
    return ties


def value_keys(model: nn.Module) -> dict[int, Hashable]:
    """Each parameter of ``model`` (by ``id``) and the key of its values (:func:`values_key`); a meta
    parameter that the model declares tied to another of the same size (:func:`declared_ties`) takes
    that one's."""
    named = dict(model.named_parameters(remove_duplicate=False))
    keys = {id(parameter): values_key(parameter) for parameter in named.values()}
    if not any(parameter.is_meta for parameter in named.values()):
        return keys
    for target, source in declared_ties(model).items():
        tied, held = named.get(target), named.get(source)
        if tied is not None and held is not None and tied.is_meta and held.is_meta and tied.shape == held.shape and tied.dtype == held.dtype:
            keys[id(tied)] = keys[id(held)]
    return keys


def distinct_named_parameters(module: nn.Module) -> Iterator[tuple[str, nn.Parameter]]:
    """``module.named_parameters()`` without the Parameters that repeat an earlier one's values
    (:func:`value_keys`): each tie once, under its first name."""
    keys = value_keys(module)
    seen: set[Hashable] = set()
    for name, parameter in module.named_parameters():
        if keys[id(parameter)] not in seen:
            seen.add(keys[id(parameter)])
            yield name, parameter


def distinct_parameters(module: nn.Module) -> list[nn.Parameter]:
    """The Parameters of :func:`distinct_named_parameters`."""
    return [parameter for _, parameter in distinct_named_parameters(module)]


def has_broken_ties(module: nn.Module) -> bool:
    """Whether some Parameters of ``module`` are not the same object but hold the same values
    (:func:`value_keys`): ties that ``init_empty_weights`` broke."""
    return len(distinct_parameters(module)) < len(list(module.parameters()))
