"""Counts as exact formulas of the input sizes: the model run once on fake tensors whose sizes are
symbols, or an exported program's graph read with its own size symbols (:func:`program_formula`).

A count depends on the batch size, the sequence length or the image size through the shapes of
every op. Torch's symbolic shapes follow those sizes as expressions (a ``ShapeEnv`` behind a
``FakeTensorMode``): the model runs once on fake inputs whose chosen dimensions are symbols, the
dispatch backend records its ops with symbolic shapes, and the same shape formulas, applied to them,
give sympy expressions (``24*b*s*h**2 + 4*b*s**2*h + ...``), per module. Nothing is fitted: an
expression is what the formulas compute for every size. Where the model's Python code branches on
a size (``if seq_len > 512``), torch records a guard, and the expression holds where the guards do
(:attr:`SymbolicCount.valid_when`); where it fixes a size to the example's value, the expression
no longer has that symbol, and :attr:`SymbolicCount.fixed_sizes` names it.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, Mapping, Optional, Union

import sympy
import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode

from .counting import statistics_of
from ..frontends.dispatch_trace import DispatchTrace, record_with_dispatch
from ..frontends.export_trace import dims_of_program, input_dims, program_records, program_sizes
from ..handles import Handle
from ..core.model_io import ModelCall

DimSpec = Union[int, tuple[int, ...], Mapping[Union[str, int], Union[int, tuple[int, ...]]]]
"""Which dimensions a size symbol stands for: a dimension of every input tensor (``1``), several
(``(2, 3)``: a square image's height and width), or per input, by keyword or position
(``{"decoder_input_ids": 1}``)."""


@dataclasses.dataclass(frozen=True)
class SymbolicCount:
    """A statistic as expressions of the named sizes, for the whole model and per module."""

    by_module: dict[str, sympy.Expr]
    symbols: dict[str, sympy.Symbol]
    example: dict[str, int]
    """The sizes of the inputs the model ran on (where each expression was checked to hold)."""
    valid_when: tuple[sympy.Basic, ...]
    """The guards the model's code put on the sizes: the expressions hold where these do."""
    fixed_sizes: tuple[str, ...] = ()
    """Sizes the model's code fixed to the example's value: the expressions are exact in the others only."""

    @property
    def total(self) -> sympy.Expr:
        return self.by_module[""]

    def evaluate(self, module_name: str = "", **sizes: int) -> int:
        """The count at the given sizes (every symbol's value by its name)."""
        return int(self.by_module[module_name].subs({self.symbols[name]: value for name, value in sizes.items()}))

    def formula(self, module_name: str = "") -> str:
        return str(sympy.expand(self.by_module[module_name]))


@functools.lru_cache(maxsize=None)
def _resample_op() -> Any:
    """``jitflops::resample``: ``F.interpolate`` as one op whose output size may be symbolic. Torch's
    bilinear and bicubic kernels need concrete sizes even on fake tensors; this op's fake kernel
    only shapes its output, and its count is the interpolation's (``handles/resampling.py``)."""

    @torch.library.custom_op("jitflops::resample", mutates_args=())
    def resample(input: torch.Tensor, size: list[int], mode: str, align_corners: Optional[bool]) -> torch.Tensor:
        return F.interpolate(input, size=size, mode=mode, align_corners=align_corners)

    @resample.register_fake
    def _(input: torch.Tensor, size: list[int], mode: str, align_corners: Optional[bool]) -> torch.Tensor:
        return input.new_empty([*input.shape[:2], *size])

    return torch.ops.jitflops.resample.default


class _SymbolicInterpolation(TorchFunctionMode):
    """``F.interpolate`` to a size in symbols runs as :func:`_resample_op`."""

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: Optional[dict] = None) -> Any:
        kwargs = kwargs or {}
        if func is F.interpolate:
            size = kwargs.get("size", args[1] if len(args) > 1 else None)
            sizes = size if isinstance(size, (list, tuple)) else (size,)
            if any(isinstance(value, torch.SymInt) for value in sizes):
                input = args[0] if args else kwargs["input"]
                mode = kwargs.get("mode", args[3] if len(args) > 3 else "nearest")
                align_corners = kwargs.get("align_corners", args[4] if len(args) > 4 else None)
                spatial = input.dim() - 2
                return _resample_op()(input, list(sizes) * (spatial if len(sizes) == 1 else 1), mode, align_corners)
        return func(*args, **kwargs)


def _size_bindings(call: ModelCall, dims: Mapping[str, DimSpec]) -> dict[tuple[Union[str, int], int], str]:
    """(input, dimension) -> symbol name, for every tensor input of the call."""
    inputs: list[tuple[Union[str, int], torch.Tensor]] = [(index, value) for index, value in enumerate(call.args) if isinstance(value, torch.Tensor)]
    inputs += [(name, value) for name, value in call.kwargs.items() if isinstance(value, torch.Tensor)]
    bindings: dict[tuple[Union[str, int], int], str] = {}
    for symbol, spec in dims.items():
        per_input = spec if isinstance(spec, Mapping) else {key: spec for key, _ in inputs}
        for key, chosen in per_input.items():
            tensor = dict(inputs).get(key)
            if tensor is None:
                raise ValueError(f"size {symbol!r}: the call has no tensor input {key!r}")
            for dim in (chosen,) if isinstance(chosen, int) else chosen:
                if dim < tensor.dim():
                    bindings[(key, dim)] = symbol
    return bindings


def symbolic_count(
    model: nn.Module,
    call: ModelCall,
    aliases: Mapping[Any, str],
    handles: Mapping[str, Handle],
    ignored: Any,
    ancestor_mode: str,
    dims: Mapping[str, DimSpec],
) -> SymbolicCount:
    """The statistic ``handles`` count, per module, as expressions of the sizes ``dims`` names."""
    from torch._dynamo.source import ConstantSource
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    if not dims:
        raise ValueError("name at least one size: formula(batch=0, seq=1) makes dimension 0 of every input 'batch' and dimension 1 'seq'")
    bindings = _size_bindings(call, dims)
    shape_env = ShapeEnv()
    example: dict[str, int] = {}
    symbols: dict[str, torch.SymInt] = {}
    raw: dict[str, sympy.Symbol] = {}  # each size's symbol in the ShapeEnv, before any replacement
    for (key, dim), name in bindings.items():
        value = int((call.args[key] if isinstance(key, int) else call.kwargs[key]).shape[dim])
        if example.setdefault(name, value) != value:
            raise ValueError(f"size {name!r} is {example[name]} in one input and {value} in another")
    for name, value in example.items():
        symbol = shape_env.create_symbol(value, source=ConstantSource(name))
        raw[name] = symbol
        symbols[name] = shape_env.create_symintnode(symbol, hint=value)
    mode = FakeTensorMode(shape_env=shape_env, allow_non_fake_inputs=True)

    def fake(key: Union[str, int], value: Any) -> Any:
        if not isinstance(value, torch.Tensor):
            return value
        shape = [symbols[bindings[(key, dim)]] if (key, dim) in bindings else size for dim, size in enumerate(value.shape)]
        with mode:
            if value.is_floating_point():
                return torch.randn(shape, dtype=value.dtype, device=value.device)
            return torch.zeros(shape, dtype=value.dtype, device=value.device)

    fake_call = ModelCall(tuple(fake(i, v) for i, v in enumerate(call.args)), {k: fake(k, v) for k, v in call.kwargs.items()})
    with mode, torch.no_grad(), _SymbolicInterpolation():
        trace = record_with_dispatch(model, fake_call, aliases, fake_inputs=True)
    statistics = statistics_of(trace, handles, ignored, aliases, ancestor_mode)
    named = {name: sympy.Symbol(name, integer=True, positive=True) for name in raw}
    names = {raw[name]: symbol for name, symbol in named.items()}

    def expression(value: Any) -> sympy.Expr:
        expr = value.node.expr if isinstance(value, torch.SymInt) else sympy.Integer(value)
        return sympy.expand(expr.xreplace(names))

    by_module = {module: expression(sum(counts.values(), 0)) for module, counts in statistics.counts.items()}
    guards = tuple(guard.expr.xreplace(names) for guard in shape_env.guards)
    fixed = tuple(name for name, symbol in raw.items() if symbol in shape_env.replacements)
    return SymbolicCount(by_module, named, example, guards, fixed)


def dynamic_dims(call: ModelCall, dims: Mapping[str, DimSpec]) -> Callable[[nn.Module], Any]:
    """For the module exported, ``torch.export``'s ``dynamic_shapes`` making every dimension ``dims``
    names dynamic (``Dim.AUTO``: a dimension the model's code fixes stays a number, and is
    reported fixed)."""
    from torch.export import Dim, ShapesCollection

    chosen: dict[Union[str, int], dict[int, Any]] = {}
    for key, dim in _size_bindings(call, dims):
        chosen.setdefault(key, {})[dim] = Dim.AUTO

    def shapes_for(module: nn.Module) -> Any:
        shapes = ShapesCollection()
        for key, spec in chosen.items():
            shapes[call.args[key] if isinstance(key, int) else call.kwargs[key]] = spec
        return shapes.dynamic_shapes(module, call.args, call.kwargs)
    return shapes_for


def _named_dims(dims: Mapping[str, DimSpec], labels: set[tuple[Union[str, int], int]]) -> dict[tuple[Union[str, int], int], str]:
    """(input, dimension) -> name, for the inputs' dimensions ``dims`` names (``labels``: every input dimension)."""
    inputs = {key for key, _ in labels}
    named: dict[tuple[Union[str, int], int], str] = {}
    for name, spec in dims.items():
        per_input = spec if isinstance(spec, Mapping) else {key: spec for key in inputs}
        for key, chosen in per_input.items():
            if key not in inputs:
                raise ValueError(f"size {name!r}: the program has no tensor input {key!r} (it has {sorted(map(str, inputs))})")
            for dim in (chosen,) if isinstance(chosen, int) else chosen:
                if (key, dim) in labels:
                    named[(key, dim)] = name
    return named


def program_formula(
    program: "torch.export.ExportedProgram",
    call: Optional[ModelCall],
    aliases: Mapping[Any, str],
    handles: Mapping[str, Handle],
    ignored: Any,
    ancestor_mode: str,
    dims: Mapping[str, DimSpec],
    inner: str = "",
) -> SymbolicCount:
    """The statistic ``handles`` count in an exported program, per module, as expressions of its
    size symbols, read from its graph: each named by ``dims`` where it names the input dimension
    the symbol stands for, else by the program's own name for it (``s72``). Valid where the
    program's ranges hold; ``example``: the sizes of ``call`` (None: those it was exported with)."""
    statistics = statistics_of(DispatchTrace(tuple(program_records(program, aliases, None, inner))), handles, ignored, aliases, ancestor_mode)
    symbols_at = dims_of_program(program)
    named = _named_dims(dims, input_dims(program))
    names = {symbol: sympy.Symbol(named.get(label, str(symbol)), integer=True, positive=True) for label, symbol in symbols_at.items()}
    fixed = tuple(dict.fromkeys(name for label, name in named.items() if label not in symbols_at))
    sizes = program_sizes(program, call)

    def expression(value: Any) -> sympy.Expr:
        expr = value.node.expr if isinstance(value, torch.SymInt) else sympy.Integer(value)
        return sympy.expand(expr.xreplace(names))

    by_module = {module: expression(sum(counts.values(), 0)) for module, counts in statistics.counts.items()}
    guards = []
    for symbol, bounds in program.range_constraints.items():
        if symbol in names:
            if isinstance(bounds.lower, sympy.Integer) and bounds.lower > 1:  # torch's unbounded ends are int_oo, not Integers
                guards.append(names[symbol] >= int(bounds.lower))
            if isinstance(bounds.upper, sympy.Integer):
                guards.append(names[symbol] <= int(bounds.upper))
    example = {named_symbol.name: sizes[symbol] for symbol, named_symbol in names.items() if symbol in sizes}
    return SymbolicCount(by_module, {symbol.name: symbol for symbol in names.values()}, example, tuple(guards), fixed)
