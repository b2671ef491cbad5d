"""Copies eager code makes only to change a tensor's layout (``jitflops.estimates.costs.layout``):
which ops make them, held against what ``torch.profiler`` sees a real forward copy, and what they cost."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
import transformers

from jitflops.core.records import EagerOpRecord, TensorMeta
from jitflops.estimates.costs import kernel_seconds
from jitflops.estimates.costs.layout import LAYOUT_COPIES
from jitflops.estimates.devices import DeviceSpec
from jitflops.estimates.roofline import PredictedTimeAnalysis
from jitflops.timing.calibration.elementwise import KINDS, TRANSPOSED_WIDTH

LAYOUT_CHANGES = {"aten::contiguous", "aten::reshape", "aten::flatten", "aten::_convolution", "aten::layer_norm", "aten::native_layer_norm"}
"""The calls of a real forward whose ``clone`` is a layout copy, as the profiler names them."""


def _profiled_copies(model: torch.nn.Module, inputs: dict) -> int:
    """The ``clone`` calls a real forward makes below a layout change, as ``torch.profiler`` sees them."""
    with torch.no_grad(), torch.profiler.profile() as profile:
        model(**inputs)
    copies = 0
    for event in profile.events():
        parent = event.cpu_parent
        while event.name == "aten::clone" and parent is not None and parent.name not in LAYOUT_CHANGES:
            parent = parent.cpu_parent
        copies += event.name == "aten::clone" and parent is not None
    return copies


def _recorded_copies(model: torch.nn.Module, inputs: dict) -> Counter:
    """The layout copies the dispatch backend's recording of the same forward makes, by op kind."""
    trace = PredictedTimeAnalysis(model, (), inputs, device="h100", backend="dispatch").scoped_trace()
    copies: Counter = Counter()
    for kind, item in trace.operations():
        record = trace.record(item, kind, trace.scope_of(item))
        find = LAYOUT_COPIES.get(record.kind)
        copies[record.kind] += len(find(record)) if find is not None else 0
    return +copies


@pytest.mark.parametrize("name, config, image", [
    # Mix-FFN: a sequence viewed as an image (its batch stride below its rows'), so each depthwise
    # convolution copies its input, and each patch embedding's layer norm its transposed output
    ("segformer", lambda: transformers.SegformerConfig(num_encoder_blocks=2, depths=[2, 2], sr_ratios=[2, 1], hidden_sizes=[16, 32],
                                                       num_attention_heads=[1, 2], decoder_hidden_size=32), 64),
    # a permuted channels-last input read as it is; the downsampling convolutions copy their weights
    ("convnext", lambda: transformers.ConvNextConfig(num_stages=2, depths=[2, 2], hidden_sizes=[16, 32]), 64),
    ("swin", lambda: transformers.SwinConfig(image_size=64, embed_dim=16, depths=[2, 2], num_heads=[1, 2], window_size=4), 64),
])
def test_the_dispatch_recording_copies_what_a_real_forward_copies(name: str, config, image: int) -> None:
    torch.manual_seed(0)
    model = transformers.AutoModel.from_config(config()).eval()
    inputs = {"pixel_values": torch.randn(1, 3, image, image)}
    recorded = _recorded_copies(model, inputs)
    assert sum(recorded.values()) == _profiled_copies(model, inputs) > 0, recorded


def test_a_jit_trace_records_no_strides_and_so_no_layout_copies() -> None:
    """The JIT's meta copy lays out a convolution's output as the meta kernel does, not as the CPU
    does (ConvNeXt's depthwise outputs: contiguous, where the CPU's are channels-last), so its
    strides would invent copies: it records none. A prediction takes the dispatch backend's recording
    unless the JIT is asked for."""
    model = transformers.AutoModel.from_config(transformers.ConvNextConfig(num_stages=2, depths=[2, 2], hidden_sizes=[16, 32])).eval()
    trace = PredictedTimeAnalysis(model, (), {"pixel_values": torch.randn(1, 3, 64, 64)}, device="h100", backend="jit").scoped_trace()
    records = [trace.record(item, kind, trace.scope_of(item)) for kind, item in trace.operations()]
    assert all(getattr(value, "strides", None) is None for record in records for value in record.inputs)


def test_a_prediction_and_a_profile_price_a_models_layout_copies_by_default() -> None:
    """A prediction records the ops eager runs by the dispatch backend, unless the JIT is asked for:
    SegFormer's depthwise convolutions copy their inputs there, and the profile's prediction is the
    same recording's (its counts stay the JIT's)."""
    from jitflops import profile_model

    torch.manual_seed(0)
    model = transformers.AutoModel.from_config(transformers.SegformerConfig(num_encoder_blocks=2, depths=[2, 2], sr_ratios=[2, 1], hidden_sizes=[16, 32],
                                                                            num_attention_heads=[1, 2], decoder_hidden_size=32)).eval()
    inputs = {"pixel_values": torch.randn(1, 3, 64, 64)}
    default = PredictedTimeAnalysis(model, (), inputs, device=_spec())
    jit = PredictedTimeAnalysis(model, (), inputs, device=_spec(), backend="jit")
    assert default.counted_by == "dispatch" and jit.counted_by == "jit"
    assert default.total() > jit.total()  # the copies the JIT's meta copy cannot see
    profile = profile_model(model, (), inputs, timed=False, device=_spec())
    assert profile.summary.counted_by == "jit" and profile.root.predicted_s == pytest.approx(default.total())


def _spec() -> DeviceSpec:
    per_element = ((1000.0, 1e-6), (1e9, 1.0))
    return DeviceSpec("cpu (test)", {"float32": 1e11}, 1e10, kernel_curves={"copy": per_element, "transpose": ((1000.0, 5e-6), (1e9, 5.0))},
                      host_s={"op": 4e-6, "view": 2e-6, "scalar": 1e-6, "module": 3e-6, "backward": 1e-6})


def _strided(shape: tuple[int, ...], strides: tuple[int, ...]) -> TensorMeta:
    return TensorMeta(shape, torch.float32, strides=strides)


def test_a_layout_copy_is_a_transposition_where_its_innermost_dimension_is_strided() -> None:
    spec = _spec()
    transposed = _strided((1, 128, 4096), (524288, 1, 128))  # (1, 4096, 128).transpose(1, 2)
    heads = _strided((1, 128, 8, 64), (65536, 64, 8192, 1))  # (1, 8, 128, 64).transpose(1, 2): rows of 64 moved whole
    elements = 128 * 4096

    def cost(kind: str, source: TensorMeta, names: list, *rest: object) -> float:
        return kernel_seconds(EagerOpRecord(kind, [source, *rest], [TensorMeta(source.shape, torch.float32)], names), spec, 0.0, 0.0)

    # contiguous() and a copying reshape as the dispatch backend records them: a clone to the contiguous format, which the bytes leave out
    assert cost("aten::clone", transposed, ["self", "memory_format"], torch.contiguous_format) == pytest.approx(5e-9 * elements)
    assert cost("aten::clone", heads, ["self", "memory_format"], torch.contiguous_format) == pytest.approx(1e-9 * 128 * 8 * 64)
    assert cost("aten::clone", TensorMeta((1, 128, 4096), torch.float32), ["self", "memory_format"], torch.contiguous_format) == 0.0  # no strides recorded (meta)
    datasheet = DeviceSpec("gpu (test)", {"float32": 1e12}, 1e12, memory_efficiency=0.5, launch_s=2e-6)  # no curves: the roofline of its bytes
    clone = EagerOpRecord("aten::clone", [transposed, torch.contiguous_format], [TensorMeta(transposed.shape, torch.float32)], ["self", "memory_format"])
    assert kernel_seconds(clone, datasheet, 0.0, 0.0) == pytest.approx(2 * 4 * elements / 0.5e12 + 2e-6)
    norm = EagerOpRecord("aten::native_layer_norm", [transposed, [4096], None, None, 1e-5], [TensorMeta((1, 128, 4096), torch.float32)],
                         ["input", "normalized_shape", "weight", "bias", "eps"])
    assert kernel_seconds(norm, spec, 0.0, 0.0) == pytest.approx(5e-9 * elements)
    # a convolution of a sequence viewed as an image: its size-1 batch's stride makes torch suggest the contiguous format
    image = _strided((1, 128, 64, 64), (128, 1, 8192, 128))
    weight = _strided((128, 1, 3, 3), (9, 9, 3, 1))
    convolution = EagerOpRecord("aten::convolution", [image, weight, None], [TensorMeta((1, 128, 64, 64), torch.float32)], ["input", "weight", "bias"])
    assert kernel_seconds(convolution, spec, 0.0, 0.0) == pytest.approx(5e-9 * elements)
    permuted = EagerOpRecord("aten::convolution", [_strided((1, 128, 64, 64), (524288, 1, 8192, 128)), weight, None],
                             [TensorMeta((1, 128, 64, 64), torch.float32)], ["input", "weight", "bias"])
    assert kernel_seconds(permuted, spec, 0.0, 0.0) == 0.0  # a permuted channels-last image: read as it is


def test_calibration_times_a_transposition_to_the_contiguous_layout() -> None:
    x = torch.arange(4 * TRANSPOSED_WIDTH, dtype=torch.float32)
    copied = KINDS["transpose"](x, x)
    assert copied.is_contiguous() and torch.equal(copied, x.view(1, 4, TRANSPOSED_WIDTH).transpose(1, 2))
