"""The predicted time's measured error on this machine, in rounds: the forward, the training step, generation.

Each round calibrates the machine afresh (``jitflops calibrate``, run as a command in a process of
its own, within its budget), then measures, against
the prediction on that round's spec:

- every model of the zoo's forward (real weights, its zoo inputs, ``no_grad``), timed interleaved
  with the others (``--repeats`` turns of the models, half before the calibration and half after it
  and :data:`SETTLE_S` seconds: a
  slow stretch of the shared machine falls on every model a little, and on both sides of the
  calibration; in each turn a model's forward right after another model's, then one right after
  its own, the one the error is of: a loop over batches, which the prediction prices; before
  2026-11-29 the first alone), and per leaf module, among those covering 80% of the measured time,
  the timed pass's error (``profile_model``, in blocks of 3 passes, the models in turn), and their
  noise floor (the same leaves' times in two blocks apart);
- the zoo's transformers' training step (forward, backward, an AdamW step: the median of
  ``--steps`` steady steps) against ``predict_training_step``, after the forwards' rounds, in as
  many rounds each calibrated afresh, each step in a process of its own while this one holds none
  of the zoo (:func:`training_rounds`; before 2026-12-06, in this process among the forwards);
- the zoo's decoders' ``generate()`` (32 new tokens from 128, greedy): the prefill's forward and the
  mean decode step's (each forward timed by hooks) against ``predict_generation``, and
  ``generate``'s own work a token outside the model's calls against its ``own_s``;
- with ``--compiled``, every model's forward under ``torch.compile`` (compiled once, before the
  rounds; timed interleaved with the others after the eager forwards) against ``mode="compiled"``.

``--outside`` measures the forwards of 22 architectures outside the zoo instead (:data:`OUTSIDE`:
transformers' text, vision and speech encoders and decoders, each built from its config's defaults
or a small stated shape, with random weights), none of which was looked at while the cost model was
built: the predictions' error on models it was not tuned on.

This machine is a Firecracker VM with free page reporting (``page_reporting_order=11``): a free
block of 8 MiB or more is handed back to the host about 2 s after it is freed, and the first
write to it afterwards faults on the host, at 0.75 GB/s here (16 GiB written once took 21.5 s, and
as long again 10 minutes later). A tensor larger than glibc's mmap threshold (32 MiB) is such a
block each time it is made: AdamW's square root and division of GPT-2's 154 MB embedding write two
of them per step, and the optimizer's step took 314 to 1,634 ms in six steps in a row, by whether
the last step's were handed back yet. The cost model prices a fresh output as ``jitflops
calibrate`` measures it, made again at once (its pages not handed back).

A figure's error is its median over the rounds, with its spread (the smallest and largest round's);
the noise floor is the same forward timed in two rounds (the median over models of their relative
difference), and each round reads the cores other processes kept busy during its forwards
(:mod:`jitflops.timing.machine_load`): a sweep at work beside it (1.4 cores) made Llama GQA's
decode step take 6 to 16 ms against 1.6, and Python's time per instruction 1.7 to 2.1 times its
own (2026-12-07), so a round with a reading much above 0 measured a shared machine. No
constant of the prediction is fitted to any model: every figure comes from the
calibration. Prints the tables ``docs/benchmarks.md`` keeps and writes the figures as JSON.

    python tools/time_accuracy.py                          # 3 rounds, everything (about 14 minutes on 2 cores)
    python tools/time_accuracy.py --rounds 1 --models bert-base --no-training --no-generation
    python tools/time_accuracy.py --compiled                # and torch.compile's forwards (about 3 minutes more)
    python tools/time_accuracy.py --outside --no-modules --json tools/time_outside_results.json  # 22 models outside the zoo (about 5 minutes)
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import logging
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any, Callable

import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from jitflops import profile_model  # noqa: E402
from jitflops.estimates.devices import DeviceSpec, device_spec  # noqa: E402
from jitflops.estimates.generation_time import predict_generation  # noqa: E402
from jitflops.estimates.roofline import PredictedTimeAnalysis  # noqa: E402
from jitflops.estimates.training_step_time import predict_training_step  # noqa: E402
from jitflops.timing.machine_load import OtherLoad  # noqa: E402
from jitflops.timing.timed_pass import faults_since, minor_faults  # noqa: E402
from jitflops.examples import ZOO, Example, llama_config  # noqa: E402
from jitflops.examples import _config, _ids, _image, _positional, _transformers_example  # noqa: E402  (the zoo's own builders)

MODELS = [name for name, example in ZOO.items() if "zoo" in example.tags]
TRANSFORMERS = ["bert-base", "gpt2", "t5-small", "llama-gqa"]
DECODERS = ["gpt2", "llama-gqa"]
STUDIED = ("bert-base", "gpt2", "resnet-50", "mobilenet-v2")
"""The models profiled op family by op family while the families of the cost model were chosen;
the others were not looked at before they were measured (the held-out half)."""
COVERED = 0.8
MODULE_REPEATS = 9  # timed passes per module measurement: with 3, one slow second of a shared VM moved a
                    # round's leaf median by 20 points (T5-small 6% to 27%, 2026-12-06)
MODULE_BLOCKS = 3   # in blocks of 3 passes, the models in turn (:func:`module_errors`)


def _whisper_encoder() -> torch.nn.Module:
    import transformers

    return transformers.WhisperModel(transformers.WhisperConfig()).encoder


def _text(tokens: int) -> Callable[[], tuple[tuple[Any, ...], dict[str, Any]]]:
    return _positional(lambda: _ids(tokens))


_IMAGE, _IMAGE_256 = _positional(_image), _positional(lambda: _image(256))

OUTSIDE: dict[str, Example] = {example.name: example for example in (
    _transformers_example("distilbert", "DistilBertModel", _config("DistilBertConfig"), _text(128), "", "outside"),
    _transformers_example("roberta-base", "RobertaModel", _config("RobertaConfig"), _text(128), "", "outside"),
    _transformers_example("albert-base", "AlbertModel", _config("AlbertConfig", hidden_size=768, num_attention_heads=12, intermediate_size=3072), _text(128), "", "outside"),
    _transformers_example("electra-small", "ElectraModel", _config("ElectraConfig"), _text(256), "", "outside"),
    _transformers_example("opt-125m", "OPTModel", _config("OPTConfig"), _text(256), "", "outside"),
    _transformers_example("gpt-neox-6l", "GPTNeoXModel", _config("GPTNeoXConfig", hidden_size=512, num_hidden_layers=6, num_attention_heads=8, intermediate_size=2048),
                          _text(256), "", "outside"),
    _transformers_example("qwen2-4l", "Qwen2Model", _config("Qwen2Config", hidden_size=512, intermediate_size=1408, num_hidden_layers=4, num_attention_heads=8,
                                                             num_key_value_heads=2, vocab_size=2000), _text(256), "", "outside"),
    _transformers_example("deit-s", "DeiTModel", _config("DeiTConfig", hidden_size=384, num_attention_heads=6, intermediate_size=1536), _IMAGE, "", "outside"),
    _transformers_example("beit-b", "BeitModel", _config("BeitConfig"), _IMAGE, "", "outside"),
    _transformers_example("dinov2-s", "Dinov2Model", _config("Dinov2Config", hidden_size=384, num_attention_heads=6), _IMAGE, "", "outside"),
    _transformers_example("clip-vit-b32", "CLIPVisionModel", _config("CLIPVisionConfig"), _IMAGE, "", "outside"),
    _transformers_example("convnextv2-t", "ConvNextV2Model", _config("ConvNextV2Config"), _IMAGE, "", "outside"),
    _transformers_example("swinv2-t", "Swinv2Model", _config("Swinv2Config"), _IMAGE_256, "", "outside"),
    _transformers_example("regnet", "RegNetModel", _config("RegNetConfig"), _IMAGE, "", "outside"),
    _transformers_example("efficientnet-b0", "EfficientNetModel", _config("EfficientNetConfig"), _IMAGE, "", "outside"),
    _transformers_example("mobilevit-s", "MobileViTModel", _config("MobileViTConfig"), _IMAGE_256, "", "outside"),
    _transformers_example("segformer-b0", "SegformerModel", _config("SegformerConfig"), _IMAGE, "", "outside"),
    _transformers_example("levit-128s", "LevitModel", _config("LevitConfig"), _IMAGE, "", "outside"),
    _transformers_example("poolformer-s12", "PoolFormerModel", _config("PoolFormerConfig"), _IMAGE, "", "outside"),
    _transformers_example("resnet-18", "ResNetModel", _config("ResNetConfig", layer_type="basic", depths=[2, 2, 2, 2], hidden_sizes=[64, 128, 256, 512]), _IMAGE, "",
                          "outside"),
    Example("whisper-encoder", _whisper_encoder, _positional(lambda: torch.randn(1, 80, 3000)), "", frozenset({"transformers", "outside"})),
    _transformers_example("wav2vec2-base", "Wav2Vec2Model", _config("Wav2Vec2Config"), _positional(lambda: torch.randn(1, 16000)), "", "outside"),
)}
"""Models outside the zoo, never looked at while the cost model was built (``--outside``): each
transformers class's config defaults where a forward takes well under a second on 2 cores, else the
stated smaller shape; one sequence of 128 or 256 tokens, one 224 x 224 image (256 where the model
expects it), 30 s of Whisper's log-mel frames, 1 s of 16 kHz audio."""


def instantiate(name: str) -> tuple[torch.nn.Module, tuple, dict]:
    return {**ZOO, **OUTSIDE}[name].instantiate("cpu")
PROMPT, NEW_TOKENS = 128, 32


def _loss(output: Any) -> torch.Tensor:
    loss = getattr(output, "loss", None)
    if loss is not None:
        return loss
    values = output.values() if hasattr(output, "values") else [output]
    return sum(value.float().sum() for value in values if isinstance(value, torch.Tensor) and value.is_floating_point())


Timings = dict[str, list[float]]


def forwards(models: dict[str, tuple[torch.nn.Module, tuple, dict]], repeats: int) -> tuple[Timings, Timings, Timings]:
    """Each model's forwards, the models in turn: in each turn, a model's forward right after the
    model before it's, then one right after its own, as a loop over batches runs it. The first kind, then
    the second, then the minor page faults of the second (fresh pages: what the timed pass counts,
    :mod:`jitflops.timing.timed_pass`). Llama GQA's (14 MB of weights) took 16.2 ms after another
    model's and 13.4 right after its own, MobileNetV2's 13.9 and 11.9; BERT-base's and GPT-2's
    within 1% (2026-11-29)."""
    in_turn: Timings = {name: [] for name in models}
    after_own: Timings = {name: [] for name in models}
    faults: Timings = {name: [] for name in models}
    with torch.no_grad():
        for name, (model, args, kwargs) in models.items():
            model(*args, **kwargs)
        for _ in range(repeats):
            for name, (model, args, kwargs) in models.items():
                for samples in (in_turn, after_own):
                    faulted = minor_faults()
                    started = time.perf_counter()
                    model(*args, **kwargs)
                    samples[name].append(time.perf_counter() - started)
                faults[name].append(float(faults_since(faulted) or 0))
    return in_turn, after_own, faults


def module_errors(models: dict[str, tuple[torch.nn.Module, tuple, dict]], spec: DeviceSpec) -> dict[str, dict[str, Any]]:
    """Each model's timed pass's leaf modules covering 80% of the measured time: their median
    absolute error, their median error, the worst, and their noise floor (the median over them of
    the first two blocks' times apart: a leaf's error below it is the machine's as much as the
    prediction's). The passes are timed in :data:`MODULE_BLOCKS`
    blocks of a model's, the models in turn, and a leaf's time is the median of its blocks': run J
    (2026-12-06), each model's 9 passes in one block, gave T5-small's leaves a median error of 47%,
    8%, 33%, 7% and 41% by round, where its forward's, timed in turn with the others', was -13% to
    +22%."""
    blocks: dict[str, list[Any]] = {name: [] for name in models}
    for _ in range(MODULE_BLOCKS):
        for name, (model, args, kwargs) in models.items():
            blocks[name].append(profile_model(model, args, kwargs, repeats=MODULE_REPEATS // MODULE_BLOCKS, device=spec))
    return {name: _leaf_errors(profiles) for name, profiles in blocks.items()}


def _leaf_errors(profiles: list[Any]) -> dict[str, Any]:
    timed: dict[str, list[float]] = {}
    predicted: dict[str, float] = {}
    for profile in profiles:
        for node in profile.root.walk():
            if not node.children and node.predicted_to_measured is not None:
                timed.setdefault(node.name, []).append(node.latency.median)
                predicted[node.name] = node.predicted_s
    times = {name: statistics.median(values) for name, values in timed.items()}
    total, covered, errors = sum(times.values()), 0.0, []
    for name in sorted(times, key=lambda name: -times[name]):
        if covered >= COVERED * total:
            break
        covered += times[name]
        errors.append((name, predicted[name] / times[name] - 1))
    blocks_apart = [abs(timed[name][1] / timed[name][0] - 1) for name, _ in errors if len(timed[name]) > 1]
    return {"modules": len(errors), "noise_floor": statistics.median(blocks_apart) if blocks_apart else None,
            "median_abs_error": statistics.median(abs(error) for _, error in errors) if errors else None,
            "median_error": statistics.median(error for _, error in errors) if errors else None,
            "worst": max(errors, key=lambda item: abs(item[1])) if errors else None}


def training_step(model: torch.nn.Module, args: tuple, kwargs: dict, steps: int) -> tuple[float, float]:
    """The median of ``steps`` steady AdamW steps (after one that makes the optimizer's state), and
    of the pages each step faulted in: a block over 32 MiB (BERT-base's word embeddings' gradient,
    AdamW's temporaries of them) is mapped afresh at a step, unless the heap holds a free block that
    large, and the prediction prices its pages (``host_s["page"]``); blocks under it fault where
    glibc has trimmed its heap, which is priced nowhere."""
    model.train()
    optimizer = torch.optim.AdamW(model.parameters())
    times, faults = [], []
    for index in range(steps + 1):
        faulted = minor_faults()
        started = time.perf_counter()
        _loss(model(*args, **kwargs)).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if index:
            times.append(time.perf_counter() - started)
            faults.append(float(faults_since(faulted) or 0))
    model.eval()
    return statistics.median(times), statistics.median(faults)


def training_step_alone(name: str, steps: int) -> tuple[float, float]:
    """:func:`training_step` of the zoo's ``name`` in a process of its own, as a user trains a
    model: its heap its own, not one holding the freed memory of nine models and their passes. In
    run M (2026-12-06) GPT-2's step took 2.0 to 2.6 s by round in this process among the forwards,
    and 1.6 to 1.8 s in a process of its own right after (what else holds memory meanwhile:
    :func:`training_rounds`)."""
    done = subprocess.run([sys.executable, __file__, "--training-step-of", name, "--steps", str(steps)], check=True, cwd=REPO, capture_output=True, text=True)
    measured = json.loads(done.stdout.splitlines()[-1])
    return measured["step_s"], measured["page_faults"]


def decoder(name: str) -> torch.nn.Module:
    import transformers

    torch.manual_seed(0)
    if name == "gpt2":
        return transformers.GPT2LMHeadModel(transformers.GPT2Config()).eval()
    return transformers.LlamaForCausalLM(llama_config(256, 2, 8, 2, 688, vocab=1000)).eval()


def generation(model: torch.nn.Module, ids: torch.Tensor, runs: int = 3) -> tuple[float, float, float]:
    """The prefill's forward, the mean decode step's, each timed by hooks, and ``generate``'s own
    work a new token (its time outside the model's calls: logits processing, stopping criteria, the
    next call's inputs), medians of ``runs`` generations. The prompt's mask is given
    (no padding): without one, ``generate`` masks every position holding the pad token (the random
    prompt's zeros), and transformers' attention then reads a padding mask and folds a grouped-query
    model's heads into query positions (Llama GQA's decode step 200 ops against 168, until 2026-11-29)."""
    times: list[float] = []
    started: list[float] = []
    pre = model.register_forward_pre_hook(lambda module, args: started.append(time.perf_counter()))
    post = model.register_forward_hook(lambda module, args, output: times.append(time.perf_counter() - started[-1]))
    per_run = []
    try:
        for _ in range(runs + 1):
            times.clear()
            begun = time.perf_counter()
            with torch.no_grad():
                model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=0)
            outside = (time.perf_counter() - begun - sum(times)) / NEW_TOKENS
            per_run.append((times[0], statistics.mean(times[1:]), outside))
    finally:
        pre.remove()
        post.remove()
    per_run = per_run[1:]
    return tuple(statistics.median(run[part] for run in per_run) for part in range(3))  # type: ignore[return-value]


def calibrated(*options: str) -> DeviceSpec:
    """A spec ``jitflops calibrate`` measures (with the command's ``options``) in a process of its
    own, as a user runs it: not in this one, whose allocator holds the freed memory of nine models
    (a fresh tensor of 16 Mi elements takes 5 ms here and 25 ms in a new process, where its pages are
    faulted in, as they are in a training step's backward and AdamW's temporaries)."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder, "spec.json")
        subprocess.run([sys.executable, "-m", "jitflops", "calibrate", "--output", str(path), *options], check=True, cwd=REPO, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
        return device_spec(str(path))


SETTLE_S = 10.0
"""Seconds to wait after a calibration before timing: the process it ran in hands hundreds of MiB
back as it ends, and this VM's host takes them back over the next seconds. A two-layer Llama's
decode step took 2.0 to 2.4 ms for 7 s after ``jitflops calibrate``'s process ended, and 1.4 to
1.5 ms from 8 s on (2026-12-07); timed at once, a round's steps after the calibration came out 1.5
times those before it."""


def settle() -> None:
    time.sleep(SETTLE_S)


def summary(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "low": min(values), "high": max(values)}


def run_rounds(options: argparse.Namespace) -> dict[str, Any]:
    models = {name: instantiate(name) for name in options.models}
    decoders = {name: decoder(name) for name in DECODERS if name in options.models and options.generation}
    prompt = torch.randint(0, 1000, (1, PROMPT), generator=torch.Generator().manual_seed(0))
    compiled = {name: (torch.compile(model), args, kwargs) for name, (model, args, kwargs) in models.items()} if options.compiled else {}
    forwards(compiled, 0)  # each compiled at its first call
    rounds = []
    for index in range(options.rounds):
        with OtherLoad() as load_before:
            before = forwards(models, (options.repeats + 1) // 2)  # the forwards on both sides of the calibration: a shared
        started = time.perf_counter()                              # machine's speed drifts within a minute
        spec = calibrated()
        calibration_s = time.perf_counter() - started
        settle()
        with OtherLoad() as load_after:
            after = forwards(models, options.repeats // 2 + 1)
        other_cores = max((load.cores for load in (load_before, load_after) if load.cores is not None), default=None)
        measured = {name: statistics.median(before[1][name] + after[1][name]) for name in models}
        in_turn = {name: statistics.median(before[0][name] + after[0][name]) for name in models}
        faults = {name: statistics.median(before[2][name] + after[2][name]) for name in models}
        compiled_s = {name: statistics.median(times) for name, times in forwards(compiled, options.repeats)[1].items()}
        row: dict[str, Any] = {"calibration_s": calibration_s, "other_cores": other_cores, "device": json.loads(spec.to_json()), "forward": {}, "training": {}, "generation": {}, "compiled": {}}
        for name, (model, args, kwargs) in models.items():
            eager = PredictedTimeAnalysis(model, args, kwargs, device=spec).unsupported_ops_warnings(False).uncalled_modules_warnings(False)
            predicted = eager.total()
            row["forward"][name] = {"measured_s": measured[name], "predicted_s": predicted, "error": predicted / measured[name] - 1,
                                    "measured_in_turn_s": in_turn[name], "error_in_turn": predicted / in_turn[name] - 1,
                                    "page_faults": faults[name]}
            if compiled:  # the same recording, priced in the compiled mode
                fused = eager.of_same_recording(PredictedTimeAnalysis, device=spec, mode="compiled").total()
                row["compiled"][name] = {"measured_s": compiled_s[name], "predicted_s": fused, "error": fused / compiled_s[name] - 1}
        if options.modules:
            for name, errors in module_errors(models, spec).items():
                row["forward"][name]["modules"] = errors
        for name, model in decoders.items():
            predicted = predict_generation(model, prompt, NEW_TOKENS, device=spec)
            prefill, decode, own = generation(model, prompt)
            predicted_own = predicted.own_s / NEW_TOKENS if predicted.own_s is not None else float("nan")
            row["generation"][name] = {"generate_own_s": own, "predicted_generate_own_s": predicted_own, "generate_own_error": predicted_own / own - 1,
                                       "prefill_s": prefill, "predicted_prefill_s": predicted.prefill_s, "prefill_error": predicted.prefill_s / prefill - 1,
                                       "decode_s": decode, "predicted_decode_s": predicted.decode_s, "decode_error": predicted.decode_s / decode - 1}
        rounds.append(row)
        load = "" if other_cores is None else f", other processes kept {other_cores:.2f} cores busy during the forwards"
        print(f"round {index + 1}: calibrated in {calibration_s:.1f} s{load}; " + ", ".join(f"{name} {value['error']:+.0%}" for name, value in row["forward"].items()), flush=True)
    return {"rounds": rounds, "models": options.models}


def training_rounds(options: argparse.Namespace, rounds: list[dict[str, Any]]) -> None:
    """The training steps, a round of them to each round of ``rounds``, each calibrated afresh, once
    this process holds none of the zoo (its memory handed back to the OS): each step is timed in a
    process of its own (:func:`training_step_alone`), predicted here. On this VM another process
    holding 3 GiB made GPT-2's step take 2.43 s, against 1.41 s before and after it was freed, at
    the same 190 K pages faulted a step: the host backs the guest's pages, and a fault costs
    what the host's memory lets it (2026-12-06)."""
    gc.collect()
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    for row in rounds:
        started = time.perf_counter()
        spec = calibrated()
        row["training_calibration_s"] = time.perf_counter() - started
        for name in [name for name in TRANSFORMERS if name in options.models]:
            model, args, kwargs = instantiate(name)
            predicted = predict_training_step(model, args, kwargs, device=spec)
            del model, args, kwargs
            gc.collect()
            step, step_faults = training_step_alone(name, options.steps)
            row["training"][name] = {"measured_s": step, "predicted_s": predicted.total_s, "error": predicted.total_s / step - 1,
                                     "predicted_parts_s": [predicted.forward_s, predicted.backward_s, predicted.optimizer_s], "page_faults": step_faults,
                                     "predicted_pages": predicted.pages}
        print("training: " + ", ".join(f"{name} {value['error']:+.0%}" for name, value in row["training"].items()), flush=True)


def reduced(document: dict[str, Any]) -> dict[str, Any]:
    """Each figure's median over the rounds, with its spread; the noise floor."""
    rounds = document["rounds"]
    result: dict[str, Any] = {"forward": {}, "training": {}, "generation": {}, "compiled": {}}
    for name in rounds[0]["forward"]:
        per_round = [row["forward"][name] for row in rounds]
        entry = {"measured_s": statistics.median(value["measured_s"] for value in per_round), "error": summary([value["error"] for value in per_round]),
                 "error_in_turn": summary([value["error_in_turn"] for value in per_round]),
                 "set": "studied" if name in STUDIED else "outside the zoo" if name in OUTSIDE else "held out",
                 "page_faults": summary([value["page_faults"] for value in per_round])}
        if "modules" in per_round[0]:
            entry["module_median_abs_error"] = statistics.median(value["modules"]["median_abs_error"] for value in per_round)
            floors = [value["modules"]["noise_floor"] for value in per_round if value["modules"].get("noise_floor") is not None]
            entry["module_noise_floor"] = statistics.median(floors) if floors else None
            entry["module_median_error"] = statistics.median(value["modules"]["median_error"] for value in per_round)
            entry["worst_module"] = max((value["modules"]["worst"] for value in per_round), key=lambda item: abs(item[1]))
        result["forward"][name] = entry
    for part in ("training", "compiled"):
        for name in rounds[0].get(part, {}):
            result[part][name] = {"measured_s": statistics.median(row[part][name]["measured_s"] for row in rounds),
                                  "error": summary([row[part][name]["error"] for row in rounds])}
            if "page_faults" in rounds[0][part][name]:
                result[part][name]["page_faults"] = summary([row[part][name]["page_faults"] for row in rounds])
            if rounds[0][part][name].get("predicted_pages") is not None:
                result[part][name]["predicted_pages"] = rounds[0][part][name]["predicted_pages"]  # the recording's, the same each round
    for name in rounds[0]["generation"]:
        result["generation"][name] = {key: summary([row["generation"][name][key] for row in rounds]) for key in ("prefill_error", "decode_error", "generate_own_s", "generate_own_error")}
    if len(rounds) > 1:
        differences = [abs(rounds[1]["forward"][name]["measured_s"] / rounds[0]["forward"][name]["measured_s"] - 1) for name in rounds[0]["forward"]]
        result["noise_floor"] = statistics.median(differences)
    result["calibration_s"] = summary([row["calibration_s"] for row in rounds])
    loads = [row["other_cores"] for row in rounds if row.get("other_cores") is not None]
    if loads:
        result["other_cores"] = summary(loads)
    return result


def tables(result: dict[str, Any], rounds: int) -> str:
    def spread(entry: dict[str, float]) -> str:
        return f"{entry['median']:+.0%} ({entry['low']:+.0%} to {entry['high']:+.0%})"

    def pages(entry: dict[str, Any]) -> str:
        counted = entry.get("page_faults")
        return f"{counted['median']:,.0f} ({counted['low']:,.0f} to {counted['high']:,.0f})" if counted else "-"

    lines = [f"Median over {rounds} rounds (spread: the lowest and highest round); calibration {result['calibration_s']['median']:.0f} s a round"
             + (f"; noise floor (the same forward in two rounds) {result['noise_floor']:.0%}" if "noise_floor" in result else "")
             + (f"; other processes kept up to {result['other_cores']['high']:.2f} cores busy during a round's forwards" if "other_cores" in result else ""), "",
             "| model | forward | error | after another model's | leaf modules' median abs error | their noise floor | worst module | fresh pages a forward | set |",
             "|---|---|---|---|---|---|---|---|---|"]
    for name, entry in result["forward"].items():
        worst = f"{entry['worst_module'][0]} {entry['worst_module'][1]:+.0%}" if entry.get("worst_module") else "-"
        modules = f"{entry['module_median_abs_error']:.0%}" if entry.get("module_median_abs_error") is not None else "-"
        floor = f"{entry['module_noise_floor']:.0%}" if entry.get("module_noise_floor") is not None else "-"
        lines.append(f"| {name} | {entry['measured_s'] * 1e3:.1f} ms | {spread(entry['error'])} | {spread(entry['error_in_turn'])} | {modules} | {floor} | {worst} | "
                     f"{pages(entry)} | {entry['set']} |")
    if result["training"]:
        lines += ["", "| model | training step (AdamW) | error | fresh pages a step | pages the heap's model prices |", "|---|---|---|---|---|"]
        lines += [f"| {name} | {entry['measured_s'] * 1e3:.0f} ms | {spread(entry['error'])} | {pages(entry)} | {entry.get('predicted_pages', 0):,} |"
                  for name, entry in result["training"].items()]
    if result["compiled"]:
        lines += ["", "| model | forward under torch.compile | error |", "|---|---|---|"]
        lines += [f"| {name} | {entry['measured_s'] * 1e3:.1f} ms | {spread(entry['error'])} |" for name, entry in result["compiled"].items()]
    if result["generation"]:
        lines += ["", f"| decoder | prefill ({PROMPT} tokens) error | mean decode step ({NEW_TOKENS} tokens) error | generate()'s own work a token | its error |",
                  "|---|---|---|---|---|"]
        lines += [f"| {name} | {spread(entry['prefill_error'])} | {spread(entry['decode_error'])} | {entry['generate_own_s']['median'] * 1e3:.2f} ms "
                  f"({entry['generate_own_s']['low'] * 1e3:.2f} to {entry['generate_own_s']['high'] * 1e3:.2f}) | {spread(entry['generate_own_error'])} |"
                  for name, entry in result["generation"].items()]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--models", nargs="*", default=MODELS, choices=MODELS + list(OUTSIDE))
    parser.add_argument("--outside", action="store_true", help="the models outside the zoo (OUTSIDE) instead of the zoo's")
    parser.add_argument("--repeats", type=int, default=7, help="interleaved forwards of each model per round")
    parser.add_argument("--steps", type=int, default=6, help="timed training steps per model and round")
    parser.add_argument("--no-modules", dest="modules", action="store_false", help="skip the per-module timed pass")
    parser.add_argument("--no-training", dest="training", action="store_false")
    parser.add_argument("--no-generation", dest="generation", action="store_false")
    parser.add_argument("--compiled", action="store_true", help="also torch.compile's forwards, against mode='compiled'")
    parser.add_argument("--json", default=str(REPO / "tools" / "time_results.json"))
    parser.add_argument("--training-step-of", choices=TRANSFORMERS, help=argparse.SUPPRESS)  # one model's steps, for training_step_alone
    options = parser.parse_args()
    if options.outside:
        options.models = list(OUTSIDE)
    warnings.simplefilter("ignore")
    logging.disable(logging.WARNING)
    if options.training_step_of:
        step, faults = training_step(*instantiate(options.training_step_of), options.steps)
        print(json.dumps({"step_s": step, "page_faults": faults}))
        return
    document = run_rounds(options)
    if options.training:
        training_rounds(options, document["rounds"])
    document["summary"] = reduced(document)
    document["torch"] = torch.__version__
    print(tables(document["summary"], options.rounds))
    Path(options.json).write_text(json.dumps(document, indent=1))


if __name__ == "__main__":
    main()
