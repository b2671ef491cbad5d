"""Op records: what a front end saw of one operator call, in a form handles can read.

A record is the only thing a shape formula sees. It names the op, the module scope
that ran it, and its arguments decoded into plain Python: tensors become
:class:`TensorMeta` (shape and dtype), constants become their values, and lists stay
lists. Arguments are read by their schema names (``op.arg("weight")``), never by
position, so a formula reads like the op's documentation.

The JIT front end builds :class:`JitOpRecord` lazily from a ``torch._C.Node``: the
decoding work is only done for ops that a handle actually looks at.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any, Optional, Sequence

import torch

from .errors import OpShapeError


@dataclass(frozen=True)
class TensorMeta:
    """Shape and dtype of a tensor argument; ``shape`` is None when the tracer did not record it."""

    shape: Optional[tuple[int, ...]]
    dtype: Optional[torch.dtype] = None
    kept: Optional[int] = None
    """For an attention mask read as it ran: how many of its entries let attention through (None:
    not read; the JIT trace and fake tensors hold no values)."""
    strides: Optional[tuple[int, ...]] = None
    """Its strides as the dispatch backend's fake tensors had them (None: not recorded; a meta
    tensor, the JIT's meta copy's included, is laid out as the meta kernel lays it out, not as the
    device does: a convolution's output contiguous after a channels-last input, attention's output
    in its heads' order): whether eager code copies it to change its layout
    (:mod:`jitflops.estimates.costs.layout`)."""

    @property
    def numel(self) -> int:
        if self.shape is None:
            raise ValueError("tensor shape unknown")
        return math.prod(self.shape)


FORWARD, BACKWARD, RECOMPUTE = "forward", "backward", "recompute"
"""The phases of a training step an op can run in: the forward, the backward, and the forward that
activation checkpointing runs again during the backward (recompute)."""


class OpRecord:
    """One operator call: its kind, the module scope it ran in and its decoded arguments.

    Subclasses supply ``inputs`` and ``outputs`` (decoded values) and ``arg_names``
    (the schema's argument names, or None when the op has no schema). ``phase`` says whether the
    op ran in the forward or the backward pass (the JIT front end only sees forwards).
    """

    kind: str
    scope: str
    phase: str = FORWARD

    @property
    def inputs(self) -> Sequence[Any]:
        raise NotImplementedError

    @property
    def outputs(self) -> Sequence[Any]:
        raise NotImplementedError

    @property
    def arg_names(self) -> Optional[Sequence[str]]:
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.kind!r}, scope={self.scope!r})"

    def has_arg(self, name: str) -> bool:
        names = self.arg_names
        return names is not None and name in names

    def arg(self, name: str) -> Any:
        """The decoded argument called ``name`` in the op's schema."""
        names = self.arg_names
        if names is None or name not in names:
            raise OpShapeError(self.kind, self.scope, f"has no argument named {name!r} (schema: {names})")
        return self.input(names.index(name))

    def arg_or(self, name: str, default: Any) -> Any:
        """The argument called ``name``, or ``default`` where the op's schema has no such argument
        (an overload or a torch version without it)."""
        return self.arg(name) if self.has_arg(name) else default

    def input(self, index: int) -> Any:
        """The decoded argument at ``index``, or None if the call did not pass it."""
        inputs = self.inputs
        return inputs[index] if index < len(inputs) else None

    def shape(self, name: str) -> tuple[int, ...]:
        """The shape of tensor argument ``name``; raises a clear error if it is absent or unknown."""
        return self._require_shape(self.arg(name), f"argument {name!r}")

    def optional_shape(self, name: str) -> Optional[tuple[int, ...]]:
        """Like :meth:`shape`, but None where the optional tensor argument was not given."""
        value = self.arg(name)
        return None if value is None else self._require_shape(value, f"argument {name!r}")

    def input_shape(self, index: int) -> tuple[int, ...]:
        """The shape of the tensor argument at ``index`` (for ops whose arguments are read by place:
        their overloads name them differently)."""
        return self._require_shape(self.input(index), f"argument {index}")

    def operand_shape(self) -> tuple[int, ...]:
        """The shape of the first argument: ``self`` or ``input`` depending on the overload."""
        return self._require_shape(self.input(0), "first argument")

    def output_shape(self, index: int = 0) -> tuple[int, ...]:
        outputs = self.outputs
        return self._require_shape(outputs[index] if index < len(outputs) else None, f"output {index}")

    def output_numel(self) -> int:
        return math.prod(self.output_shape())

    def _require_shape(self, value: Any, what: str) -> tuple[int, ...]:
        if isinstance(value, TensorMeta) and value.shape is None:  # the two ways a tensor is recorded without its shape
            raise OpShapeError(self.kind, self.scope, f"{what} has no known shape: a size its values decide, in an exported program "
                               "(count the model on its inputs: backend='export' runs torch.export.draft_export on them), or a lazy "
                               "module's parameter before its first call")
        if not isinstance(value, TensorMeta):
            raise OpShapeError(self.kind, self.scope, f"{what} is not a tensor with a recorded shape (got {value!r})")
        return value.shape


@functools.lru_cache(maxsize=None)
def _schema_arg_names(schema: str) -> Optional[tuple[str, ...]]:
    if schema == "(no schema)":
        return None
    return tuple(argument.name for argument in torch._C.parse_schema(schema).arguments)


_SEVERAL: tuple[str, ...] = ("<several>",)
"""In :func:`_arg_names_by_arity`: overloads with that many arguments name them differently."""


@functools.lru_cache(maxsize=None)
def _arg_names_by_arity(kind: str) -> dict[int, tuple[str, ...]]:
    """Per argument count, the argument names every overload of ``kind`` with that many arguments
    gives them (:data:`_SEVERAL` where they differ). A traced node passes every argument, so its
    input count picks the names without printing the node's schema (a few microseconds each)."""
    names: dict[int, tuple[str, ...]] = {}
    for schema in torch._C._jit_get_schemas_for_operator(kind):
        these = tuple(argument.name for argument in schema.arguments)
        names[len(these)] = these if names.get(len(these), these) == these else _SEVERAL
    return names


def argument_names(kind: str, arity: int) -> Optional[tuple[str, ...]]:
    """The argument names every overload of ``kind`` with ``arity`` arguments gives them; None where
    those overloads name them differently, or none takes that many."""
    names = _arg_names_by_arity(kind).get(arity, _SEVERAL)
    return None if names is _SEVERAL else names


def node_inputs(node: "torch._C.Node") -> list["torch._C.Value"]:
    """A JIT node's input values. Indexed, not iterated: the exhausted ``node.inputs()`` iterator
    costs pybind11 a C++ exception, about 8 µs a node, 60 times the cost of an indexed read."""
    return [node.inputsAt(index) for index in range(node.inputsSize())]


def node_outputs(node: "torch._C.Node") -> list["torch._C.Value"]:
    """A JIT node's output values (indexed, as :func:`node_inputs`)."""
    return [node.outputsAt(index) for index in range(node.outputsSize())]


def decode_jit_value(value: "torch._C.Value") -> Any:
    """Turn a JIT graph value into a TensorMeta, a constant, a list of those, or None if unknown."""
    value_type = value.type()
    if isinstance(value_type, torch._C.TensorType):
        sizes = value_type.sizes()
        return TensorMeta(tuple(sizes) if sizes is not None else None, value_type.dtype())
    producer = value.node()
    producer_kind = producer.kind()
    if producer_kind == "prim::ListConstruct":
        return [decode_jit_value(item) for item in node_inputs(producer)]
    if producer_kind == "prim::Constant":
        return value.toIValue()
    return None


class JitOpRecord(OpRecord):
    """A record read lazily from a node of a traced JIT graph: only the arguments a handle asks
    for are decoded, each once."""

    __slots__ = ("node", "kind", "scope", "_input_count", "_decoded", "_outputs", "_arg_names")

    def __init__(self, node: "torch._C.Node", kind: str, scope: str) -> None:
        self.node = node
        self.kind = kind
        self.scope = scope
        self._input_count: Optional[int] = None
        self._decoded: dict[int, Any] = {}
        self._outputs: Optional[list[Any]] = None
        self._arg_names: Optional[tuple[str, ...]] = None

    def input(self, index: int) -> Any:
        """Read one input value of the node: a convolution has 13, its formula reads 3."""
        if index not in self._decoded:
            if self._input_count is None:
                self._input_count = self.node.inputsSize()
            self._decoded[index] = decode_jit_value(self.node.inputsAt(index)) if index < self._input_count else None
        return self._decoded[index]

    @property
    def inputs(self) -> list[Any]:
        return [self.input(index) for index in range(self.node.inputsSize())]

    def set_input(self, index: int, value: Any) -> None:
        """Replace a decoded argument: what a front end read of it as the op ran (a mask's kept entries)."""
        self._decoded[index] = value

    @property
    def outputs(self) -> list[Any]:
        if self._outputs is None:
            self._outputs = [decode_jit_value(v) for v in node_outputs(self.node)]
        return self._outputs

    @property
    def arg_names(self) -> Optional[tuple[str, ...]]:
        if self._arg_names is None:
            if self._input_count is None:
                self._input_count = self.node.inputsSize()
            names = argument_names(self.kind, self._input_count)
            self._arg_names = names if names is not None else _schema_arg_names(self.node.schema())
        return self._arg_names

    def jit_values(self) -> tuple[list["torch._C.Value"], list["torch._C.Value"]]:
        """The raw JIT inputs and outputs, as fvcore-style handles expect them."""
        return node_inputs(self.node), node_outputs(self.node)


class EagerOpRecord(OpRecord):
    """A record built from values already decoded (by the dispatch front end, or in tests)."""

    def __init__(
        self,
        kind: str,
        inputs: Sequence[Any],
        outputs: Sequence[Any],
        arg_names: Optional[Sequence[str]] = None,
        scope: str = "",
        phase: str = FORWARD,
    ) -> None:
        self.kind = kind
        self.scope = scope
        self.phase = phase
        self._inputs = list(inputs)
        self._outputs = list(outputs)
        self._arg_names = tuple(arg_names) if arg_names is not None else None
        self.nested = False
        """Made below a call that had already made an op (``F.linear``'s ``addmm`` after its ``t``):
        no call of Python's of its own (the dispatch front end tells)."""
        self.dtensor_ops = 0
        """The DTensor ops dispatched since the op recorded before this one, which this op ran for
        on this rank's shards (the dispatch front end counts them, as ``CommDebugMode`` lists them):
        each costs the host DTensor's dispatch."""
        self.bytecode = 0
        """The Python bytecode instructions the model's own code ran since the op before this one
        (:mod:`jitflops.frontends.bytecode_count`; counted where a recording is asked to)."""

    @property
    def inputs(self) -> list[Any]:
        return self._inputs

    def set_input(self, index: int, value: Any) -> None:
        """Replace a decoded argument: what a front end read of it as the op ran (a mask's kept entries)."""
        self._inputs[index] = value

    @property
    def outputs(self) -> list[Any]:
        return self._outputs

    @property
    def arg_names(self) -> Optional[tuple[str, ...]]:
        return self._arg_names
