"""The default FLOP count read from the model's calls (``jitflops.frontends.call_recording``) against
the JIT trace it stands in for: the same counts, unsupported ops and uncalled modules, and the
trace wherever a call is outside its tables."""

from __future__ import annotations

from typing import Any, Callable

import pytest
import torch
from torch import nn

from jitflops import FlopCountAnalysis
from jitflops.examples import BUILTIN_EXAMPLES, ZOO
from jitflops.frontends.call_recording import COUNTED_CALLS, FREE_CALLS, SILENT, DROPPED_WHEN_UNUSED

MODELS = [name for name, example in ZOO.items() if "zoo" in example.tags] + [name for name in BUILTIN_EXAMPLES if name != "lstm"]


def _counts(model: nn.Module, args: Any, kwargs: Any = None, **settings: Any) -> FlopCountAnalysis:
    analysis = FlopCountAnalysis(model, args, kwargs=kwargs or None, **settings)
    analysis.unsupported_ops_warnings(False).uncalled_modules_warnings(False)
    analysis.by_module_and_operator()
    return analysis


def _same_as_the_trace(model: nn.Module, args: Any, kwargs: Any = None) -> FlopCountAnalysis:
    from_calls = _counts(model, args, kwargs)
    traced = _counts(model, args, kwargs, compute=True)  # computing values: the JIT traces
    assert traced._calls is None and traced._trace is not None
    assert from_calls.by_module_and_operator() == traced.by_module_and_operator()
    assert from_calls.unsupported_ops() == traced.unsupported_ops()
    assert from_calls.uncalled_modules() == traced.uncalled_modules()
    return from_calls


@pytest.mark.parametrize("name", MODELS)
def test_every_model_of_the_zoo_is_counted_from_its_calls_as_the_jit_counts_it(name: str) -> None:
    model, args, kwargs = {**ZOO, **BUILTIN_EXAMPLES}[name].instantiate()
    analysis = _same_as_the_trace(model.eval(), args, kwargs)
    assert analysis._trace is None, "counted from the calls, not traced"


class _Only(nn.Module):
    def __init__(self, call: Callable[[torch.Tensor], Any]) -> None:
        super().__init__()
        self.call = call

    def forward(self, x: torch.Tensor) -> Any:
        self.call(x)
        return x


class _Calls(nn.Module):
    """A module per call, each doing nothing else: whether the JIT finds the module called says
    whether the call records a node."""

    def __init__(self, calls: dict[str, Callable[[torch.Tensor], Any]]) -> None:
        super().__init__()
        self.linear = nn.Linear(8, 8)
        self.calls = nn.ModuleDict({name: _Only(call) for name, call in calls.items()})

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for module in self.calls.values():
            module(x)
        return self.linear(x)


def _inplace(method: str, *args: Any) -> Callable[[torch.Tensor], Any]:
    return lambda x: getattr(x.clone(), method)(*args)


SAMPLE_CALLS: dict[str, Callable[[torch.Tensor], Any]] = {
    "__add__": lambda x: x + 1, "__radd__": lambda x: 1 + x, "__iadd__": _inplace("__iadd__", 1), "__sub__": lambda x: x - 1,
    "__rsub__": lambda x: 1 - x, "__mul__": lambda x: x * 2, "__rmul__": lambda x: 2 * x, "__imul__": _inplace("__imul__", 2),
    "__truediv__": lambda x: x / 2, "__rtruediv__": lambda x: 2 / x, "__floordiv__": lambda x: x // 2, "__rfloordiv__": lambda x: 2 // x, "__mod__": lambda x: x % 2,
    "__rmod__": lambda x: 2 % x, "__pow__": lambda x: x**2, "__neg__": lambda x: -x, "__eq__": lambda x: x == 0,
    "__and__": lambda x: (x > 0) & (x < 1), "__or__": lambda x: (x > 0) | (x < 1), "__invert__": lambda x: ~(x > 0),
    "diff": lambda x: torch.diff(x, dim=1), "ndim": lambda x: x.ndim,
    "__ne__": lambda x: x != 0, "__lt__": lambda x: x < 0, "__le__": lambda x: x <= 0, "__gt__": lambda x: x > 0,
    "remainder": lambda x: x.remainder(2), "floor_divide": lambda x: x.floor_divide(2), "reciprocal": lambda x: x.reciprocal(),
    "__ge__": lambda x: x >= 0, "__getitem__": lambda x: x[:, 1:], "index": lambda x: x[torch.tensor([0])],
    **{name: (lambda x, name=name: getattr(x, name)()) for name in (
        "abs", "ceil", "cos", "erf", "exp", "floor", "isnan", "log", "logical_not", "neg", "relu", "round", "rsqrt", "sigmoid",
        "sign", "sin", "sqrt", "tanh", "clone", "contiguous", "detach", "t", "all", "any", "argmax", "max", "mean", "min", "sum",
        "float", "long", "bool", "half", "dim", "numel", "size",
    )},
    "relu_": _inplace("relu_"), "add_": _inplace("add_", 1), "sub_": _inplace("sub_", 1), "mul_": _inplace("mul_", 2),
    "div_": _inplace("div_", 2), "masked_fill_": lambda x: x.clone().masked_fill_(x > 0, 0.0),
    "add": lambda x: torch.add(x, x), "sub": lambda x: torch.sub(x, 1), "mul": lambda x: torch.mul(x, x), "div": lambda x: torch.div(x, 2),
    "pow": lambda x: torch.pow(x, 2), "eq": lambda x: x.eq(0), "ne": lambda x: x.ne(0), "lt": lambda x: x.lt(0), "le": lambda x: x.le(0),
    "gt": lambda x: x.gt(0), "ge": lambda x: x.ge(0), "maximum": lambda x: torch.maximum(x, x), "minimum": lambda x: torch.minimum(x, x),
    "clamp": lambda x: x.clamp(-1, 1), "where": lambda x: torch.where(x > 0, x, 0.0), "masked_fill": lambda x: x.masked_fill(x > 0, 0.0),
    "gelu": lambda x: torch.nn.functional.gelu(x), "cat": lambda x: torch.cat([x, x]), "stack": lambda x: torch.stack([x, x]),
    "chunk": lambda x: x.chunk(2), "split": lambda x: x.split(4, dim=1), "unbind": lambda x: x.unbind(0),
    "expand": lambda x: x[:1].expand(3, 8), "expand_as": lambda x: x[:1].expand_as(x), "flatten": lambda x: x.flatten(),
    "flip": lambda x: x.flip(0), "index_select": lambda x: x.index_select(1, torch.tensor([0, 2])), "narrow": lambda x: x.narrow(1, 0, 2),
    "permute": lambda x: x.permute(1, 0), "repeat": lambda x: x.repeat(2, 1), "repeat_interleave": lambda x: x.repeat_interleave(2, dim=0),
    "reshape": lambda x: x.reshape(4, 4), "roll": lambda x: x.roll(1, 1), "squeeze": lambda x: x[None].squeeze(0),
    "transpose": lambda x: x.transpose(0, 1), "tril": lambda x: x.tril(), "triu": lambda x: x.triu(), "unsqueeze": lambda x: x.unsqueeze(0),
    "view": lambda x: x.view(16), "view_as": lambda x: x.view_as(x), "arange": lambda x: torch.arange(x.shape[1], device=x.device),
    "full_like": lambda x: torch.full_like(x, 2.0), "new_ones": lambda x: x.new_ones(3), "new_zeros": lambda x: x.new_zeros(3),
    "ones": lambda x: torch.ones(3, device=x.device), "ones_like": lambda x: torch.ones_like(x), "zeros": lambda x: torch.zeros(3, device=x.device),
    "zeros_like": lambda x: torch.zeros_like(x), "cumsum": lambda x: x.cumsum(1), "gather": lambda x: x.gather(1, torch.zeros(2, 1, dtype=torch.long)),
    "log_softmax": lambda x: x.log_softmax(-1), "softmax": lambda x: torch.nn.functional.softmax(x, -1), "to": lambda x: x.to(torch.float64),
    "type_as": lambda x: x.type_as(x.long()), "shape": lambda x: x.shape, "dtype": lambda x: x.dtype, "device": lambda x: x.device,
    "tensor": lambda x: torch.tensor([1.0, 2.0]), "dropout": lambda x: torch.nn.functional.dropout(x, 0.1, training=False),
    "embedding": lambda x: torch.nn.functional.embedding(torch.tensor([0, 1]), x), "pad": lambda x: torch.nn.functional.pad(x, (1, 1)),
    "hardtanh": lambda x: torch.nn.functional.hardtanh(x), "silu": lambda x: torch.nn.functional.silu(x),
    "cross_entropy": lambda x: torch.nn.functional.cross_entropy(x, torch.zeros(2, dtype=torch.long)),
}
"""A call of each name of :data:`FREE_CALLS` (and indexing by a tensor), with nothing else where it can be."""


def test_every_free_call_has_a_sample() -> None:
    assert set(FREE_CALLS) <= set(SAMPLE_CALLS)


def _named(calls: dict[str, Callable[[torch.Tensor], Any]]) -> dict[str, Callable[[torch.Tensor], Any]]:
    """Module names that are no attribute of a module (``to``, ``float``)."""
    return {f"call{name.strip('_')}": call for name, call in calls.items()}


def test_every_free_call_records_what_the_jit_records_and_no_count() -> None:
    """Each free call in a module of its own: the same counts (none), unsupported ops (none) and
    uncalled modules as the JIT's, whose are those of the calls that record no node."""
    calls = {name: call for name, call in SAMPLE_CALLS.items() if name not in DROPPED_WHEN_UNUSED}
    analysis = _same_as_the_trace(_Calls(_named(calls)), (torch.randn(2, 8),))
    assert analysis._trace is None and analysis.total() == 2 * 8 * 8 and analysis.unsupported_ops() == {}
    silent = {name for name, kinds in FREE_CALLS.items() if kinds is SILENT}
    assert silent == {"dim", "ndim", "dtype", "device"}
    assert analysis.uncalled_modules() == {f"calls.call{name}" for name in silent}


@pytest.mark.parametrize("name", sorted(DROPPED_WHEN_UNUSED))
def test_a_module_whose_nodes_the_trace_may_drop_is_traced(name: str) -> None:
    """The JIT drops an unused size's or split's node: whether the module was called is the trace's to say."""
    analysis = _same_as_the_trace(_Calls(_named({name: SAMPLE_CALLS[name]})), (torch.randn(2, 8),))
    assert analysis._trace is not None


def _causal_lm(family: str, width: int) -> nn.Module:
    transformers = pytest.importorskip("transformers")
    if family == "gpt2":
        return transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=2, n_embd=width, n_head=4, vocab_size=1000)).eval()
    config = transformers.LlamaConfig(hidden_size=width, intermediate_size=2 * width, num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, vocab_size=1000)
    return transformers.LlamaForCausalLM(config).eval()


USUAL_KWARGS: dict[str, Callable[[torch.Tensor], dict[str, Any]]] = {
    "use_cache=False": lambda ids: {"use_cache": False},
    "an all-ones attention_mask": lambda ids: {"attention_mask": torch.ones_like(ids)},
    "labels": lambda ids: {"labels": ids},
}
"""What users pass to a causal language model besides its tokens. transformers' mask code reads a
padding mask's values (and searches packed sequences) only when not traced: the calls take the
trace's path (:mod:`jitflops.frontends.traced_path`)."""


@pytest.mark.parametrize("kwargs", USUAL_KWARGS)
@pytest.mark.parametrize("width", [64, 512], ids=["on its values", "on a meta copy"])
@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_a_causal_lm_called_with_the_usual_keyword_arguments_is_counted_from_its_calls(family: str, width: int, kwargs: str) -> None:
    ids = torch.randint(0, 1000, (1, 128))
    analysis = _same_as_the_trace(_causal_lm(family, width), (ids,), USUAL_KWARGS[kwargs](ids))
    assert analysis._trace is None, "counted from the calls, not traced"


def test_a_call_outside_the_tables_is_traced_with_the_same_count() -> None:
    class Einsum(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.weight = nn.Parameter(torch.randn(8, 4))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.einsum("bi,ij->bj", x, self.weight)

    analysis = _counts(Einsum(), (torch.randn(3, 8),))
    assert analysis._trace is not None and analysis._calls is None
    assert analysis.total() == 3 * 8 * 4


def test_a_module_with_hooks_is_traced() -> None:
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU())
    handle = model[1].register_forward_hook(lambda module, args, output: output * 2)
    try:
        analysis = _counts(model, (torch.randn(2, 8),))
        assert analysis._trace is not None and analysis.total() == 2 * 8 * 8
    finally:
        handle.remove()


class _Product(nn.Module):
    def forward(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return x @ weight


PRODUCT = _Product()
"""A function made a module once for every model, as the ``kernels`` package makes transformers
5.25's ``apply_rotary_pos_emb``: called by the model, not one of its modules."""


class _CallsAModuleOfNoModel(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.linear = nn.Linear(width, width)
        self.weight = nn.Parameter(torch.randn(width, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(PRODUCT(x, self.weight))


@pytest.mark.parametrize("width", [8, 1024], ids=["on its values", "on a meta copy"])
def test_a_module_that_is_none_of_the_models_is_counted_from_its_calls_in_its_callers_scope(width: int) -> None:
    """The tracer opens no scope for a module it has no name for: its product is the caller's, the
    model's root, as in the trace. Llama and every rotary model of transformers 5.25 were traced."""
    analysis = _same_as_the_trace(_CallsAModuleOfNoModel(width), (torch.randn(4, width),))
    assert analysis._trace is None, "counted from the calls, not traced"
    assert analysis.by_module()[""] == 2 * 4 * width * width and analysis.by_module()["linear"] == 4 * width * width


class _Branch(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.linear = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x) if x.sum() > 0 else x


@pytest.mark.parametrize("width", [8, 1024], ids=["on its values", "on a meta copy"])
def test_python_that_reads_the_inputs_values_is_traced_and_warned_about_as_before(width: int) -> None:
    with pytest.warns(Warning, match="control flow depends on tensor values"):
        analysis = _counts(_Branch(width), (torch.ones(128, width),))
    assert analysis._trace is not None and analysis.total() == 128 * width * width


class _Windows(nn.Module):
    """As transformers' Swin when it is traced: a window size made a tensor of constants, and padding
    sizes computed from it and read (``if pad_values[3] > 0``, ``int(...)``)."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.linear = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        window = torch.min(torch.tensor([7, 9])) if torch.jit.is_tracing() else 7
        pad = (window - x.shape[0] % window) % window
        if pad > 0:
            x = torch.nn.functional.pad(x, (0, 0, 0, int(pad)))
        return self.linear(x).view(-1, window, x.shape[-1])


def test_a_value_made_of_constants_is_read_on_a_meta_copy_as_the_trace_reads_it() -> None:
    """On a meta copy every tensor of the inputs and parameters is meta: one with values was made of
    constants and sizes, so reading it is shape arithmetic, taken (125 rows padded to 126)."""
    analysis = _same_as_the_trace(_Windows(1024), (torch.randn(125, 1024),))
    assert analysis._trace is None and analysis.total() == 126 * 1024 * 1024


def test_a_value_read_on_the_models_own_values_is_traced() -> None:
    """On its own values (a small call) a value read may be the inputs' data: the trace tells."""
    analysis = _same_as_the_trace(_Windows(8), (torch.randn(12, 8),))
    assert analysis._trace is not None and analysis.total() == 14 * 8 * 8


def test_a_counted_call_gives_the_node_the_tracer_records() -> None:
    """Each call of the counted table, alone in a model, against the JIT."""
    image, tokens = torch.randn(2, 4, 9, 9), torch.randn(2, 5, 8)
    cases: list[tuple[Callable[[torch.Tensor], torch.Tensor], torch.Tensor]] = [
        (nn.Conv1d(4, 6, 3, stride=2, padding=1), torch.randn(2, 4, 9)),
        (nn.Conv2d(4, 6, 3, stride=(2, 1), dilation=2, groups=2), image),
        (nn.Conv3d(4, 6, 2), torch.randn(1, 4, 5, 5, 5)),
        (nn.BatchNorm2d(4), image),
        (nn.LayerNorm(8), tokens),
        (nn.GroupNorm(2, 4), image),
        (nn.AdaptiveAvgPool1d(3), torch.randn(2, 4, 9)),
        (nn.AdaptiveAvgPool2d((None, 2)), image),
        (nn.MaxPool2d(3, 2), image),
        (lambda x: torch.nn.functional.scaled_dot_product_attention(x, x, x, is_causal=True), tokens),
        (lambda x: x @ x.transpose(-1, -2), tokens),
        (lambda x: torch.bmm(x, x.transpose(1, 2)), tokens),
        (lambda x: torch.addmm(x[0, :, 0], x[0], x[1].transpose(0, 1)), tokens),
    ]
    counted = {kind for kind, _ in COUNTED_CALLS.values()}
    for module, input in cases:
        model = module if isinstance(module, nn.Module) else _Only(module)
        if not isinstance(module, nn.Module):
            model.forward = lambda x, call=module: call(x)  # type: ignore[method-assign]
        analysis = _same_as_the_trace(model, (input,))
        assert analysis._trace is None, module
        assert set(analysis.by_operator()) and analysis.total() > 0
    assert "aten::_convolution" in counted


def test_a_training_forward_that_writes_its_buffers_leaves_the_model_as_it_was() -> None:
    """On the model's own values (a small call), the calls that write (a batch norm's running
    statistics in training, ``num_batches_tracked.add_``, an in-place activation) are copied before
    they write, and put back; nothing is left for a ``ModelChangedWarning``."""
    import warnings

    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(inplace=True), nn.Flatten(), nn.Linear(8 * 6 * 6, 4)).train()
    before = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        analysis = _same_as_the_trace(model, (torch.randn(2, 3, 8, 8),))
    assert analysis._trace is None
    assert all(torch.equal(before[name], tensor) for name, tensor in model.state_dict().items())


def test_a_model_that_refuses_copies_is_traced() -> None:
    """A parametrized module (weight norm, as transformers' VITS has) raises on ``copy.copy``: a count
    that would read a meta copy's calls traces it instead, with the trace's count."""
    model = nn.Sequential(nn.Conv2d(64, 64, 3), nn.ReLU())
    model[0] = nn.utils.parametrizations.weight_norm(model[0])
    analysis = _counts(model, (torch.randn(1, 64, 64, 64),))  # 1.5e8 parameter-pixels: a meta copy
    assert analysis._trace is not None and analysis.total() == 64 * 64 * 9 * 62 * 62
