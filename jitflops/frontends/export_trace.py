"""The export front end: an ``ExportedProgram``'s graph read statically, without running anything.

``torch.export`` (non-strict) leaves every call node with what a count needs: its op
(``aten.linear``, ``aten.scaled_dot_product_attention``: export keeps the high-level ops the JIT's
handles read), its module scope (``meta["nn_module_stack"]``, outermost first) and a fake tensor
of each value (``meta["val"]``), whose sizes are symbols where the program was exported with
dynamic shapes. Each call node becomes an :class:`~jitflops.core.records.EagerOpRecord` for the same
handles as the other front ends. With symbolic sizes, a count is an expression in them
(:func:`jitflops.engine.symbolic_counts.program_formula`); a count in numbers evaluates them at the sizes of the inputs given, or
at the sizes the program was exported with.

A program comes from a model (:func:`export_model`), as an ``ExportedProgram``, or from a ``.pt2``
file (:func:`load_program`, which is ``torch.export.load``: see ``docs/front-ends.md`` for what that
trusts). Its module hierarchy, parameters included, is rebuilt by ``torch.export.unflatten``.
"""

from __future__ import annotations

import copy
import importlib
import io
import logging
import os
import re
import sys
import traceback
import warnings
import weakref
import zipfile
from contextlib import ExitStack, contextmanager, redirect_stderr
from typing import Any, Callable, Iterator, Mapping, Optional, Union

import sympy
import torch
from torch import nn
from torch._subclasses import fake_impls
from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode, free_unbacked_symbols
from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook
from torch.overrides import TorchFunctionMode
from torch.utils import _pytree as pytree

from .dispatch_trace import DispatchTrace, Signature
from .program_source import ProgramSource
from ..core.errors import DataDependentTraceWarning, JitflopsError, TraceError, describe_scope
from ..core.model_guard import preserved
from ..core.model_io import ModelCall, tensor_leaves
from ..core.records import FORWARD, EagerOpRecord, TensorMeta

Sizes = Mapping[sympy.Symbol, int]
"""A value for each of a program's size symbols."""

_WRAPPERS = ("wrap_with_set_grad_enabled", "wrap_with_autocast")
"""Higher-order ops that only run a submodule's graph under a setting: their nodes are counted."""


class ProgramError(JitflopsError):
    """A program that cannot be read, or inputs it cannot take: names the file, or the input and size.
    (A model that cannot be exported gets a :class:`~jitflops.core.errors.TraceError` naming the module.)"""


class _Logged(logging.Handler):
    """What torch.export.load logs: it logs why it cannot deserialize, and raises a generic error."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.text: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.text.append(record.getMessage() + ("\n" + "".join(traceback.format_exception(*record.exc_info)) if record.exc_info else ""))


def _load(path: str) -> tuple[Optional["torch.export.ExportedProgram"], Optional[Exception], str]:
    """``torch.export.load``: the program, or the error and what torch logged of its cause."""
    logged = _Logged()
    logger = logging.getLogger("torch.export")
    handlers, propagate = logger.handlers, logger.propagate
    logger.handlers, logger.propagate = [logged], False  # its traceback is said in one line, or not at all
    try:
        return torch.export.load(path), None, ""
    except Exception as error:
        return None, error, "\n".join(logged.text)
    finally:
        logger.handlers, logger.propagate = handlers, propagate


def load_program(path: Union[str, "os.PathLike[str]"]) -> "torch.export.ExportedProgram":
    """``torch.export.load`` with an error that names the file where it is not a program. A
    program whose inputs or outputs are instances of a class registered with pytree by its package
    (transformers' ``ModelOutput`` s) needs that package imported to be read: the module that
    defines the class is imported, once, and the file read again."""
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise ProgramError(f"{path}: no such file (a .pt2 file written by torch.export.save is expected)")
    if not zipfile.is_zipfile(path):
        raise ProgramError(f"{path}: not a .pt2 archive (torch.export.save writes a zip archive; this is not one)")
    program, error, logged = _load(path)
    unregistered = re.search(r"Deserializing (\S+) in pytree is not registered", logged)
    if program is None and unregistered:
        module = unregistered.group(1).rpartition(".")[0]
        try:
            importlib.import_module(module)
        except ImportError as missing:
            raise ProgramError(f"{path}: the program's inputs or outputs are {unregistered.group(1)}, and {module} cannot be imported ({missing})") from error
        program, error, logged = _load(path)
    if program is None:
        assert error is not None
        reason = next((line.strip() for line in reversed(logged.splitlines()) if line.strip() and not line.startswith(" ")), str(error).strip().splitlines()[0])
        raise ProgramError(f"{path}: torch.export.load cannot read it as an exported program ({reason})") from error
    return program


def program_of(source: ProgramSource) -> "torch.export.ExportedProgram":
    return source if isinstance(source, torch.export.ExportedProgram) else load_program(source)


_MODULES: "weakref.WeakKeyDictionary[torch.export.ExportedProgram, nn.Module]" = weakref.WeakKeyDictionary()


def module_of(program: "torch.export.ExportedProgram") -> nn.Module:
    """The program's module hierarchy with its parameters (``torch.export.unflatten``), else its
    flat graph module (a program unflatten cannot rebuild); the same module for the same program,
    so that analyses of one program share its recording. Unflattened from a copy
    (:func:`_graph_copy`): the program is counted, and given back, as it was."""
    module = _MODULES.get(program)
    if module is None:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", FutureWarning)  # torch's own pytree deprecations, inside unflatten
                module = torch.export.unflatten(_graph_copy(program))
        except Exception:
            module = program.module()
        _MODULES[program] = module
    return module


def _graph_copy(program: "torch.export.ExportedProgram") -> "torch.export.ExportedProgram":
    """``program`` with copies of its graph and signature, sharing its weights, constants and
    example inputs. ``torch.export.unflatten`` removes a program's effect tokens in place, and with
    them every node whose value nothing uses: Qwen4-Exp's last recurrent state update when the
    state is not returned (2 of its 16 products, 17% of its count), which the program as exported
    and the model's eager forward both compute."""
    shared = [*program.state_dict.values(), *program.constants.values(), *pytree.tree_leaves(program.example_inputs)]
    return copy.deepcopy(program, {id(each): each for each in shared if isinstance(each, torch.Tensor)})


class _TensorOutputs(nn.Module):
    """The model, returning the tensors of its output only: export takes no output type it cannot
    flatten (a generation cache). The model is its child ``model``: scopes are read under it."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, *args: Any, **kwargs: Any) -> tuple[torch.Tensor, ...]:
        return tensor_leaves(self.model(*args, **kwargs))


_VALUE_READ = ("data-dependent", "Cannot convert symbols to int", "unhashable type: non-nested SymInt")
"""What torch's errors say where the model's Python used a value read from a tensor."""


def _data_dependent(error: BaseException) -> bool:
    """Whether export failed where the model's Python reads a tensor's values (a branch, a size, a
    dictionary key)."""
    seen: list[BaseException] = []
    while error is not None and error not in seen:
        if isinstance(error, GuardOnDataDependentSymNode) or any(sign in str(error) for sign in _VALUE_READ):
            return True
        seen.append(error)
        error = error.__cause__ or error.__context__
    return False


def _value_sized(program: "torch.export.ExportedProgram") -> bool:
    """Whether a value of the program has a size that tensor values decide (an unbacked symbol,
    ``nonzero``'s output), which no input fixes."""
    return any(free_unbacked_symbols(node.meta.get("val")) for node in program.graph.nodes if node.op == "call_function")


@contextmanager
def _quiet_export() -> Iterator[None]:
    """An export that fails where values decide is retried by ``draft_export``, and one that fails
    otherwise raises jitflops' error naming the module, so what torch prints along the way is
    noise: ``torch.export`` prints a failed export's partial graph to stderr before it raises, once
    per wrapper it passes (thousands of lines for a vision tower); its shape environment logs each
    guard it could not place; ``draft_export`` logs each value it took from the real run, and a
    banner. What happened is said once, in jitflops' warning; the rest of stderr is passed on."""
    loggers = [logging.getLogger(name) for name in ("torch.export._draft_export", "torch.fx.experimental.symbolic_shapes")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.ERROR)
    printed = io.StringIO()
    partial_graph = ""
    try:
        with redirect_stderr(printed):
            yield
    except Exception as error:
        graph = getattr(error, "partial_fx_graph", None)  # set by torch.fx's tracer on what it raises
        if graph is not None:
            partial_graph = f"{graph}\n"
        raise
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)
        text = printed.getvalue()
        sys.stderr.write(text.replace(partial_graph, "") if partial_graph else text)


@contextmanager
def _signbit_meta_as_its_kernel() -> Iterator[None]:
    """torch's ``prims.signbit`` declares an output of its input's dtype, where its kernel gives
    bool (seen on torch 2.11 and 2.13). Under ``draft_export``'s run on real values that mismatch makes torch
    infer a fake kernel from the real output, with a fresh size no output binds
    (``PendingUnbackedSymbolNotFound``). The integer ``floor_divide`` decomposes through it: a
    value-sized tensor divided by an int, as Qwen3-VL's vision towers compute ``widths // merge``.
    For the draft, the prim's meta gives bool, as its kernel does; where torch's meta already
    does, nothing changes."""
    prim = torch.ops.prims.signbit.default
    meta = prim.prim_meta_impl
    if meta(torch.empty(1, device="meta")).dtype == torch.bool:
        yield
        return
    prim.prim_meta_impl = lambda a: torch.empty_like(meta(a), dtype=torch.bool)
    try:
        yield
    finally:
        prim.prim_meta_impl = meta


@contextmanager
def _int_truediv_lowered_by_python() -> Iterator[None]:
    """torch's analysis that writes a program's runtime asserts as Python operators has none for an
    integer's true division (seen on torch 2.11 and 2.13): it inherits sympy's ``IntTrueDiv``, which, given
    the graph's proxies, branches on them and fails (``symbolically traced variables cannot be used
    as inputs to control flow``). ``draft_export`` meets one where a value read from a tensor
    divides an int: LLaVA-NeXT's ``select_best_resolution`` computes ``672 / width`` from the image
    sizes. For the draft, the division is Python's ``/``, as the analysis' float division already
    is; where torch has its own, nothing changes."""
    from torch.utils._sympy.reference import PythonReferenceAnalysis

    if "int_truediv" in vars(PythonReferenceAnalysis):
        yield
        return
    PythonReferenceAnalysis.int_truediv = staticmethod(PythonReferenceAnalysis.truediv)
    try:
        yield
    finally:
        del PythonReferenceAnalysis.int_truediv


@contextmanager
def _torch_mended_for_the_draft() -> Iterator[None]:
    """``draft_export`` with torch's defects that stop it mended, each put back afterwards: the two
    above, and an op whose output size its values decide binding no symbol. ``draft_export``
    checks each op's fake output against the real one, and the check's size comparisons record
    the real values: where a mask selects every row, the fresh size of ``nonzero`` inside
    ``index`` becomes the constant it was compared with (8) before ``index`` returns, and torch
    raises ``PendingUnbackedSymbolNotFound`` for the symbol no output holds (Higgs Audio's text and
    audio tokens, Qwen3-Omni's thinker). torch's own switch makes that a logged warning: the
    size is known, and the program's output sizes are checked against the eager forward's after
    (where torch has the switch, as 2.11 and 2.13 do; without it, the error stands)."""
    config = torch.fx.experimental._config
    with ExitStack() as stack:
        stack.enter_context(_signbit_meta_as_its_kernel())
        stack.enter_context(_int_truediv_lowered_by_python())
        if hasattr(config, "soft_pending_unbacked_not_found_error"):
            stack.enter_context(config.patch(soft_pending_unbacked_not_found_error=True))
        yield


_TAKEN = " (each value its Python reads taken as a constant, as the JIT takes it)"
"""What the warning of a draft adds where the values read were taken as constants."""


class _TensorsOfListsOfValues(TorchFunctionMode):
    """``torch.tensor`` of a list that holds tensors takes their values: the C++ behind it reads
    their data directly, which fake tensors do not hold (``its data is not allocated yet``)."""

    def __torch_function__(self, func: Callable, types: Any, args: tuple = (), kwargs: Optional[dict] = None) -> Any:
        if func is torch.tensor and args and isinstance(args[0], (list, tuple)):
            args = (pytree.tree_map_only(torch.Tensor, lambda tensor: tensor.item(), args[0]), *args[1:])
        return func(*args, **(kwargs or {}))


@contextmanager
def _values_read_taken_as_constants() -> Iterator[None]:
    """``draft_export`` with each value the model's Python reads from a tensor (``item``,
    ``tolist``) taken as the constant its run on the real inputs found, as the JIT tracer takes it,
    where ``draft_export`` keeps a symbol: the last resort, for a model that uses such values where
    no symbol can go. Qwen2-VL's ``get_rope_index`` groups the token types in Python, keys a
    dictionary by them (``unhashable type: non-nested SymInt``) and builds ``torch.tensor`` of a
    list of traced tensors. The program then holds for these values alone, as any draft does."""
    op = torch.ops.aten._local_scalar_dense.default
    symbolic = fake_impls.op_implementations_dict[op]

    def taken(fake_mode: Any, func: Any, tensor: Any) -> Any:
        real = getattr(tensor, "real_tensor", None)
        return real.item() if real is not None else symbolic(fake_mode, func, tensor)

    fake_impls.op_implementations_dict[op] = taken
    try:
        with _TensorsOfListsOfValues():
            yield
    finally:
        fake_impls.op_implementations_dict[op] = symbolic


def _check_drafted_sizes(program: "torch.export.ExportedProgram", model: nn.Module, call: ModelCall) -> None:
    """draft_export takes the values its own run on the real inputs found, a run beside fake
    tensors that can take another path than the eager forward (FastSpeech2's predicted durations:
    its decoder ran 8 frames where the eager forward runs 4). The model's forward runs once, and
    the program's outputs must have its outputs' sizes, or export counts nothing."""
    with torch.no_grad():
        eager = [list(tensor.shape) for tensor in tensor_leaves(model(*call.args, **call.kwargs))]
    sizes = program_sizes(program, None)
    drafted = [[_evaluated(size, sizes) for size in value.shape] for value in _user_output_values(program) if isinstance(value, torch.Tensor)]
    if drafted != eager:
        raise JitflopsError(f"torch.export.draft_export took values the eager forward does not take: its outputs have sizes {drafted}, "
                            f"the forward's {eager}; backend='dispatch' counts what the forward runs")


def export_model(model: nn.Module, call: ModelCall, dims: Optional[Callable[[nn.Module], Any]] = None) -> tuple["torch.export.ExportedProgram", str]:
    """``torch.export.export(strict=False)`` of the call, and the name the model has in the
    program ("" for itself; ``"model"`` where an output export cannot flatten made it export the
    model's tensor outputs). ``dims``: the ``dynamic_shapes`` for a module exported. An error
    names the innermost module that was running when export failed.

    Where the model's Python reads tensor values (a branch on them, a size they decide: vision
    towers' ``grid_thw``, ``nonzero``), export fails or leaves sizes no input fixes; the model is
    then exported by ``torch.export.draft_export``, which runs it on the real inputs beside the fake
    ones and takes those values, as a JIT trace does, and a
    :class:`~jitflops.core.errors.DataDependentTraceWarning` says so: the count holds for these
    inputs' values."""
    names = {module: name for name, module in model.named_modules()}
    running: list[str] = []
    failed: list[str] = []

    def entered(module: nn.Module, _inputs: Any) -> None:
        if module in names:
            running.append(names[module])

    def left(module: nn.Module, _inputs: Any, _output: Any) -> None:
        if module in names and running and running[-1] == names[module]:
            if not failed and sys.exc_info()[1] is not None:
                failed.append(running[-1])
            running.pop()

    def failing_scope() -> str:
        """The module export failed in: the first that raised, else the innermost still running."""
        return failed[0] if failed else (running[-1] if running else "")

    def exported(module: nn.Module, draft: bool) -> "torch.export.ExportedProgram":
        export = torch.export.draft_export if draft else torch.export.export
        with _quiet_export():
            return export(module, call.args, call.kwargs, dynamic_shapes=dims(module) if dims else None, strict=False)

    def with_outputs_flattened(draft: bool) -> tuple["torch.export.ExportedProgram", str]:
        running.clear()
        failed.clear()
        try:
            return exported(model, draft), ""
        except Exception as error:
            if "not a known" not in str(error) and "pytree" not in str(error):
                raise
            running.clear()
            return exported(_TensorOutputs(model), draft), "model"

    def drafted() -> tuple["torch.export.ExportedProgram", str, bool]:
        """``draft_export``'s program, its inner name, and whether the values read were taken as
        constants: where the draft fails, it is tried again so; where that fails too, the draft's
        error is raised, in the module it failed in."""
        with _torch_mended_for_the_draft():
            try:
                return (*with_outputs_flattened(draft=True), False)
            except Exception as error:
                scope = failing_scope()
                try:
                    with _values_read_taken_as_constants():
                        return (*with_outputs_flattened(draft=True), True)
                except Exception:  # the draft's own error says what the model did
                    pass
                failed[:] = [scope]
                raise error

    drafted_because, taken = "", False
    with ExitStack() as stack:
        stack.enter_context(preserved(model))  # export runs the model's Python: what it sets on modules is put back
        stack.enter_context(warnings.catch_warnings())
        warnings.filterwarnings("ignore", message=".*were assigned during export")  # an LSTM's own _flat_weights
        stack.callback(register_module_forward_pre_hook(entered).remove)
        stack.callback(register_module_forward_hook(left, always_call=True).remove)
        try:
            try:
                program, inner = with_outputs_flattened(draft=False)
                if _value_sized(program):
                    drafted_because = "it makes tensors whose sizes their values decide"
            except Exception as error:
                if not _data_dependent(error):
                    raise
                drafted_because = f"its Python reads tensor values in {describe_scope(failing_scope())} ({str(error).strip().splitlines()[0][:200]})"
            if drafted_because:
                program, inner, taken = drafted()
                _check_drafted_sizes(program, model, call)
        except Exception as error:
            scope = failing_scope()
            module = model.get_submodule(scope) if scope else model
            raise TraceError(scope, type(module).__name__, error, "exporting") from error
    if drafted_because:
        warnings.warn(f"jitflops: torch.export cannot export the model as it is, since {drafted_because}; "
                      f"torch.export.draft_export exported it with the values of these inputs{_TAKEN if taken else ''}, so the count holds for them",
                      DataDependentTraceWarning, stacklevel=3)
    return program, inner


# ------------------------------------------------------------------------------------- sizes


def _user_input_values(program: "torch.export.ExportedProgram") -> list[Any]:
    """The fake values of the program's user inputs, in its call's order."""
    user = set(program.graph_signature.user_inputs)
    return [node.meta.get("val") for node in program.graph.nodes if node.op == "placeholder" and node.name in user]


def _user_output_values(program: "torch.export.ExportedProgram") -> list[Any]:
    """The fake values of the program's user outputs, in its output's order (mutated buffers left out)."""
    user = set(program.graph_signature.user_outputs)
    output = next(node for node in program.graph.nodes if node.op == "output")
    return [node.meta.get("val") for node in pytree.tree_leaves(output.args) if isinstance(node, torch.fx.Node) and node.name in user]


def _flat_call(program: "torch.export.ExportedProgram", call: ModelCall) -> list[Any]:
    """The call's arguments flattened as the program's call spec flattens them (keyword arguments in its order)."""
    spec = program.call_spec.in_spec
    keys = list(_children(spec)[1].context) if spec is not None and spec.num_children == 2 else list(call.kwargs)
    unknown = sorted(set(call.kwargs) - set(keys))
    if unknown:
        raise ProgramError(f"the program takes no keyword argument {', '.join(map(repr, unknown))} (it takes {', '.join(map(repr, keys)) or 'none'})")
    return pytree.tree_leaves((call.args, {key: call.kwargs[key] for key in keys if key in call.kwargs}))


def _decided_value(value: Any) -> Any:
    """A value draft_export's real run gave a symbol: a size as an int, a flag or a float as sympy's."""
    return int(value) if getattr(value, "is_Integer", False) or type(value) is int else sympy.sympify(value)


def program_sizes(program: "torch.export.ExportedProgram", call: Optional[ModelCall]) -> dict[sympy.Symbol, int]:
    """A value for every size symbol of ``program``: the size of the input dimension it stands
    for in ``call``, else the size the program was exported with."""
    values = _user_input_values(program)
    env = next((value.fake_mode.shape_env for value in values if isinstance(value, torch.Tensor) and getattr(value, "fake_mode", None)), None)
    hints = (env.backed_var_to_val if hasattr(env, "backed_var_to_val") else env.var_to_val) if env is not None else {}
    sizes: dict[sympy.Symbol, int] = {symbol: int(value) for symbol, value in hints.items()}
    exported_sizes = dict(sizes)
    # the sizes values decided, as draft_export's run on the real inputs found them: true at the exported sizes only
    decided = {symbol: _decided_value(value) for symbol, value in getattr(env, "real_tensor_prop_unbacked_vals", {}).items()}
    if call is None:
        return {**decided, **sizes}
    given = [leaf for leaf in _flat_call(program, call) if isinstance(leaf, torch.Tensor)]
    expected = [value for value in values if isinstance(value, torch.Tensor)]
    if len(given) != len(expected):
        raise ProgramError(f"the program takes {len(expected)} tensor inputs, the call gives {len(given)}")
    for index, (tensor, fake) in enumerate(zip(given, expected)):
        if tensor.dim() != fake.dim():
            raise ProgramError(f"input {index} has {tensor.dim()} dimensions, the program's has {fake.dim()} ({list(fake.shape)})")
        for dim, size in enumerate(fake.shape):
            if isinstance(size, torch.SymInt) and isinstance(size.node.expr, sympy.Symbol):
                sizes[size.node.expr] = int(tensor.shape[dim])
    for symbol, bounds in program.range_constraints.items():
        value = sizes.get(symbol)
        if value is not None and not (bounds.lower <= value <= bounds.upper):
            raise ProgramError(f"a size the program calls {symbol} is {value} in the inputs given; the program was exported for {bounds.lower} to {bounds.upper}")
    for index, (tensor, fake) in enumerate(zip(given, expected)):
        shape = [_evaluated(size, sizes) for size in fake.shape]
        if shape != list(tensor.shape):
            raise ProgramError(f"input {index} has shape {list(tensor.shape)}, the program was exported for {list(fake.shape)} ({shape} with these sizes)")
    return {**decided, **sizes} if sizes == exported_sizes else sizes


def _evaluated(value: Any, sizes: Sizes) -> Any:
    """A symbolic size (or float) as its number at ``sizes``; anything else as it is."""
    if isinstance(value, torch.SymInt):
        return int(value.node.expr.xreplace(sizes))
    if isinstance(value, torch.SymFloat):
        return float(value.node.expr.xreplace(sizes))
    if isinstance(value, torch.SymBool):
        return bool(value.node.expr.xreplace(sizes))
    return value


def _known(value: Any, sizes: Sizes) -> bool:
    """Whether ``sizes`` give a value to every symbol of ``value``: not so for a size the values
    decide (``nonzero``'s output: an unbacked symbol, which no input fixes)."""
    return not isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)) or value.node.expr.free_symbols <= sizes.keys()


def _concrete(value: Any, sizes: Sizes) -> Any:
    """A decoded argument with its symbolic sizes evaluated at ``sizes``; a tensor whose size the
    values decide has no shape (a handle that needs it says so, naming the op and its module)."""
    if isinstance(value, TensorMeta):
        if value.shape is None or not all(_known(size, sizes) for size in value.shape):
            return TensorMeta(None, value.dtype)
        return TensorMeta(tuple(_evaluated(size, sizes) for size in value.shape), value.dtype, value.kept)
    if not _known(value, sizes):
        return None
    if isinstance(value, list):
        return [_concrete(item, sizes) for item in value]
    return _evaluated(value, sizes)


# ----------------------------------------------------------------------------------- records


def _scope(node: "torch.fx.Node", aliases: Mapping[Any, str], inner: str) -> str:
    """The node's full scope path (``"/encoder/encoder.layer.0"``), canonical names, root first;
    ``inner``: the model's own name in the program, left out ("" where the program is the model's)."""
    stack = node.meta.get("nn_module_stack") or {}
    paths = (path for path, _type in stack.values())
    if inner:
        paths = ("" if path == inner else path[len(inner) + 1:] if path.startswith(inner + ".") else "" for path in paths)
    names = (aliases.get(path, path) for path in paths)
    return "/".join(["", *dict.fromkeys(name for name in names if name)])


def _nodes(graph_module: "torch.fx.GraphModule") -> Iterator["torch.fx.Node"]:
    """The graph's call nodes, the nodes of what a wrapper higher-order op runs in their place."""
    for node in graph_module.graph.nodes:
        if node.op != "call_function":
            continue
        name = getattr(node.target, "__name__", "")
        if isinstance(node.target, torch._ops.HigherOrderOperator) and name in _WRAPPERS:
            body = next(arg for arg in node.args if isinstance(arg, torch.fx.Node) and arg.op == "get_attr")
            yield from _nodes(getattr(graph_module, body.target))
        else:
            yield node


def _value(argument: Any) -> Any:
    """A node's argument with each graph value as its fake value."""
    return pytree.tree_map_only(torch.fx.Node, lambda node: node.meta.get("val"), argument)


def program_records(program: "torch.export.ExportedProgram", aliases: Mapping[Any, str], sizes: Optional[Sizes], inner: str = "") -> list[tuple[str, EagerOpRecord]]:
    """Each op call of ``program`` as a record with its scope path, sizes evaluated at ``sizes``
    (None: left as symbols). A call of something that is not an aten op (a higher-order op other
    than the wrappers, a Python operator on sizes) is recorded by its name with no schema."""
    signatures: dict[Any, Signature] = {}
    records = []
    for node in _nodes(program.graph_module):
        target = node.target
        path = _scope(node, aliases, inner)
        module = path.rpartition("/")[2]
        if isinstance(target, torch._ops.OpOverload):
            signature = signatures.get(target)
            if signature is None:
                signature = signatures[target] = Signature.of(target._schema)
            record = signature.record(_value(node.args), _value(node.kwargs), node.meta.get("val"), module, FORWARD)
        elif isinstance(target, torch._ops.HigherOrderOperator):
            record = EagerOpRecord(f"higher_order::{target.__name__}", [], [], None, module)
        else:
            continue  # Python arithmetic on sizes, getitem of a tuple output: no work of its own
        if sizes is not None:
            record = EagerOpRecord(record.kind, _concrete(record.inputs, sizes), _concrete(record.outputs, sizes), record.arg_names, module)
        records.append((path, record))
    return records


def record_program(program: "torch.export.ExportedProgram", aliases: Mapping[Any, str], call: Optional[ModelCall], inner: str = "") -> DispatchTrace:
    """The program's ops, sized for ``call`` (None: the sizes it was exported with): an op source
    for the engine. ``inner``: the model's name in the program (:func:`export_model`)."""
    return DispatchTrace(tuple(program_records(program, aliases, program_sizes(program, call), inner)))


def _labels(program: "torch.export.ExportedProgram") -> list[Union[str, int]]:
    """Each user input's label: its keyword, or its place (among the flattened inputs, where an input is a structure)."""
    spec = program.call_spec.in_spec
    values = _user_input_values(program)
    labels: list[Union[str, int]] = []
    if spec is not None and spec.num_children == 2:
        positional, keywords = _children(spec)
        labels = list(range(positional.num_children)) + list(keywords.context)
    return labels if len(labels) == len(values) else list(range(len(values)))


def input_dims(program: "torch.export.ExportedProgram") -> set[tuple[Union[str, int], int]]:
    """Every (input, dimension) of the program's tensor inputs."""
    return {(label, dim) for label, value in zip(_labels(program), _user_input_values(program)) if isinstance(value, torch.Tensor) for dim in range(value.dim())}


def dims_of_program(program: "torch.export.ExportedProgram") -> dict[tuple[Union[str, int], int], sympy.Symbol]:
    """(input, dimension) -> the program's size symbol there, for each input dimension that is one."""
    found: dict[tuple[Union[str, int], int], sympy.Symbol] = {}
    for label, value in zip(_labels(program), _user_input_values(program)):
        if isinstance(value, torch.Tensor):
            for dim, size in enumerate(value.shape):
                if isinstance(size, torch.SymInt) and isinstance(size.node.expr, sympy.Symbol):
                    found[(label, dim)] = size.node.expr
    return found


def _children(spec: Any) -> list[Any]:
    """A tree spec's children (``children()`` where torch has it; ``children_specs`` is deprecated)."""
    return list(spec.children()) if callable(getattr(spec, "children", None)) else list(spec.children_specs)
