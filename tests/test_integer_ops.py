"""Integer work of quantized models and integer products, counted as integer multiply-accumulates
(IOPs) apart from float MACs, against hand counts and the float model's count."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

from jitflops import FlopCountAnalysis, IntegerOpCountAnalysis, IntegerWorkWarning, JitFallbackWarning, flop_count_table, profile_model
from jitflops.reports.deepspeed_report import format_model_profile
from jitflops.reports.files import profile_to_dict


def _mlp() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8))


def test_a_dynamically_quantized_linear_counts_its_integer_macs_under_the_default_call():
    model = torch.ao.quantization.quantize_dynamic(_mlp(), {nn.Linear}, dtype=torch.qint8)
    x = torch.randn(4, 16)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        iops = IntegerOpCountAnalysis(model, x)
        flops = FlopCountAnalysis(model, x)
        assert iops.total() == 4 * (16 * 32 + 32 * 8)  # the float model's MACs, now integer
        assert flops.total() == 0 and not flops.unsupported_ops()  # never silently unsupported: known, zero FLOPs
    assert iops.counted_by == "dispatch" and "quantized" in iops.fallback_reason
    assert any(issubclass(w.category, JitFallbackWarning) for w in caught)
    assert iops.by_operator() == {"linear": 4 * (16 * 32 + 32 * 8)} and iops.total("2") == 4 * 32 * 8
    assert iops.uncalled_modules() == {"0._packed_params", "2._packed_params"}  # read by their Linear, never called

    profile = profile_model(model, x, timed=False)
    assert profile.summary.int_macs == 4 * (16 * 32 + 32 * 8) and profile.summary.macs == 0
    assert "fwd integer MACs per GPU (IOPs, apart from MACs):" in format_model_profile(profile)
    assert profile_to_dict(profile)["modules"][1]["int_macs"] == 4 * 16 * 32


class _StaticQuantNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.quant = torch.ao.quantization.QuantStub()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.grouped = nn.Conv2d(8, 8, 3, padding=1, groups=4)
        self.fc = nn.Linear(8 * 8 * 8, 10)
        self.dequant = torch.ao.quantization.DeQuantStub()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.grouped(self.conv(self.quant(x))))
        return self.dequant(self.fc(x.flatten(1)))


@pytest.mark.skipif("fbgemm" not in torch.backends.quantized.supported_engines, reason="no fbgemm engine")
def test_a_flop_count_of_integer_work_says_where_its_integer_macs_went():
    """The issue's case, fvcore's silent zero (and thop#202's): ``FlopCountAnalysis`` of a dynamically
    quantized Linear(64, 64) on 4 rows is 0 FLOPs, and its warning and convention line now name
    the 4 x 64 x 64 = 16,384 integer MACs and their module; a float model warns of none."""
    model = torch.ao.quantization.quantize_dynamic(nn.Sequential(nn.Linear(64, 64)), {nn.Linear}, dtype=torch.qint8)
    x = torch.randn(4, 64)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        flops = FlopCountAnalysis(model, x)
        assert flops.total() == 0
    said = [str(w.message) for w in caught if issubclass(w.category, IntegerWorkWarning)]
    assert len(said) == 1 and "16,384 integer MACs" in said[0] and "'0': 16,384" in said[0] and "IntegerOpCountAnalysis" in said[0]
    assert flops.integer_macs() == {"0": 16_384} == {"0": IntegerOpCountAnalysis(model, x).total("0")}
    assert "16,384 integer MACs left to IntegerOpCountAnalysis" in flop_count_table(flops)
    counted = FlopCountAnalysis(model, x).set_op_handle("quantized::linear_dynamic", lambda inputs, outputs: 1)
    assert not counted.integer_macs()  # a handle set for the op counts it: nothing left out
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert FlopCountAnalysis(_mlp(), torch.randn(4, 16)).total() == 4 * (16 * 32 + 32 * 8)
    assert not [w for w in caught if issubclass(w.category, IntegerWorkWarning)]


def test_statically_quantized_convolutions_and_linear_count_as_the_float_model():
    torch.manual_seed(0)
    float_model = _StaticQuantNet().eval()
    float_model.qconfig = torch.ao.quantization.get_default_qconfig("fbgemm")
    prepared = torch.ao.quantization.prepare(float_model)
    prepared(torch.randn(2, 3, 8, 8))
    quantized = torch.ao.quantization.convert(prepared)
    x = torch.randn(2, 3, 8, 8)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        iops = IntegerOpCountAnalysis(quantized, x)
        by_hand = 2 * 8 * 8 * (8 * 3 * 9 + 8 * 2 * 9) + 2 * 512 * 10  # conv, grouped conv (4 groups of 2 channels), fc
        assert iops.total() == by_hand == FlopCountAnalysis(_StaticQuantNet().eval(), x).total()
        assert iops.by_operator() == {"conv": 2 * 8 * 8 * (8 * 3 * 9 + 8 * 2 * 9), "linear": 2 * 512 * 10}
        assert FlopCountAnalysis(quantized, x).unsupported_ops() == {}


def test_integer_matrix_products():
    class Products(nn.Module):
        def forward(self, a, b, x, w8, scales, w4, scales_and_zeros):
            return (
                torch._int_mm(a, b),
                torch.ops.aten._weight_int8pack_mm(x, w8, scales),
                torch.ops.aten._weight_int4pack_mm_for_cpu(x, w4, 32, scales_and_zeros),
            )

    a, b = torch.randint(-8, 8, (32, 64), dtype=torch.int8), torch.randint(-8, 8, (64, 48), dtype=torch.int8)
    x = torch.randn(4, 64)
    w8, scales = torch.randint(-8, 8, (24, 64), dtype=torch.int8), torch.randn(24)
    w4 = torch._convert_weight_to_int4pack_for_cpu(torch.randint(0, 16, (48, 64), dtype=torch.int32), 1)
    scales_and_zeros = torch.randn(64 // 32, 48, 2)
    for backend in ("jit", "dispatch"):
        iops = IntegerOpCountAnalysis(Products(), (a, b, x, w8, scales, w4, scales_and_zeros), backend=backend)
        assert iops.by_operator() == {"int_mm": 32 * 64 * 48, "weight_int8pack_mm": 4 * 64 * 24, "weight_int4pack_mm": 4 * 64 * 48}, backend
        assert FlopCountAnalysis(Products(), (a, b, x, w8, scales, w4, scales_and_zeros), backend=backend).unsupported_ops() == {}


def test_torchao_int8_layers_count_as_integer_macs_and_weight_only_ones_as_float():
    """torchao's quantized tensors: int8 activations x int8 weights run ``_int_mm`` (integer MACs);
    weight-only int8 and int4 dequantize the weights and multiply in float (float MACs). The
    default call counts each (the JIT fails inside torch on the int8 x int8 tensors: dispatch) and
    leaves the quantized weights as they were."""
    quantization = pytest.importorskip("torchao.quantization")
    x = torch.randn(4, 64)
    macs = 4 * 64 * 32 + 4 * 32 * 16  # two Linears by hand
    for config, integer in (
        (quantization.Int8DynamicActivationInt8WeightConfig(), True),
        (quantization.Int8WeightOnlyConfig(), False),
        (quantization.IntxWeightOnlyConfig(weight_dtype=torch.int4), False),
    ):
        model = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 16))
        quantization.quantize_(model, config)
        weights = [parameter.dequantize().clone() for parameter in model.parameters() if parameter.dim() == 2]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            flops = FlopCountAnalysis(model, x)
            iops = IntegerOpCountAnalysis(model, x)
            assert (iops.total(), flops.total()) == ((macs, 0) if integer else (0, macs)), type(config).__name__
            assert flops.unsupported_ops() == {}
        assert flops.counted_by == ("dispatch" if integer else "jit")
        assert all(torch.equal(parameter.dequantize(), weight) for parameter, weight in zip((p for p in model.parameters() if p.dim() == 2), weights))
