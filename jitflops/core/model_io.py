"""How a model's inputs and outputs cross the JIT tracer.

The tracer only accepts tensors, and tuples of tensors, in and out. Users have positional and
keyword arguments, nested dicts and lists, ``None`` and flags, and models that return
``ModelOutput`` objects, dataclasses, caches and strings. :class:`ModelCall` keeps the user's call
as a pytree; :class:`FlatCall` is the small module actually traced: it takes the tensor leaves,
rebuilds the call around the non-tensor leaves, and returns the tensor leaves of the output.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
from collections.abc import Mapping
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any, Callable, ContextManager, Hashable

import torch
from torch import nn
from torch.utils import _pytree as pytree

from .imported_classes import is_compiled


@dataclass(frozen=True, eq=False)
class ModelCall:
    """The positional and keyword arguments of one forward call."""

    args: tuple[Any, ...]
    kwargs: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_user(cls, inputs: Any, kwargs: Mapping[str, Any] | None = None) -> "ModelCall":
        """Interpret ``inputs`` as fvcore does, plus keyword arguments.

        A tuple holds the positional arguments; a mapping (a dict, a Hugging Face
        ``BatchEncoding``) given without ``kwargs`` is passed as keyword arguments, like
        ``model(**batch)``; anything else (a tensor, a list) is the single positional argument.
        To pass a dict positionally, wrap it in a tuple: ``inputs=(batch,)``.
        """
        if kwargs is not None and not isinstance(kwargs, Mapping):
            raise TypeError(f"kwargs must be a mapping of argument names to values, got {type(kwargs).__name__}")
        if isinstance(inputs, Mapping) and kwargs is None:
            return cls((), dict(inputs))
        args = inputs if isinstance(inputs, tuple) else (inputs,)
        return cls(tuple(args), dict(kwargs or {}))

    def is_same_call(self, other: "ModelCall") -> bool:
        """Same structure and the very same tensors (identity, not values)."""
        mine, my_spec = pytree.tree_flatten((self.args, self.kwargs))
        theirs, their_spec = pytree.tree_flatten((other.args, other.kwargs))
        if my_spec != their_spec:
            return False
        return all(a is b if isinstance(a, torch.Tensor) else type(a) is type(b) and a == b for a, b in zip(mine, theirs))

    def tensors(self) -> list[torch.Tensor]:
        return [leaf for leaf in pytree.tree_leaves((self.args, self.kwargs)) if isinstance(leaf, torch.Tensor)]

    @functools.cached_property
    def _stateful_leaves(self) -> frozenset[int]:
        leaves = pytree.tree_leaves((self.args, self.kwargs))
        return frozenset(i for i, leaf in enumerate(leaves) if is_stateful(leaf))

    def fresh(self) -> "ModelCall":
        """This call with copies of the objects that hold tensors: a generation cache grows in
        place as the forward runs, and every run of ours must see it as the user gave it."""
        if not self._stateful_leaves:
            return self
        leaves, spec = pytree.tree_flatten((self.args, self.kwargs))
        args, kwargs = pytree.tree_unflatten([copy.deepcopy(leaf) if i in self._stateful_leaves else leaf for i, leaf in enumerate(leaves)], spec)
        return ModelCall(args, kwargs)

    def run(self, model: nn.Module) -> Any:
        """``model`` called on a fresh copy of the call; collectives its output still waits for are
        completed (:func:`collectives_waited`)."""
        call = self.fresh()
        return collectives_waited(model(*call.args, **call.kwargs))

    def signature(self) -> Hashable:
        """What a count of this call depends on: its structure, tensor shapes and dtypes, other
        values, and the shapes of tensors inside objects such as a generation cache."""
        leaves, spec = pytree.tree_flatten((self.args, self.kwargs))
        return (str(spec), tuple(_leaf_signature(leaf) for leaf in leaves))


def _leaf_signature(leaf: Any) -> Hashable:
    if isinstance(leaf, torch.Tensor):
        return ("tensor", tuple(leaf.shape), leaf.dtype, leaf.device.type, leaf.requires_grad)
    if is_stateful(leaf):  # a generation cache: the same object at every step, holding more each time
        return (type(leaf), tuple(tuple(t.shape) for t in tensors_inside(leaf)))
    try:
        return (type(leaf), hash(leaf), leaf)
    except TypeError:
        return (type(leaf), id(leaf))


def is_stateful(leaf: Any) -> bool:
    """An object that a forward may change in place, such as a generation cache (empty at first):
    an instance with attributes, other than a tensor, a module or a function."""
    return hasattr(leaf, "__dict__") and not isinstance(leaf, (torch.Tensor, nn.Module, type)) and not callable(leaf)


def tensors_inside(value: Any, depth: int = 3) -> list[torch.Tensor]:
    """Tensors held by an object the pytree does not open (a generation cache), a few levels deep."""
    if isinstance(value, torch.Tensor):
        return [value]
    if depth == 0:
        return []
    if isinstance(value, Mapping):
        children: Any = list(value.values())
    elif isinstance(value, (list, tuple)):
        children = value
    elif hasattr(value, "__dict__") and not isinstance(value, (type, nn.Module)):
        children = list(vars(value).values())
    else:
        return []
    return [tensor for child in children for tensor in tensors_inside(child, depth - 1)]


def generating_module(model: nn.Module) -> nn.Module:
    """The module whose forward ``model.generate`` calls: ``model``, or the module a ``torch.compile``
    wrapper wraps, to which the wrapper hands ``generate`` (its ``__getattr__``), and which calls
    itself, uncompiled."""
    return model._modules["_orig_mod"] if is_compiled(model) else model


def generation_cache(output: Any) -> Any:
    """The generation cache of a model output (``cache`` in newer transformers, ``past_key_values``
    before), or None. Only the keys the output holds are read, from its ``keys()``: a transformers
    5.25 output's ``get`` and ``in`` take ``past_key_values`` for ``cache`` and log a deprecation
    that its user, who never named either, would see."""
    if not isinstance(output, Mapping):
        return None
    return next((output[key] for key in ("cache", "past_key_values") if key in output.keys() and output[key] is not None), None)


def tensor_leaves(value: Any) -> tuple[torch.Tensor, ...]:
    """Every tensor inside a model output, in order; other leaves (None, strings, caches) are dropped.

    Containers torch's pytree does not know (``ModelOutput`` and other mapping subclasses,
    dataclasses) are opened too.
    """
    found: list[torch.Tensor] = []
    for leaf in pytree.tree_leaves(value):
        if isinstance(leaf, torch.Tensor):
            found.append(leaf)
        elif isinstance(leaf, Mapping):
            found.extend(tensor_leaves(list(leaf.values())))
        elif dataclasses.is_dataclass(leaf) and not isinstance(leaf, type):
            found.extend(tensor_leaves([getattr(leaf, f.name) for f in dataclasses.fields(leaf)]))
    return tuple(found)


class FlatCall(nn.Module):
    """Calls ``model`` with a :class:`ModelCall` whose tensors are given as flat positional arguments."""

    def __init__(self, model: nn.Module, call: ModelCall, around_model: Callable[[], ContextManager[Any]] = nullcontext) -> None:
        """``around_model`` gives a context entered around the model's call, when the call runs (inside a trace)."""
        super().__init__()
        self.model = model
        self._around_model = around_model
        self._call = call
        self._leaves, self._spec = pytree.tree_flatten((call.args, call.kwargs))
        self._tensor_positions = [i for i, leaf in enumerate(self._leaves) if isinstance(leaf, torch.Tensor)]

    def flat_inputs(self) -> tuple[torch.Tensor, ...]:
        return tuple(self._leaves[i] for i in self._tensor_positions)

    def forward(self, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Arguments after the call's own tensors are ignored: a tracer may pass the module's state there."""
        call = self._call.fresh()
        leaves = pytree.tree_leaves((call.args, call.kwargs))
        for position, tensor in zip(self._tensor_positions, tensors):
            leaves[position] = tensor
        args, kwargs = pytree.tree_unflatten(leaves, self._spec)
        with self._around_model():
            return tensor_leaves(self.model(*args, **kwargs))


def collectives_waited(output: Any) -> Any:
    """``output``, its pending collectives completed: a tensor-parallel layer returns an
    ``AsyncCollectiveTensor`` whose all-reduce is still in flight until the tensor is used. The
    runs jitflops makes drop their outputs, and a process group destroyed with collectives in
    flight aborts the process; a timed run also includes the communication it started. Without a
    process group there is none, and the output is not walked (timed runs call this)."""
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return output
    from torch.distributed._functional_collectives import AsyncCollectiveTensor
    for tensor in tensor_leaves(output):
        if isinstance(tensor, AsyncCollectiveTensor):
            tensor.trigger_wait()
    return output
