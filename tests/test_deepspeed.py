"""DeepSpeed users switch with no surprises.

The first part is DeepSpeed's own profiler unit tests (``tests/unit/profiling/flops_profiler/`` in
DeepSpeed's repository, 0.19.8), with the engine replaced by a plain training loop and the
import changed. Where jitflops counts differently, the adaptation says so: DeepSpeed adds bias
adds and elementwise ops to its "flops"; jitflops' flops are 2 x MACs, plus elementwise flops
with ``elementwise=True`` (bias adds are never counted: fvcore's convention). The second part has
one test for each fault a switching user met.
"""

from __future__ import annotations

import json
import re
import warnings
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from jitflops import FlopCountAnalysis, FlopsProfiler, FlopsProfilerConfig, get_model_profile, get_module_duration, get_module_flops, get_module_macs
from jitflops.reports.file_output import OutputError
from jitflops.reports.formatting import deepspeed_macs, deepspeed_number, deepspeed_params, deepspeed_seconds

TOLERANCE = 0.05


def within_range(value: float, target: float, tolerance: float) -> bool:
    return abs(value - target) / target < tolerance


def _profile(model: nn.Module, *inputs: torch.Tensor, **settings) -> tuple[int, int, torch.Tensor]:
    profiler = FlopsProfiler(model, **settings)
    profiler.start_profile()
    result = model(*inputs)
    profiler.stop_profile()
    flops, macs = profiler.get_total_flops(), profiler.get_total_macs()
    profiler.end_profile()
    return flops, macs, result


# -- DeepSpeed's test_flops_profiler.py, adapted ------------------------------------------------


def test_repeated_profile_restores_operations():
    class AttentionModel(nn.Module):
        def forward(self, query, key, value):
            return nn.functional.scaled_dot_product_attention(query, key, value)

    model = AttentionModel()
    inputs = [torch.randn(2, 4, 16, 8) for _ in range(3)]
    originals = (nn.functional.scaled_dot_product_attention, torch.Tensor.__matmul__, torch.bmm)
    profiles = []
    prof = FlopsProfiler(model)
    for _ in range(3):
        prof.start_profile()
        model(*inputs)
        prof.stop_profile()
        profiles.append((prof.get_total_flops(), prof.get_total_macs()))
        prof.end_profile()
        assert (nn.functional.scaled_dot_product_attention, torch.Tensor.__matmul__, torch.bmm) == originals
    assert profiles == [(65536, 32768)] * 3


@pytest.mark.parametrize("groups", [1, 2, 4])
@pytest.mark.parametrize("stride, padding, output_padding", [(1, 0, 0), (2, 1, 1)])
def test_conv_transpose_flops(groups, stride, padding, output_padding):
    in_channels, out_channels, kernel_size = 4, 8, 3
    model = nn.ConvTranspose2d(in_channels, out_channels, kernel_size, stride=stride, padding=padding, output_padding=output_padding, groups=groups)
    inputs = torch.randn(2, in_channels, 8, 8)
    flops, macs, _ = _profile(model, inputs)
    input_elements = inputs.shape[0] * inputs[0, 0].numel()
    expected_macs = input_elements * in_channels * (out_channels // groups) * kernel_size * kernel_size
    assert macs == expected_macs
    assert flops == 2 * expected_macs  # DeepSpeed: + out_channels * output elements for the bias


def test_conv_transpose_flops_with_output_size():
    in_channels, out_channels, kernel_size = 4, 8, 3
    model = nn.ConvTranspose2d(in_channels, out_channels, kernel_size, stride=2, padding=1)
    inputs = torch.randn(2, in_channels, 8, 8)
    prof = FlopsProfiler(model)
    prof.start_profile()
    model(inputs, output_size=(2, out_channels, 16, 16))
    flops, macs = prof.get_total_flops(), prof.get_total_macs()
    prof.end_profile()
    expected_macs = inputs.shape[0] * inputs[0, 0].numel() * in_channels * out_channels * kernel_size * kernel_size
    assert macs == expected_macs and flops == 2 * expected_macs


class LeNet5(nn.Module):
    def __init__(self, n_classes: int) -> None:
        super().__init__()
        self.feature_extractor = nn.Sequential(
            nn.Conv2d(1, 6, kernel_size=5), nn.Tanh(), nn.AvgPool2d(kernel_size=2),
            nn.Conv2d(6, 16, kernel_size=5), nn.Tanh(), nn.AvgPool2d(kernel_size=2),
            nn.Conv2d(16, 120, kernel_size=5), nn.Tanh(),
        )
        self.classifier = nn.Sequential(nn.Linear(120, 84), nn.Tanh(), nn.Linear(84, n_classes))

    def forward(self, x):
        x = torch.flatten(self.feature_extractor(x), 1)
        logits = self.classifier(x)
        return logits, nn.functional.softmax(logits, dim=1)


class SimpleModel(nn.Module):
    """DeepSpeed's ``unit.simple_model.SimpleModel``: a linear layer and a cross-entropy loss."""

    def __init__(self, hidden_dim: int) -> None:
        super().__init__()
        self.linear = nn.Linear(hidden_dim, hidden_dim)
        self.cross_entropy_loss = nn.CrossEntropyLoss()

    def forward(self, x, y):
        return self.cross_entropy_loss(self.linear(x), y)


def test_flops_profiler_in_training_configured_by_a_deepspeed_config(capsys):
    """DeepSpeed's TestFlopsProfiler.test: the engine becomes a plain loop, the profiler comes from
    the same config (fp16 becomes float32: this runs on the CPU)."""
    config = {
        "train_batch_size": 1,
        "steps_per_print": 1,
        "optimizer": {"type": "Adam", "params": {"lr": 0.001}},
        "zero_optimization": {"stage": 0},
        "fp16": {"enabled": True},
        "flops_profiler": {"enabled": True, "profile_step": 1, "module_depth": -1, "top_modules": 3},
    }
    hidden_dim = 10
    model = SimpleModel(hidden_dim)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.001)
    profiler = FlopsProfiler.from_config(model, config)
    for n in range(4):
        loss = model(torch.randn(1, hidden_dim), torch.randint(0, hidden_dim, (1,)))
        loss.backward()
        optimizer.step()
        profiler.step()
    assert within_range(profiler.flops, 200, tolerance=TOLERANCE)
    assert profiler.params == 110
    printed = capsys.readouterr().out
    assert printed.count("Profile Summary at step 1:") == 1 and "Top 3 modules" in printed
    assert not hasattr(model, "__flops__") and not profiler.started


def test_flops_profiler_in_inference():
    flops, macs, params = get_model_profile(
        LeNet5(10), (1024, 1, 32, 32), print_profile=True, detailed=True, module_depth=-1, top_modules=3,
        warm_up=1, as_string=False, ignore_modules=None, repeats=1,
    )
    assert within_range(flops, 866076672, TOLERANCE)  # DeepSpeed's figure includes tanh, pooling, softmax and biases
    assert within_range(macs, 426516480, TOLERANCE)
    assert params == 61706
    assert flops == 2 * macs


def test_print_model_profile_with_none_dp_world_size(capsys):
    model = nn.Sequential(nn.Linear(128, 128))
    prof = FlopsProfiler(model)
    prof.ds_engine = SimpleNamespace(world_size=8, dp_world_size=None, seq_dp_world_size=4, mp_world_size=1, has_moe_layers=False,
                                     train_micro_batch_size_per_gpu=lambda: 1, wall_clock_breakdown=lambda: False)
    prof.start_profile()
    for _ in range(3):
        model(torch.randn(64, 128))
    prof.print_model_profile(profile_step=1, detailed=False)
    prof.end_profile()
    out = capsys.readouterr().out
    assert re.search(r"data parallel size:\s+(\S+)", out).group(1) == "4"
    assert re.search(r"world size:\s+(\S+)", out).group(1) == "8"
    assert re.search(r"batch size per GPU:\s+(\S+)", out).group(1) == "1"


@pytest.mark.parametrize("lhs_shape, rhs_shape", [((2, 3, 4), (4,)), ((4,), (2, 3, 4)), ((8,), (2, 8)), ((3, 4), (4,)), ((2, 3, 4), (2, 3, 4)), ((4, 1, 7), (1, 5, 7))])
def test_elementwise_broadcast_flops(lhs_shape, rhs_shape):
    class Elementwise(nn.Module):
        def forward(self, lhs, rhs):
            return torch.mul(lhs, rhs)

    flops, macs, result = _profile(Elementwise(), torch.randn(*lhs_shape), torch.randn(*rhs_shape), elementwise=True)
    assert flops == result.numel() and macs == 0  # counted with elementwise=True, as DeepSpeed always does


class Block(nn.Module):
    def __init__(self, linear: nn.Module) -> None:
        super().__init__()
        self.linear = linear

    def forward(self, x):
        return self.linear(x)


class SplitLinears(nn.Module):
    def __init__(self, shared: bool) -> None:
        super().__init__()
        shared_linear = nn.Linear(100, 100, bias=False)
        self.blocks = nn.ModuleList([Block(shared_linear if shared else nn.Linear(100, 100, bias=False)) for _ in range(3)])

    def forward(self, x):
        return tuple(block(part) for block, part in zip(self.blocks, torch.split(x, 100, dim=1)))


@pytest.mark.parametrize("shared", [True, False])
def test_flops_profiler_counts_shared_module_once(shared):
    flops, macs, params = get_model_profile(SplitLinears(shared).eval(), input_shape=(1, 300), print_profile=False, detailed=False, warm_up=1, as_string=False)
    assert (flops, macs, params) == (60000, 30000, 10000 if shared else 30000)


@pytest.mark.parametrize("bias", [True, False])
def test_linear_bias_flops(bias):
    flops, macs, _ = _profile(nn.Linear(8, 16, bias=bias), torch.randn(4, 8))
    assert macs == 4 * 8 * 16
    assert flops == 2 * macs  # DeepSpeed: + result.numel() with a bias


@pytest.mark.parametrize("lhs_shape, rhs_shape", [((8,), (8,)), ((4, 8), (8,)), ((8,), (8, 5)), ((4, 8), (8, 5)), ((3, 4, 8), (3, 8, 5)), ((2, 1, 4, 8), (3, 8, 5))])
def test_matmul_flops(lhs_shape, rhs_shape):
    class Matmul(nn.Module):
        def forward(self, lhs, rhs):
            return torch.matmul(lhs, rhs)

    flops, macs, result = _profile(Matmul(), torch.randn(*lhs_shape), torch.randn(*rhs_shape))
    assert macs == max(result.numel(), 1) * lhs_shape[-1] and flops == 2 * macs


@pytest.mark.parametrize("bias_shape", [(4, 5), (5,), (1, 5), (4, 1), (1,)])
def test_addmm_broadcast_bias_flops(bias_shape):
    class Addmm(nn.Module):
        def forward(self, bias, mat1, mat2):
            return torch.addmm(bias, mat1, mat2)

    flops, macs, _ = _profile(Addmm(), torch.randn(*bias_shape), torch.randn(4, 8), torch.randn(8, 5))
    assert macs == 4 * 8 * 5 and flops == 2 * macs  # DeepSpeed: + result.numel() for the added tensor


@pytest.mark.parametrize("bias_shape", [(2, 4, 5), (5,), (1, 1, 5), (4, 5)])
def test_baddbmm_broadcast_bias_flops(bias_shape):
    class Baddbmm(nn.Module):
        def forward(self, bias, batch1, batch2):
            return torch.baddbmm(bias, batch1, batch2)

    flops, macs, _ = _profile(Baddbmm(), torch.randn(*bias_shape), torch.randn(2, 4, 8), torch.randn(2, 8, 5))
    assert macs == 2 * 4 * 8 * 5 and flops == 2 * macs


# -- DeepSpeed's test_profile_cleanup.py, adapted -----------------------------------------------


class ProfileModel(nn.Module):
    def __init__(self, failure=None):
        super().__init__()
        self.linear = nn.Linear(4, 2, bias=False)
        self.failure = failure

    def forward(self, inputs):
        result = self.linear(inputs)
        if self.failure is not None:
            raise self.failure
        return result

    def generate(self, inputs):
        return self(inputs)


def _hooks(model):
    return [(dict(m._forward_pre_hooks), dict(m._forward_hooks)) for m in model.modules()]


@pytest.mark.parametrize("stage, use_kwargs", [("forward", False), ("forward", True), ("generate", False), ("generate", True), ("report", False)])
def test_model_profile_cleans_up_after_exception(stage, use_kwargs, tmp_path):
    failure = RuntimeError("measured inference failed")
    model = ProfileModel(None if stage == "report" else failure)
    inputs = torch.ones(1, 4)
    args, kwargs = ([], {"inputs": inputs}) if use_kwargs else ([inputs], {})
    user_handles = (model.register_forward_pre_hook(lambda module, args: None), model.linear.register_forward_hook(lambda module, args, result: None))
    original_hooks = _hooks(model)
    expected_error = OutputError if stage == "report" else RuntimeError  # DeepSpeed: IsADirectoryError
    with pytest.raises(expected_error) as caught:
        get_model_profile(model, args=args, kwargs=kwargs, mode="generate" if stage == "generate" else "forward", warm_up=0,
                          print_profile=stage == "report", output_file=str(tmp_path) if stage == "report" else None, as_string=False)
    if stage == "report":
        assert caught.value.path == str(tmp_path)
    else:
        assert caught.value is failure or failure.args[0] in str(caught.value)
    assert _hooks(model) == original_hooks
    assert not any(hasattr(m, a) for m in model.modules() for a in ("__flops__", "__macs__", "__params__", "__start_time__", "__duration__"))
    model.failure = None
    assert get_model_profile(model, args=[inputs], warm_up=0, print_profile=False, as_string=False) == (16, 8, 8)
    assert _hooks(model) == original_hooks
    for handle in user_handles:
        handle.remove()


@pytest.mark.parametrize("mode", ["forward", "generate"])
@pytest.mark.parametrize("use_kwargs", [False, True])
def test_model_profile_successful_counts_unchanged(mode, use_kwargs):
    model = ProfileModel()
    inputs = torch.ones(1, 4)
    args, kwargs = ([], {"inputs": inputs}) if use_kwargs else ([inputs], {})
    for _ in range(3):
        assert get_model_profile(model, args=args, kwargs=kwargs, mode=mode, warm_up=1, print_profile=False, as_string=False) == (16, 8, 8)


@pytest.mark.parametrize("mode", ["forward", "generate"])
def test_model_profile_string_return_unchanged(mode):
    result = get_model_profile(ProfileModel(), args=[torch.ones(1, 4)], mode=mode, warm_up=0, print_profile=False, as_string=True)
    assert result == ("16 ", "8 MACs", "8")  # DeepSpeed's number_to_string, macs_to_string, params_to_string


# -- the faults a switching user met ------------------------------------------------------------


def test_ds_engine_given_to_the_constructor():
    engine = SimpleNamespace(world_size=4, dp_world_size=2, mp_world_size=2, train_micro_batch_size_per_gpu=lambda: 8)
    profiler = FlopsProfiler(nn.Linear(4, 4), ds_engine=engine)
    profiler.start_profile()
    profiler.model(torch.randn(3, 4))
    summary = profiler.profile().summary
    profiler.end_profile()
    assert (summary.parallel.world, summary.parallel.data_parallel, summary.parallel.model_parallel, summary.batch_size) == (4, 2, 2, 8)


def test_every_forward_between_start_and_print_is_counted():
    model = nn.Linear(1024, 1024, bias=False)
    profiler = FlopsProfiler(model)
    profiler.start_profile()
    for _ in range(3):
        model(torch.randn(1, 1024))
    assert profiler.get_total_macs() == 3 * 1024 * 1024 == 3_145_728  # DeepSpeed's figure
    model(torch.randn(2, 1024))  # another shape: traced once more, counted as it ran
    summary = profiler.profile().summary
    assert summary.macs == 5 * 1024 * 1024 and summary.forwards == 4
    assert summary.forward.median == pytest.approx(profiler.get_total_duration())
    profiler.end_profile()


@pytest.mark.parametrize("model, ignore", [(nn.Sequential(nn.Embedding(100, 16)), None), (nn.Sequential(nn.Linear(16, 16)), [nn.Linear])])
def test_a_profile_without_macs_prints(model, ignore, capsys):
    inputs = torch.randint(0, 100, (2, 5)) if ignore is None else torch.randn(2, 16)
    profiler = FlopsProfiler(model)
    profiler.start_profile(ignore_list=ignore)
    model(inputs)
    profiler.print_model_profile()
    profiler.end_profile()
    out = capsys.readouterr().out
    assert re.search(r"^fwd MACs per GPU: +0 MACs$", out, re.M) and re.search(r"^fwd FLOPS per GPU = fwd flops per GPU / fwd latency: +0 FLOPS$", out, re.M)


class Stack(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(64, 64) for _ in range(3)])

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


def test_a_module_list_shows_its_childrens_latency(capsys):
    model = Stack()
    profiler = FlopsProfiler(model)
    profiler.start_profile()
    model(torch.randn(8, 64))
    root = profiler.profile().root
    layers = root.find("layers")
    assert layers.latency is not None and layers.latency.median == pytest.approx(sum(child.latency.median for child in layers.children))
    assert layers.flops_per_second == pytest.approx(layers.flops / layers.latency.median)
    assert get_module_duration(model.layers) == pytest.approx(layers.latency.median)
    profiler.print_model_profile()
    profiler.print_model_aggregated_profile(module_depth=1, top_modules=1)
    profiler.end_profile()
    out = capsys.readouterr().out
    module_list_line = re.search(r"\(layers\): ModuleList\(\n  (.*)", out).group(1)
    assert "N/A" not in module_list_line and " 0 s = 0% latency" not in module_list_line
    assert re.search(r"fwd latency - \{'ModuleList': '[\d.]+ [mu]?s'\}", out)


def test_generate_mode_counts_every_forward_of_generation():
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=100, n_positions=64)
    model = transformers.GPT2LMHeadModel(config).eval()
    ids = torch.randint(0, 100, (1, 6))
    settings = dict(max_new_tokens=3, do_sample=False, pad_token_id=0)
    flops, macs, params = get_model_profile(model, kwargs=dict(input_ids=ids, **settings), mode="generate", print_profile=False, as_string=False, warm_up=0)
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter, torch.no_grad():
        model.generate(input_ids=ids, **settings)
    # FlopCounterMode counts the products (addmm, mm) but neither the CPU attention kernel nor layer
    # norms: those by hand. 3 forwards: the prompt (6 tokens), then 1 token over 7 and 8 keys.
    attention = 2 * 2 * 16 * 2 * (6 * 6 + 1 * 7 + 1 * 8)  # layers x heads x head dim x (QK, AV) x queries x keys
    layer_norms = 5 * 5 * 32 * (6 + 1 + 1)  # fvcore's 5 per element, 5 norms of 32 features per token
    assert macs == counter.get_total_flops() // 2 + attention + layer_norms and flops == 2 * macs
    assert params == sum(p.numel() for p in model.parameters())


def test_recompute_fwd_factor_when_the_backward_is_not_measured(capsys):
    model = nn.Sequential(nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 1))
    profiler = FlopsProfiler(model, recompute_fwd_factor=1.0, measure_backward=False)
    profiler.start_profile()
    model(torch.randn(4, 32)).sum().backward()
    summary = profiler.profile().summary
    profiler.print_model_profile()
    profiler.end_profile()
    assert summary.backward_factor == 3.0 and summary.backward_flops == 3 * summary.flops
    out = capsys.readouterr().out
    assert "bwd FLOPS per GPU = 3 * fwd flops per GPU / bwd latency:" in out and "FLOPS per GPU = 4 * fwd flops per GPU / iter latency:" in out


def test_totals_are_zero_before_the_first_forward_and_per_module_figures_are_readable():
    model = Stack()
    profiler = FlopsProfiler(model)
    profiler.start_profile()
    assert (profiler.get_total_flops(), profiler.get_total_macs(), profiler.get_total_duration()) == (0, 0, 0.0)
    assert model.__flops__ == model.layers[0].__macs__ == 0 and model.layers[0].__params__ == 64 * 64 + 64
    model(torch.randn(8, 64))
    model(torch.randn(8, 64))
    assert model.layers[0].__macs__ == 2 * 8 * 64 * 64 and model.layers[0].__flops__ == 2 * model.layers[0].__macs__
    assert model.__macs__ == 0  # its own: everything is in the layers
    assert get_module_macs(model) == profiler.get_total_macs() == 3 * 2 * 8 * 64 * 64
    assert get_module_flops(model) == profiler.get_total_flops()
    assert model.layers[1].__duration__ > 0 and model.__params__ == sum(p.numel() for p in model.parameters())
    profiler.end_profile()
    assert not any(hasattr(m, a) for m in model.modules() for a in ("__flops__", "__macs__", "__params__", "__duration__"))


def test_input_shape_uses_the_models_dtype_and_device():
    model = nn.Sequential(nn.Linear(16, 16)).to(torch.bfloat16)
    flops, macs, params = get_model_profile(model, input_shape=(4, 16), print_profile=False, as_string=False, warm_up=0, repeats=1)
    assert macs == 4 * 16 * 16 and params == 16 * 16 + 16


@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_input_shape_on_a_model_of_token_ids_says_what_it_made(device):
    """``input_shape`` makes a floating input, as DeepSpeed's does (its ``torch.ones(()).new_empty``
    in the model's dtype), which an embedding refuses: the error names the embedding, and now says
    what ``input_shape`` made and how to pass token ids (``args``), on the CPU and on meta."""
    with torch.device(device):
        model = nn.Sequential(nn.Embedding(100, 16), nn.Linear(16, 16))
    with pytest.raises(Exception, match=r"module '0' \(Embedding\)") as raised:
        get_model_profile(model, input_shape=(2, 8), print_profile=False, warm_up=0, repeats=1)
    assert raised.value.__notes__ == ["input_shape made a random floating input of shape (2, 8), as DeepSpeed's does; a model that takes token ids "
                                      "takes them by args, e.g. args=[torch.randint(0, vocabulary, (2, 8))]"]
    ids = torch.randint(0, 100, (2, 8))
    assert get_model_profile(model, args=[ids], print_profile=False, as_string=False, warm_up=0, repeats=1)[1] == 2 * 8 * 16 * 16


def test_output_file_in_a_missing_directory(tmp_path):
    target = tmp_path / "new" / "deeper" / "profile.txt"
    get_model_profile(nn.Linear(4, 4), input_shape=(2, 4), output_file=str(target), warm_up=0, repeats=1)
    assert "DeepSpeed Flops Profiler" in target.read_text()


@pytest.mark.parametrize("value, number, params, macs, seconds", [
    (3_731_200_000, "3.73 G", "3.73 B", "3.73 GMACs", None),
    (38_600_000, "38.6 M", "38.6 M", "38.6 MMACs", None),
    (5514, "5.51 K", "5.51 K", "5.51 KMACs", None),
    (16, "16 ", "16", "16 MACs", None),
    (0.00123, None, None, None, "1.23 ms"),
    (0.0000042, None, None, None, "4.2 us"),
])
def test_as_string_is_deepspeeds_format(value, number, params, macs, seconds):
    if number is not None:
        assert (deepspeed_number(value), deepspeed_params(value), deepspeed_macs(value)) == (number, params, macs)
    else:
        assert deepspeed_seconds(value) == seconds


class TrainModeMatters(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(8, 8), nn.Dropout(0.5))
        self.frozen = nn.BatchNorm1d(8).eval()  # a submodule the user keeps in eval mode

    def forward(self, x):
        y = self.body(x)
        return self.frozen(y) if not self.training else y * 2


def test_get_model_profile_counts_in_eval_mode_and_restores_modes():
    model = TrainModeMatters().train()
    model.frozen.eval()
    x = torch.randn(4, 8)
    _, macs, _ = get_model_profile(model, args=[x], print_profile=False, as_string=False, warm_up=0, repeats=1)
    eval_macs = FlopCountAnalysis(TrainModeMatters().eval(), x).total()
    assert macs == eval_macs
    assert model.training and model.body.training and model.body[1].training and not model.frozen.training


def test_a_deepspeed_config_file_configures_the_schedule_and_printout(tmp_path):
    output = tmp_path / "profiles" / "step2.txt"
    config_file = tmp_path / "ds_config.json"
    config_file.write_text(json.dumps({"train_batch_size": 4, "flops_profiler": {
        "enabled": True, "profile_step": 2, "module_depth": 1, "top_modules": 2, "detailed": False, "output_file": str(output), "recompute_fwd_factor": 0.5}}))
    model = Stack()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    profiler = FlopsProfiler.from_config(model, str(config_file), measure_backward=False)
    assert profiler.recompute_fwd_factor == 0.5
    for step in range(4):
        assert profiler.started == (step == 2)
        model(torch.randn(2, 64)).sum().backward()
        optimizer.step()
        profiler.step()
    text = output.read_text()
    assert "Profile Summary at step 2:" in text and "Top 2 modules" in text and "depth 2:" not in text and "Detailed Profile" not in text
    assert "bwd FLOPS per GPU = 2.5 * fwd flops per GPU / bwd latency:" in text
    assert re.search(r"^fwd MACs per GPU: +24.58 KMACs$", text, re.M)  # one step: 3 x 2 x 64 x 64
    assert not hasattr(model, "__flops__")


def test_a_disabled_config_does_nothing_and_unknown_keys_are_named():
    with pytest.warns(UserWarning, match="unknown key 'step'.*did you mean 'profile_step'"):
        section = FlopsProfilerConfig.from_deepspeed({"flops_profiler": {"enabled": False, "step": 1}})
    assert section == FlopsProfilerConfig()
    model = Stack()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        profiler = FlopsProfiler.from_config(model, {"flops_profiler": {"enabled": False}})
    for _ in range(3):
        model(torch.randn(1, 64))
        profiler.step()
        assert not profiler.started
