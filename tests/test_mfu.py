"""MFU per model and per module, in every profile entry point and in the training loops people use.

MFU is achieved FLOP/s over the device's peak; with a given peak every figure can be checked
against the profile's own FLOPs and latency. The training callbacks' FLOPs per step are checked
against ``FlopCounterMode`` on the same forward and backward of an MLP (matmuls only, which it
counts exactly).
"""

from __future__ import annotations

import csv
import json
import re

import time

import pytest
import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from jitflops import FlopsProfiler, format_model_profile, get_model_profile, profile_model, profile_to_dict
from jitflops.examples import TinyTransformer
from jitflops.timing.peak_flops import cpu_peak_flops, gpu_peak_flops

PEAK = 2e12
IDS = torch.randint(0, 1000, (2, 16))


def test_profile_model_reports_mfu_for_the_model_and_each_module():
    """MFU counts the model's FLOPs: the dense count less what the causal mask discards."""
    profile = profile_model(TinyTransformer().eval(), IDS, repeats=3, peak_flops=PEAK)
    summary = profile.summary
    assert summary.masked_out_macs > 0  # causal attention
    assert summary.mfu == pytest.approx((summary.flops - 2 * summary.masked_out_macs) / summary.forward.median / PEAK)
    document = profile_to_dict(profile)
    assert document["summary"]["mfu"] == pytest.approx(summary.mfu) and document["summary"]["peak_flops"] == PEAK
    for module, node in zip(document["modules"], profile.root.walk()):
        assert module["mfu"] == (pytest.approx((node.flops - 2 * node.masked_out_macs) / node.latency.median / PEAK) if node.flops_per_second is not None else None)
    printed = format_model_profile(profile)
    assert re.search(rf"^MFU = model FLOPS \(masked-out attention left out\) per GPU / peak FLOPS per GPU: +{100 * summary.mfu:.2f}% of 2 TFLOPS$", printed, re.M)
    head = profile.root.find("head")  # no attention below: its MFU is its FLOP/s
    assert profile.module_mfu("head") == pytest.approx(head.flops_per_second / PEAK)
    assert f"{100 * head.flops_per_second / PEAK:.2f}% MFU" in printed


def test_the_training_loop_profiler_reports_the_mfu_of_forward_and_backward():
    model = TinyTransformer().train()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    profiler = FlopsProfiler(model, peak_flops=PEAK)
    profiler.start_profile()
    model(IDS).float().pow(2).mean().backward()
    optimizer.step()
    summary = profiler.profile().summary
    profiler.end_profile()
    seconds = summary.forward.median + summary.backward.median
    discarded = 3 * 2 * summary.masked_out_macs  # the forward's and the backward's (twice the forward's)
    assert summary.masked_out_macs > 0
    # the fused attention backward recomputes its scores: 2 layers x B·H·L·S·E, hardware work, not the model's
    assert summary.recompute_macs == 2 * 2 * 4 * 16 * 16 * 16
    assert summary.mfu == pytest.approx((summary.flops + summary.backward_flops - discarded) / seconds / PEAK)
    assert summary.hfu == pytest.approx((summary.flops + summary.backward_flops + 2 * summary.recompute_macs) / seconds / PEAK)


def test_get_model_profile_prints_mfu(capsys):
    get_model_profile(TinyTransformer(), args=[IDS], peak_flops=PEAK, detailed=False, warm_up=0, repeats=2)
    assert re.search(r"^MFU = model FLOPS \(masked-out attention left out\) per GPU / peak FLOPS per GPU: +[\d.]+% of 2 TFLOPS$", capsys.readouterr().out, re.M)


@pytest.mark.parametrize("name, dtype, tflops", [
    ("NVIDIA H100 80GB HBM3", torch.bfloat16, 989.5),
    ("NVIDIA H100 PCIe", torch.float16, 756.0),
    ("NVIDIA H100 NVL", torch.bfloat16, 835.5),
    ("NVIDIA A100-SXM4-80GB", torch.bfloat16, 312.0),
    ("NVIDIA L4", torch.float16, 121.0),
    ("AMD Instinct MI300X", torch.bfloat16, 1307.4),
    ("NVIDIA GeForce GTX 1080", torch.float16, None),
])
def test_gpu_peaks_come_from_the_datasheets(name, dtype, tflops):
    peak = gpu_peak_flops(name, dtype)
    assert (peak is None and tflops is None) or peak == pytest.approx(tflops * 1e12)


def test_float32_on_tensor_cores_uses_the_tf32_peak_when_torch_allows_it():
    allowed = torch.backends.cuda.matmul.allow_tf32
    try:
        torch.backends.cuda.matmul.allow_tf32 = True
        assert gpu_peak_flops("NVIDIA A100-SXM4-40GB", torch.float32) == pytest.approx(156e12)
        torch.backends.cuda.matmul.allow_tf32 = False
        assert gpu_peak_flops("NVIDIA A100-SXM4-40GB", torch.float32) == pytest.approx(19.5e12)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = allowed


def test_the_cpu_probe_is_measured_once_per_dtype():
    first = cpu_peak_flops(torch.float32, torch.get_num_threads())
    assert first > 1e8 and cpu_peak_flops(torch.float32, torch.get_num_threads()) == first
    assert profile_model(nn.Linear(64, 64), torch.randn(8, 64), repeats=1).summary.peak_flops == first


def test_the_cpu_probe_of_a_slow_dtype_stops_at_a_small_product(monkeypatch):
    """bfloat16 on a CPU without AVX-512 or AMX runs about 70 times slower than float32: a product of
    1024^3 took 2.3 s there, and profiling any bfloat16 model waited 14 s for its peak. Made slow here
    on any CPU: the probe stops growing once a product is slow."""
    sizes = []

    def slow_product(a, b):
        sizes.append(a.shape[0])
        time.sleep(0.06)
        return a @ b
    monkeypatch.setattr(torch, "mm", slow_product)
    started = time.perf_counter()
    peak = cpu_peak_flops.__wrapped__(torch.bfloat16, 1)
    assert set(sizes) == {256} and time.perf_counter() - started < 1.0
    assert peak == pytest.approx(2 * 256**3 / 0.06, rel=0.5)


class Mlp(nn.Module):
    """A model a Trainer accepts: keyword inputs, a dict with the loss out."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4))

    def forward(self, inputs, labels=None):
        logits = self.layers(inputs)
        return {"loss": nn.functional.cross_entropy(logits, labels), "logits": logits}


def _reference_step_flops(batch: int) -> int:
    model = Mlp()
    with FlopCounterMode(display=False) as counter:
        model(torch.randn(batch, 32), torch.randint(0, 4, (batch,)))["loss"].backward()
    return counter.get_total_flops()


def test_transformers_trainer_logs_flops_tflops_and_mfu_at_its_logging_steps(tmp_path):
    transformers = pytest.importorskip("transformers")
    from jitflops.integrations.transformers import FlopsCallback

    dataset = [{"inputs": torch.randn(32), "labels": torch.tensor(i % 4)} for i in range(64)]
    args = transformers.TrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=8, max_steps=6, logging_steps=3,
                                          report_to="none", use_cpu=True, save_strategy="no", disable_tqdm=True)
    trainer = transformers.Trainer(model=Mlp(), args=args, train_dataset=dataset)
    profiles = []
    callback = FlopsCallback(peak_flops=PEAK, schedule=torch.profiler.schedule(wait=1, warmup=0, active=1, repeat=2), on_ready=profiles.append).attach(trainer)
    counted = []
    original = callback.run.step_flops
    callback.run.step_flops = lambda *a, **k: counted.append(1) or original(*a, **k)
    trainer.train()
    logged = [entry for entry in trainer.state.log_history if "flops_per_step" in entry]
    assert [entry["step"] for entry in logged] == [3, 6]
    for entry in logged:
        assert entry["flops_per_step"] == _reference_step_flops(8)
        assert entry["mfu"] == pytest.approx(entry["tflops_per_s"] * 1e12 / PEAK)
    assert len(counted) == 2  # the logged steps only
    assert len(profiles) == 2 and all(p.summary.mfu is not None and p.summary.peak_flops == PEAK for p in profiles)


def test_the_trainers_mfu_leaves_out_what_gradient_checkpointing_recomputes_and_its_hfu_counts_it(tmp_path):
    """With ``gradient_checkpointing=True`` the backward runs each layer's forward again. The
    callback's ``flops_per_step`` and ``mfu`` counted it, so they were HFU, not MFU (PaLM's model
    FLOPs leave recomputation out; a profile's MFU did): 4.05e7 FLOPs a step for this Llama's
    3.26e7. The model's FLOPs are torch's ``FlopCounterMode`` of the step without checkpointing,
    plus the CPU's flash kernel, which it has no formula for (its forward, and its backward's two
    products per forward product); ``hfu`` adds the recomputation: ``FlopCounterMode`` of the
    checkpointed step, plus the flash kernel run twice forward and its backward's recompute of the scores."""
    transformers = pytest.importorskip("transformers")
    from jitflops.integrations.transformers import FlopsCallback

    config = transformers.LlamaConfig(num_hidden_layers=2, hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2, vocab_size=100)
    torch.manual_seed(0)
    ids = [torch.randint(0, 100, (16,)) for _ in range(16)]
    args = transformers.TrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=4, max_steps=2, logging_steps=2, report_to="none",
                                          use_cpu=True, save_strategy="no", disable_tqdm=True, gradient_checkpointing=True)
    trainer = transformers.Trainer(model=transformers.LlamaForCausalLM(config), args=args, train_dataset=[{"input_ids": x, "labels": x} for x in ids])
    FlopsCallback(peak_flops=PEAK).attach(trainer)
    trainer.train()
    (logged,) = [entry for entry in trainer.state.log_history if "flops_per_step" in entry]
    batch = torch.stack(ids[:4])
    counted = {}
    for checkpointed in (False, True):
        model = transformers.LlamaForCausalLM(config).train()
        if checkpointed:
            model.gradient_checkpointing_enable()
        with FlopCounterMode(display=False) as torch_count:
            model(input_ids=batch, labels=batch).loss.backward()
        counted[checkpointed] = torch_count.get_total_flops()
    attention = 2 * 2 * (2 * 4 * 4 * 16 * 16 * 16)  # FLOPs of 2 layers' two products of 4 sequences, 4 heads, 16 tokens, head width 16
    assert logged["flops_per_step"] == counted[False] + 3 * attention
    assert logged["hfu"] / logged["mfu"] == pytest.approx((counted[True] + 4.5 * attention) / (counted[False] + 3 * attention), rel=1e-9)
    assert logged["mfu"] == pytest.approx(logged["tflops_per_s"] * 1e12 / PEAK)


def test_lightning_logs_flops_tflops_and_mfu_through_its_logger(tmp_path):
    pl = pytest.importorskip("pytorch_lightning")
    from jitflops.integrations.lightning import FlopsCallback

    class Module(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.mlp = Mlp()

        def forward(self, inputs, labels):
            return self.mlp(inputs, labels)

        def training_step(self, batch, batch_idx):
            inputs, labels = batch
            loss = self(inputs, labels)["loss"]
            self.log("train_loss", loss)
            return loss

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    data = torch.utils.data.TensorDataset(torch.randn(64, 32), torch.randint(0, 4, (64,)))
    loader = torch.utils.data.DataLoader(data, batch_size=8)
    logger = pl.loggers.CSVLogger(str(tmp_path), name="run")
    profiles = []
    callback = FlopsCallback(peak_flops=PEAK, schedule=torch.profiler.schedule(wait=2, warmup=0, active=1, repeat=1), on_ready=profiles.append)
    trainer = pl.Trainer(max_steps=6, log_every_n_steps=3, logger=logger, callbacks=[callback], accelerator="cpu",
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(Module(), loader)
    rows = list(csv.DictReader(open(f"{logger.log_dir}/metrics.csv")))
    logged = [row for row in rows if row.get("flops_per_step")]
    assert [int(row["step"]) for row in logged] == [2, 5]  # Lightning's 0-based steps of batches 3 and 6
    for row in logged:
        assert float(row["flops_per_step"]) == _reference_step_flops(8)
        assert float(row["mfu"]) == pytest.approx(float(row["tflops_per_s"]) * 1e12 / PEAK)
    assert len(profiles) == 1 and profiles[0].summary.mfu is not None
    json.dumps(profile_to_dict(profiles[0]))
