"""``jitflops``: analyse a model from the command line, without writing a script.

    jitflops transformers:BertModel --config num_hidden_layers=2 --input-ids 1,128
    jitflops --example convnet --profile --html report.html
    jitflops my_package.models:make_net --input-shape 1,3,224,224 --ops --sort time --top 20

A factory is ``MODULE:CALLABLE``. A Hugging Face model class is built from its config class with
``--config key=value`` settings and random weights; any other callable is called with the
``--config`` settings as keyword arguments. A model can also be named (a Hub id, a model folder,
a ``config.json``, ``timm/NAME``: :mod:`jitflops.named_models`); it is then built on the meta
device from its configuration alone, ``--config`` settings overriding the file's:

    jitflops meta-llama/Llama-3.1-8B --input-ids 1,4096

``jitflops plan`` plans training a model on N GPUs (:mod:`jitflops.planning`); ``jitflops
calibrate`` measures this machine's device.
"""

from __future__ import annotations

import argparse
import csv
import difflib
import importlib
import inspect
import io
import json
import os
import sys
from typing import Any, Callable, Iterator, Optional, Sequence

import torch
from torch import nn
from torch.utils._pytree import tree_map_only

from . import __version__
from .timing.calibration import PHASES, calibrate
from .estimates.devices import DeviceSpec, device_spec, is_device_name
from .examples import all_examples
from .reports.files import ops_to_csv, profile_to_json, spans_to_chrome_trace
from .reports.html_report import profile_to_html
from .reports.file_output import check_writable, write_text
from .reports.formatting import deepspeed_bytes, deepspeed_seconds, format_quantity, format_seconds
from .estimates.memory_estimate import MemoryEstimate
from .estimates.memory_footprint import largest_fitting, memory_footprint
from .estimates.error_bands import error_band, error_note
from .estimates.generation_time import predict_generation
from .estimates.memory_levers import LeverEstimate, what_would_fit
from .estimates.training_step_time import predict_training_step
from .reports.memory_report import lever_table, memory_summary, memory_table
from .profiling.model_profile import ModelProfile
from .named_models import looks_like_model_name, model_from_config, model_from_name
from .profiling.profile import profile_model
from .planning.interconnects import interconnect
from .planning.plan import Planner, key_value_heads, plan_training
from .planning.published_runs import MEGATRON_H100
from .planning.search import best_layouts
from .planning.serving import plan_serving
from .reports.plan_report import plan_text, plans_table, serving_text

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16, "float64": torch.float64}
OP_SORT_KEYS = {
    "order": lambda row: row.index,
    "params": lambda row: row.index,  # ops have no parameters: keep execution order
    "flops": lambda row: -(row.macs or 0),
    "time": lambda row: -row.time_s,
    "memory": lambda row: -row.memory_delta,
}
MODULE_SORT_KEYS = {  # None: keep the tree order (parents before children)
    "order": None,
    "flops": lambda node: -node.macs,
    "params": lambda node: -node.params,
    "time": lambda node: -(node.latency.median if node.latency else 0.0),
    "memory": None,
}


class UsageError(Exception):
    """A problem with what the user asked for: printed as one line, no traceback."""


class NothingFits(UsageError):
    """``--fit`` where even a size of 1 does not fit: the error line, after ``report`` (the estimate
    at that size, and what would fit), which is printed as a report is."""

    def __init__(self, message: str, report: str) -> None:
        super().__init__(message)
        self.report = report


def one_line(error: BaseException) -> str:
    """The error's message on one line, its reason included: lines after a first line that ends
    with a colon are kept, joined, and a cause the message does not mention is added."""
    lines = [line.strip() for line in str(error).strip().splitlines() if line.strip()]
    if not lines:
        return type(error).__name__
    message = lines[0]
    for line in lines[1:]:
        if not message.endswith(":") and len(message) > 40:
            break
        message = f"{message} {line}"
    cause = error.__cause__
    if cause is not None and str(cause).strip() and str(cause).strip().splitlines()[0] not in message:
        message = f"{message} (because {type(cause).__name__}: {one_line(cause)})"
    return message


def _parse_ints(text: str, option: str) -> tuple[int, ...]:
    try:
        values = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise UsageError(f"{option} takes comma-separated integers like 1,3,224,224, got {text!r}") from None
    if not values or any(v <= 0 for v in values):
        raise UsageError(f"{option} takes positive sizes, got {text!r}")
    return values


def _parse_value(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def _parse_config(settings: Sequence[str]) -> dict[str, Any]:
    config = {}
    for setting in settings:
        key, sep, value = setting.partition("=")
        if not sep or not key:
            raise UsageError(f"--config takes key=value, got {setting!r}")
        config[key] = _parse_value(value)
    return config


def resolve_factory(path: str) -> Callable[..., Any]:
    module_name, sep, attribute = path.partition(":")
    if not sep or not module_name or not attribute:
        raise UsageError(f"a factory is MODULE:CALLABLE (e.g. transformers:BertModel), got {path!r}")
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise UsageError(f"cannot import module {module_name!r}: {error}") from None
    target: Any = module
    for part in attribute.split("."):
        if not hasattr(target, part):
            raise UsageError(f"module {module_name!r} has no attribute {attribute!r}")
        target = getattr(target, part)
    if not callable(target):
        raise UsageError(f"{path!r} is not callable")
    return target


def _check_config_keys(config_class: type, config: dict[str, Any]) -> None:
    """Hugging Face configs keep unknown keys as attributes, silently: a typo would profile the
    default model. Every key must be one the config class knows."""
    known = set(inspect.signature(config_class.__init__).parameters) | set(vars(config_class())) | set(getattr(config_class, "attribute_map", {}))
    known -= {"self", "kwargs"}
    for key in config:
        if key not in known:
            close = difflib.get_close_matches(key, sorted(known), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise UsageError(f"--config: {config_class.__name__} has no setting {key!r}{hint}")


def _example_settings(name: str, settings: Sequence[str]) -> dict[str, Any]:
    """``--config`` settings for the example ``name``: a transformers example's configuration takes
    them (each a key its config class knows); the others are built as they are."""
    config = _parse_config(settings)
    if config:
        example = all_examples()[name]
        if example.config is None:
            raise UsageError(f"--config overrides a transformers example's configuration; the example {name!r} has none")
        _check_config_keys(type(example.config()), config)
    return config


def build_model(factory: Callable[..., Any], config: dict[str, Any]) -> nn.Module:
    config_class = getattr(factory, "config_class", None)
    if isinstance(factory, type) and config_class is not None:
        _check_config_keys(config_class, config)
    try:
        model = factory(config_class(**config)) if isinstance(factory, type) and config_class is not None else factory(**config)
    except Exception as error:
        raise UsageError(f"building the model failed: {type(error).__name__}: {one_line(error)}") from None
    if not isinstance(model, nn.Module):
        raise UsageError(f"the factory returned a {type(model).__name__}, not a torch.nn.Module")
    return model


def _tensor_from_spec(spec: str, dtype: torch.dtype, vocab: int) -> torch.Tensor:
    """``ones:1,128``, ``zeros:...``, ``randn:...`` or ``ids:...`` (random token ids)."""
    kind, _, shape_text = spec.partition(":")
    shape = _parse_ints(shape_text, f"--kwargs value {spec!r}")
    makers = {
        "ones": lambda: torch.ones(shape, dtype=torch.long),
        "zeros": lambda: torch.zeros(shape, dtype=torch.long),
        "randn": lambda: torch.randn(shape, dtype=dtype),
        "ids": lambda: _ids(shape, vocab),
    }
    return makers[kind]()


def _ids(shape: tuple[int, ...], vocab: int) -> torch.Tensor:
    if torch.get_default_device().type == "meta":
        return torch.zeros(shape, dtype=torch.long)
    return torch.randint(0, vocab, shape)


def vocabulary_size(model: nn.Module) -> int:
    """The range of token ids the model takes: its config's ``vocab_size``, else its smallest
    embedding table, else 1000."""
    configured = getattr(getattr(model, "config", None), "vocab_size", None)
    if configured:
        return int(configured)
    tables = [module.num_embeddings for module in model.modules() if isinstance(module, nn.Embedding)]
    return min(tables) if tables else 1000


def build_inputs(args: argparse.Namespace, model: nn.Module) -> tuple[tuple[Any, ...], dict[str, Any]]:
    dtype = DTYPES[args.dtype]
    vocab = vocabulary_size(model)
    positional: tuple[Any, ...] = ()
    if args.input_shape:
        shape = _parse_ints(args.input_shape, "--input-shape")
        positional = (torch.zeros(shape, dtype=dtype) if args.device == "meta" else torch.randn(shape, dtype=dtype),)
    elif args.input_ids:
        positional = (_ids(_parse_ints(args.input_ids, "--input-ids"), vocab),)
    keywords: dict[str, Any] = {}
    if args.kwargs:
        try:
            given = json.loads(args.kwargs)
        except json.JSONDecodeError as error:
            raise UsageError(f"--kwargs is not valid JSON: {error}") from None
        if not isinstance(given, dict):
            raise UsageError("--kwargs must be a JSON object")
        for key, value in given.items():
            is_spec = isinstance(value, str) and value.partition(":")[0] in ("ones", "zeros", "randn", "ids")
            keywords[key] = _tensor_from_spec(value, dtype, vocab) if is_spec else value
    if not positional and not keywords:
        raise UsageError("give the model's inputs: --input-shape, --input-ids or --kwargs")
    return positional, keywords


def _progress(quiet: bool) -> Optional[Callable[[Iterator[int], int, str], Iterator[int]]]:
    if quiet:
        return None
    from tqdm import tqdm

    def bar(iterations: Iterator[int], total: int, label: str) -> Iterator[int]:
        return iter(tqdm(iterations, total=total, desc=label, unit="it", delay=1.0, leave=False, file=sys.stderr))

    return bar


def _modules_csv(profile: ModelProfile, sort: str, top: Optional[int]) -> str:
    nodes = list(profile.root.walk())
    key = MODULE_SORT_KEYS[sort]
    if key is not None:
        nodes.sort(key=key)
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(["module", "type", "depth", "params", "macs", "flops", "elementwise_flops", "activations", "latency_median_s", "latency_iqr_s", "flops_per_second"])
    for node in nodes[:top]:
        latency = node.latency
        writer.writerow([node.name, node.type_name, node.depth, node.params, node.macs, node.flops, node.elementwise_flops, node.activations,
                         latency.median if latency else "", latency.iqr if latency else "", node.flops_per_second or ""])
    return buffer.getvalue()


def _ops_text(profile: ModelProfile, sort: str, top: Optional[int]) -> str:
    from .core.table import pipe_table

    rows = sorted(profile.op_rows, key=OP_SORT_KEYS[sort])[:top]
    table = [
        [str(r.index), r.module or "(root)", r.op, str([list(s) if isinstance(s, (list, tuple)) else s for s in r.input_shapes if s != []])[:60],
         format_quantity(r.macs) if r.macs is not None else "", format_quantity(r.flops) if r.flops is not None else "",
         format_quantity(r.bytes, "B") if r.bytes is not None else "", f"{r.intensity:.3g}" if r.intensity is not None else "", format_seconds(r.time_s), format_quantity(r.memory_before, "B"),
         format_quantity(r.memory_after, "B"), format_quantity(r.memory_delta, "B")]
        for r in rows
    ]
    headers = ["#", "module", "op", "input shapes", "MACs", "FLOPs", "bytes", "FLOP/byte", "time", "mem before", "mem after", "mem delta"]
    return pipe_table(table, headers) + f"\n\n{profile.convention}."


def render(args: argparse.Namespace, profile: ModelProfile, memory: Optional[MemoryEstimate] = None) -> str:
    from .reports.deepspeed_report import format_model_profile
    from .reports.print_model_statistics import flop_count_str, flop_count_table

    if args.format == "json":
        return profile_to_json(profile)
    if args.format == "csv":
        return ops_to_csv(sorted(profile.op_rows, key=OP_SORT_KEYS[args.sort])[: args.top]) if args.ops else _modules_csv(profile, args.sort, args.top)
    if args.ops:
        return _ops_text(profile, args.sort, args.top)
    if args.profile and args.format == "table":
        return format_model_profile(profile, module_depth=args.depth if args.depth is not None else -1, top_modules=args.top or 1, detailed=True, memory=memory)
    flops, activations = profile.flop_analysis, profile.activation_analysis
    assert flops is not None and activations is not None  # profile_model always counts
    latency = {node.name: node.latency for node in profile.root.walk() if node.latency is not None} if args.profile else None
    note = f"\n\n{profile.timing_note()}" if latency is not None and profile.timing_note() else ""
    if args.format == "tree":
        return flop_count_str(flops, activations, latency=latency, show_shapes=args.shapes) + f"\n\nCounting convention: {flops.convention()}" + note
    traffic = profile.summary.prediction_device is not None  # a prediction: each module's bytes and intensity beside
    return flop_count_table(flops, max_depth=args.depth if args.depth is not None else 3, activations=activations, latency=latency, module_order="execution",
                            show_shapes=args.shapes, traffic=traffic) + note


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="jitflops", description="Count a PyTorch model's parameters, FLOPs and activations, and time it.")
    parser.add_argument("factory", nargs="?", help="MODULE:CALLABLE that builds the model (e.g. transformers:BertModel), or a model's name: a Hugging Face Hub id, a model folder, a config.json, timm/NAME; or a .pt2 file (torch.export.save), counted from its graph")
    parser.add_argument("--task", help="with a transformers model's name: the head, as AutoModelFor<TASK> (causal-lm, sequence-classification, ...; model: the base model); default: the class its config names (architectures[0]), else the base model")
    parser.add_argument("--example", choices=sorted(all_examples()), help="analyse a built-in example model on its own inputs, or on those --input-shape, --input-ids or --kwargs give (--config overrides a transformers example's configuration)")
    parser.add_argument("--config", nargs="*", default=[], metavar="KEY=VALUE", help="config class settings (or factory keyword arguments); values are JSON or strings")
    inputs = parser.add_mutually_exclusive_group()
    inputs.add_argument("--input-shape", help="a random float input of this shape, e.g. 1,3,224,224")
    inputs.add_argument("--input-ids", help="random token ids of this shape, e.g. 1,128")
    parser.add_argument("--kwargs", help='keyword arguments as JSON; "ones:1,128", "zeros:..", "randn:..", "ids:.." make tensors')
    parser.add_argument("--device", help="cpu, cuda, cuda:N or meta (meta: counts only, no memory); or a device to predict the time on, counted on meta: a name of the device table (h100, a100-40gb, mi300x, ...) or a spec from 'jitflops calibrate'; default: meta for a named model, else cpu")
    parser.add_argument("--predict", metavar="DEVICE", help="also predict each module's time on DEVICE (a name of the device table, or a spec file from 'jitflops calibrate'), beside the measured time with --profile")
    parser.add_argument("--mode", default="eager", choices=["eager", "graph", "compiled"],
                        help="the execution mode predicted: eager (default), graph (CUDA graphs: the kernels alone, on a GPU), or compiled "
                             "(torch.compile: the kernels alone, each run of pointwise ops and reductions fused into one)")
    parser.add_argument("--generate", type=int, metavar="TOKENS", help="with a device to predict on: also the predicted time of generate() making TOKENS new tokens from the --input-ids prompt (the prefill, the decode steps)")
    parser.add_argument("--dtype", default="float32", choices=sorted(DTYPES))
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--profile", action="store_true", help="also time the model: DeepSpeed-style profile")
    mode.add_argument("--ops", action="store_true", help="per-op table: module, shapes, FLOPs, time, memory")
    parser.add_argument("--depth", type=int, help="module depth to show (table: 3; profile: all)")
    parser.add_argument("--top", type=int, help="top modules per depth (profile) or rows (ops, csv)")
    parser.add_argument("--sort", default="order", choices=sorted(OP_SORT_KEYS), help="row order for --ops and csv output (memory: ops only)")
    parser.add_argument("--elementwise", action="store_true", help="count elementwise ops, activations and softmax")
    parser.add_argument("--shapes", action="store_true", help="show each module's output shapes in the table or tree")
    parser.add_argument("--backend", default="jit", choices=["jit", "dispatch", "export"],
                        help="jit: fvcore's trace (default); dispatch: the ops as they run; export: the graph torch.export makes (strict=False), read statically")
    parser.add_argument("--backward", action="store_true", help="also measure the backward pass's MACs (runs the dispatch backend)")
    parser.add_argument("--format", default="table", choices=["table", "tree", "json", "csv"])
    parser.add_argument("--output", help="write the report to this file (atomically) instead of stdout")
    parser.add_argument("--trace", help="write a Chrome/Perfetto trace of the timed pass (with --profile)")
    parser.add_argument("--html", help="write the module tree as an HTML icicle chart")
    parser.add_argument("--peak-tflops", type=float, help="the device's peak TFLOP/s for MFU (default: datasheet for known GPUs, a GEMM probe on the CPU)")
    parser.add_argument("--warm-up", type=int, default=1, help="untimed iterations before timing")
    parser.add_argument("--repeats", type=int, default=10, help="timed iterations")
    memory = parser.add_argument_group("memory (estimated on fake tensors: nothing is allocated)")
    memory.add_argument("--memory", action="store_true", help="also estimate the memory of inference (or, with --train, of a training step) per module, and whether it fits on --device")
    memory.add_argument("--train", metavar="OPTIMIZER", help="estimate a training step's memory with this optimizer: sgd, sgd-momentum, adam, adamw, adafactor, adam8bit")
    memory.add_argument("--checkpointing", action="store_true", help="with --train: activation checkpointing (the model's activation_checkpointing_enable(), gradient_checkpointing_enable() before transformers 5.24)")
    memory.add_argument("--autocast", choices=["bfloat16", "float16"], help="the forward under autocast to this dtype")
    memory.add_argument("--master-weights", action="store_true", help="with --train: float32 master copies of the (--dtype) weights, stepped by the optimizer")
    memory.add_argument("--fsdp", type=int, metavar="RANKS", help="with --train: one rank's memory when FSDP2 shards the model over RANKS ranks")
    memory.add_argument("--tp", type=int, metavar="RANKS", help="one rank's memory when tensor parallelism (the transformers model's own plan) shards it over RANKS ranks (with --fsdp: a 2-D mesh, FSDP2 over the data-parallel ranks)")
    memory.add_argument("--kv-cache", type=int, metavar="LENGTH", help="inference: the KV cache grown to LENGTH tokens")
    memory.add_argument("--fit", choices=["batch", "length"], help="the largest batch size (first dimension) or length (second) of the inputs that fits on --device")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    parser.add_argument("--debug", action="store_true", help="show tracebacks")
    parser.add_argument("--version", action="version", version=f"jitflops {__version__} (torch {torch.__version__})")
    return parser


def _check_options(args: argparse.Namespace) -> None:
    """Options that would do nothing in this mode are errors, not silently ignored."""
    if args.shapes and (args.ops or args.format not in ("table", "tree") or (args.profile and args.format == "table")):
        raise UsageError("--shapes adds a column to the module table and tree (--format table or tree, without --ops or --profile's DeepSpeed printout)")
    if args.backend == "dispatch" and args.shapes:
        raise UsageError("--shapes reads the JIT trace: use it with --backend jit")
    if args.ops and args.format == "tree":
        raise UsageError("--format tree shows the module tree: with --ops use table, csv or json")
    if args.sort != "order" and not (args.ops or args.format == "csv"):
        raise UsageError("--sort orders the rows of --ops and of --format csv; the module table and tree keep the model's order")
    if args.fit and args.format not in ("table", "tree", "json"):
        raise UsageError("--fit prints the largest size that fits: use --format table, tree or json")
    if args.top is not None and not (args.ops or args.format == "csv" or (args.profile and args.format == "table")):
        raise UsageError("--top limits --ops rows, --format csv rows, or the top modules of --profile; use --depth for the module table")


def run(args: argparse.Namespace) -> str:
    if bool(args.factory) == bool(args.example):
        raise UsageError("give a factory (MODULE:CALLABLE), a model's name or --example NAME")
    if args.factory and args.factory.endswith(".pt2"):
        return _run_program(args)
    named = bool(args.factory) and looks_like_model_name(args.factory)
    if args.task and not named:
        raise UsageError("--task picks the head of a named transformers model (a Hub id, folder or config.json)")
    large_example = bool(args.example) and "meta" in all_examples()[args.example].tags  # Llama-8B's and -70B's shapes
    args.device = args.device or ("meta" if named or large_example else "cpu")
    prediction = device_spec(args.predict) if args.predict else None
    if is_device_name(args.device) or args.device.endswith(".json"):  # a device to predict for: counted on meta
        prediction, args.device = device_spec(args.device), "meta"
    _check_options(args)
    args.memory = args.memory or any((args.train, args.checkpointing, args.autocast, args.master_weights, args.fsdp, args.tp, args.kv_cache, args.fit))
    if args.fit and (prediction is None or prediction.memory_bytes is None):  # before the analysis spends any time
        raise UsageError("--fit needs a device with a memory size: --device h100, a100-80gb, ... (the device table)")
    if args.trace and not args.profile:
        raise UsageError("--trace needs --profile (it records the timed pass)")
    if (args.generate or args.mode != "eager") and prediction is None:
        raise UsageError("--generate and --mode predict on a device: give --device NAME (or a spec file), or --predict NAME")
    if args.generate is not None and (args.generate < 1 or not _gives_a_prompt(args)):
        raise UsageError("--generate TOKENS needs TOKENS >= 1 and a prompt: --input-ids BATCH,LENGTH (or input_ids in --kwargs)")
    timed = args.profile or args.ops
    if args.device == "meta" and timed:
        if prediction is not None and args.predict is None:
            raise UsageError(f"--device {prediction.name} predicts without running the model (it is counted on meta): to time it here too, "
                             f"use --device cpu or cuda with --predict {prediction.name}")
        raise UsageError("the meta device has no data to time: --profile and --ops need cpu or cuda")
    try:
        device = torch.device(args.device)
    except RuntimeError:
        device_spec(args.device)  # the table's error: the known names
        raise
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UsageError("--device cuda, but CUDA is not available on this machine")
    for path in (args.output, args.trace, args.html):
        if path:
            check_writable(path)  # before the analysis spends any time
    if args.example:
        settings = _example_settings(args.example, args.config)
        if large_example and device.type != "meta":
            _check_weights_fit(args.example, settings, device, DTYPES[args.dtype])
        model, positional, keywords = all_examples()[args.example].instantiate(args.device, settings=settings)
        if args.input_shape or args.input_ids or args.kwargs:  # the inputs given replace the example's own
            with torch.device(device):
                positional, keywords = build_inputs(args, model)
    elif named:
        model = model_from_name(args.factory, args.task, device, _parse_config(args.config))
        with torch.device(device):
            positional, keywords = build_inputs(args, model)
    else:
        factory = resolve_factory(args.factory)
        with torch.device(device):
            model = build_model(factory, _parse_config(args.config)).eval()
            positional, keywords = build_inputs(args, model)
    if DTYPES[args.dtype] != torch.float32:
        model = model.to(DTYPES[args.dtype])
    profile = profile_model(
        model, positional, keywords, timed=args.profile, warm_up=args.warm_up, repeats=args.repeats,
        with_ops=args.ops, elementwise=args.elementwise, progress=_progress(args.quiet),
        backend=args.backend, backward=args.backward, peak_flops=args.peak_tflops * 1e12 if args.peak_tflops else None,
        device=prediction, mode=args.mode,
    )
    estimate, fitted, levers = _memory(args, model, positional, keywords, prediction) if args.memory else (None, None, ())
    if args.trace:
        write_text(args.trace, spans_to_chrome_trace(profile.spans))
    if args.html:
        write_text(args.html, profile_to_html(profile, memory=estimate))
    report = _with_predicted_forward(args, render(args, profile, estimate), profile, prediction)
    if prediction is not None and (args.generate or (args.train and not args.fit)):
        report = _with_predicted_steps(args, report, model, positional, keywords, prediction)
    if estimate is not None:
        report = _with_memory(args, report, estimate, fitted, prediction, levers)
    if named and args.format in ("table", "tree") and not (args.profile and args.format == "table"):  # the DeepSpeed printout and the JSON say it themselves
        report = f"Model: {profile.summary.model_class}, built from {args.factory}\n\n{report}"
    if fitted == 0:
        assert prediction is not None
        raise NothingFits(f"even a {args.fit} of 1 does not fit on {prediction.name} (what would fit is printed above)", report)
    return report


def _check_weights_fit(name: str, settings: dict[str, Any], device: torch.device, dtype: torch.dtype) -> None:
    """A large example built where it runs: its weights (counted on meta first) must fit the memory
    free there, or the build would take minutes and end in the OS's out-of-memory kill."""
    weights = sum(parameter.numel() for parameter in all_examples()[name].instantiate("meta", settings=settings)[0].parameters()) * dtype.itemsize
    if device.type == "cuda":
        free = torch.cuda.mem_get_info(device)[0]
    else:
        free = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    if weights > free:
        raise UsageError(f"the example {name!r} takes {deepspeed_bytes(weights)} of weights in {str(dtype).removeprefix('torch.')}, more than the "
                         f"{deepspeed_bytes(free)} free on {device}: leave --device out to count it on meta (or --device h100 to predict it there)")


def _gives_a_prompt(args: argparse.Namespace) -> bool:
    """Whether the command line gives the token ids ``generate`` starts from: ``--input-ids``, or
    ``input_ids`` in ``--kwargs`` (whose JSON :func:`build_inputs` checks)."""
    if args.input_ids:
        return True
    try:
        given = json.loads(args.kwargs) if args.kwargs else {}
    except json.JSONDecodeError:
        return False
    return isinstance(given, dict) and "input_ids" in given


def _with_predicted_forward(args: argparse.Namespace, report: str, profile: ModelProfile, prediction: Optional[DeviceSpec]) -> str:
    """The table or tree with the forward's predicted time on ``prediction`` after it, with its
    measured error (the DeepSpeed printout and the JSON say it themselves)."""
    if prediction is None or args.format not in ("table", "tree") or args.profile:
        return report
    summary = profile.summary
    return report + (f"\n\nPredicted forward on {prediction.name} ({args.mode}; {summary.bound}-bound; ridge {summary.ridge:.3g} flops/byte): "
                     f"{deepspeed_seconds(summary.predicted_s or 0.0)}; {deepspeed_bytes(summary.bytes)} read and written, {summary.intensity or 0:.3g} flops/byte; "
                     f"{error_note(prediction, summary.prediction_figure)}")


def _with_predicted_steps(args: argparse.Namespace, report: str, model: nn.Module, positional: tuple[Any, ...], keywords: dict[str, Any],
                          device: DeviceSpec) -> str:
    """The report with the predicted training step (``--train``) and generation (``--generate``) on
    ``device``, each with its measured error: in the JSON document, or printed after the report."""
    predicted: dict[str, Any] = {}
    lines = []
    if args.train:
        step = predict_training_step(model, positional, keywords, device=device, optimizer=args.train, mode=args.mode)
        predicted["training_step"] = {"total_s": step.total_s, "forward_s": step.forward_s, "backward_s": step.backward_s, "optimizer_s": step.optimizer_s,
                                      "pages": step.pages, "error_band": error_band(device, "training step")}
        pages = f", {step.pages:,} pages faulted in a step (glibc's heap)" if step.pages is not None else ""
        lines.append(f"Predicted training step on {device.name} ({args.mode}; {args.train}): {deepspeed_seconds(step.total_s)} = forward "
                     f"{deepspeed_seconds(step.forward_s)} + backward {deepspeed_seconds(step.backward_s)} + optimizer {deepspeed_seconds(step.optimizer_s)}"
                     f"{pages}; {error_note(device, 'training step')}")
    if args.generate:
        ids = positional[0] if positional else keywords["input_ids"]
        generation = predict_generation(model, ids, args.generate, device=device, mode=args.mode)
        predicted["generation"] = {"prefill_s": generation.prefill_s, "decode_s": generation.decode_s, "first_decode_s": generation.first_decode_s,
                                   "last_decode_s": generation.last_decode_s, "own_s": generation.own_s, "new_tokens": args.generate, "total_s": generation.total_s,
                                   "error_bands": {figure: error_band(device, figure) for figure in ("prefill", "decode step", "generate's own work")}}
        own_note = error_note(device, "generate's own work")
        own = (f" + generate()'s own work between them {deepspeed_seconds(generation.own_s)} ({own_note})" if generation.own_s is not None
               else "; generate()'s own work between the calls not in it (it could not be recorded)")
        lines.append(f"Predicted generate() on {device.name} ({args.mode}; {args.generate} new tokens from {ids.shape[-1]}): {deepspeed_seconds(generation.total_s)} = "
                     f"prefill {deepspeed_seconds(generation.prefill_s)} ({error_note(device, 'prefill')}) + {generation.decode_steps} decode steps of "
                     f"{deepspeed_seconds(generation.decode_s)} on average ({error_note(device, 'decode step')}){own}")
    if args.format == "json":
        document = json.loads(report)
        document["predicted"] = predicted
        return json.dumps(document, indent=1)
    return report + "\n\n" + "\n".join(lines)


def _run_program(args: argparse.Namespace) -> str:
    """A ``.pt2`` file's count, read from its graph (nothing runs): at the sizes it was exported
    with, or at those of the inputs given; with ``--formula``-free output as for a model."""
    memory = any((args.memory, args.train, args.checkpointing, args.autocast, args.master_weights, args.fsdp, args.tp, args.kv_cache, args.fit))
    if args.profile or args.ops or args.backward or memory or args.html or args.trace:
        raise UsageError("a .pt2 file is counted from its graph, nothing runs: --profile, --ops, --backward, --html, --trace and the memory options need a model")
    if args.backend not in ("jit", "export"):
        raise UsageError("a .pt2 file is read by the export backend: leave --backend out")
    from .frontends.export_trace import load_program, module_of  # sympy: only for a program (program_source.py)

    program = load_program(args.factory)
    module = module_of(program)
    positional, keywords = build_inputs(args, module) if (args.input_shape or args.input_ids or args.kwargs) else ((), {})
    prediction = device_spec(args.device) if args.device and (is_device_name(args.device) or args.device.endswith(".json")) else None
    if args.mode != "eager" and prediction is None:
        raise UsageError("--mode predicts on a device: give --device NAME (or a spec file)")
    profile = profile_model(program, positional, keywords, timed=False, elementwise=args.elementwise, progress=_progress(args.quiet), device=prediction,
                            mode=args.mode)
    return _with_predicted_forward(args, render(args, profile), profile, prediction)


def _with_size(inputs: Any, axis: int, size: int) -> Any:
    """``inputs`` with every tensor of more than ``axis`` dimensions made ``size`` long along it (values do not matter: the estimate runs on fake tensors)."""
    def resized(tensor: torch.Tensor) -> torch.Tensor:
        if tensor.dim() <= axis:
            return tensor
        shape = list(tensor.shape)
        shape[axis] = size
        return torch.zeros(shape, dtype=tensor.dtype, device=tensor.device)
    return tree_map_only(torch.Tensor, resized, inputs)


def _memory(args: argparse.Namespace, model: nn.Module, positional: tuple[Any, ...], keywords: dict[str, Any],
            device: Optional[DeviceSpec]) -> tuple[MemoryEstimate, Optional[int], Sequence[LeverEstimate]]:
    """The memory estimate the options ask for; with ``--fit``, the largest size that fits and its
    estimate, or where none does, the estimate at size 1 and what would fit (:mod:`jitflops.estimates.memory_levers`)."""
    options: dict[str, Any] = dict(
        train=args.train, checkpointing=args.checkpointing, master_weights=args.master_weights, fsdp=args.fsdp, tensor_parallel=args.tp,
        autocast=DTYPES[args.autocast] if args.autocast else None, device=device, kv_cache_length=args.kv_cache,
    )
    if not args.fit:
        return memory_footprint(model, positional, keywords, **options), None, ()
    assert device is not None  # run() checked that --fit has a device with a memory size
    axis = {"batch": 0, "length": 1}[args.fit]
    smallest, smallest_keywords = _with_size(positional, axis, 1), _with_size(keywords, axis, 1)
    at_one = memory_footprint(model, smallest, smallest_keywords, **options)
    if not at_one.fits(device):
        return at_one, 0, what_would_fit(model, smallest, smallest_keywords, device, {key: value for key, value in options.items() if key != "device"}, at_one)
    fitted, estimate = largest_fitting(model, lambda n: _with_size(positional, axis, n), device, low=2,
                                       kwargs_of=lambda n: _with_size(keywords, axis, n), **options)
    return (estimate, fitted, ()) if estimate is not None else (at_one, 1, ())


def _with_memory(args: argparse.Namespace, report: str, estimate: MemoryEstimate, fitted: Optional[int], device: Optional[DeviceSpec],
                 levers: Sequence[LeverEstimate] = ()) -> str:
    """The count's report with the memory estimate (and the largest size that fits, with ``--fit``;
    where none does, the estimate at size 1 and what would fit): in the JSON document, or printed after it."""
    if args.format == "json":
        document = json.loads(report)
        document["memory"] = estimate.to_dict()
        if fitted is not None:
            document["memory"]["largest_" + args.fit] = fitted
        if fitted == 0:
            document["memory"]["what_would_fit"] = [lever.to_dict() for lever in levers]
        return json.dumps(document, indent=1)
    printed = args.profile and args.format == "table" and fitted != 0  # the DeepSpeed printout gives the peak itself
    text = "" if printed else memory_summary(estimate, device if device is not None and device.memory_bytes else None) + "\n\n"
    if fitted == 0:
        assert device is not None
        text = (f"Even a {args.fit} of 1 does not fit on {device.name}. At a {args.fit} of 1:\n{text}"
                f"What would fit at a {args.fit} of 1 (each estimated on fake tensors):\n{lever_table(levers, device.name)}\n\n")
    elif fitted is not None:
        text = f"Largest {args.fit} that fits on {device.name}: {fitted}\n{text}"
    return f"{report}\n\n{text}{memory_table(estimate, args.depth if args.depth is not None else 3)}"


def calibrate_main(argv: Sequence[str]) -> int:
    """``jitflops calibrate``: measure this machine's device and save (or print) its spec."""
    parser = argparse.ArgumentParser(prog="jitflops calibrate", description="Measure what this machine achieves op family by op family (products, convolutions, attention, elementwise ops, norms, gathers, the host's time per call), within a time budget, as a device spec for --device SPEC.json.")
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (default: cpu)")
    parser.add_argument("--output", help="write the spec here (JSON); default: print it")
    parser.add_argument("--budget", type=float, metavar="SECONDS", help="the calibration's time (default: 40, or the environment's JITFLOPS_CALIBRATION_BUDGET_S)")
    parser.add_argument("--phases", type=int, default=PHASES, metavar="N",
                        help=f"measure everything N times, each in 1/N of the budget, and keep each number's median: a slow stretch of a shared machine falls on one phase, "
                             f"but a phase's share may time fewer sizes (default: {PHASES})")
    parser.add_argument("--collectives", type=int, metavar="RANKS", help="instead, measure the collectives of RANKS gloo processes on this machine's loopback "
                        "(all-reduce, all-gather, reduce-scatter, 64 KiB to 16 MiB) as an interconnect for 'jitflops plan --interconnect FILE'")
    args = parser.parse_args(argv)
    if args.collectives is not None:
        from .planning.link_calibration import calibrate_collectives

        if args.collectives < 2:
            parser.error(f"--collectives needs at least 2 ranks, got {args.collectives}")
        text = json.dumps(calibrate_collectives(args.collectives), indent=1) + "\n"
    else:
        if args.phases < 1:
            parser.error(f"--phases needs at least 1 phase, got {args.phases}")
        text = calibrate(args.device, budget_s=args.budget, phases=args.phases).to_json()
    if args.output:
        write_text(args.output, text)
    else:
        print(text, end="" if text.endswith("\n") else "\n")
    return 0


def make_plan_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="jitflops plan", description="Plan training a model on N GPUs: memory per GPU, step time, MFU and GPU-hours of a layout, "
                                     "or the best layouts found (without --tp, --pp or --dp). The model is built on the meta device: nothing is allocated.")
    parser.add_argument("model", nargs="?", help="a model's name: a Hub id, a model folder or a config.json (built as AutoModelFor<--task>)")
    parser.add_argument("--example", choices=sorted(name for name, example in all_examples().items() if "transformers" in example.tags),
                        help="a built-in transformers model, built from its configuration as AutoModelFor<--task> (gpt2, llama-gqa, llama-1b, llama-8b, llama-70b)")
    parser.add_argument("--published", choices=[run.name for run in MEGATRON_H100], help="a row of Megatron-LM's published H100 table: its model, GPUs, batch and layout "
                        "(with --gpus: the best layouts of its model), and the published throughput beside the plan's")
    parser.add_argument("--task", default="causal-lm", help="with a model's name: the head (default causal-lm)")
    parser.add_argument("--config", nargs="*", default=[], metavar="KEY=VALUE", help="config settings overriding the model's")
    parser.add_argument("--dtype", default="bfloat16", choices=sorted(DTYPES), help="the weights' and activations' dtype (default bfloat16)")
    parser.add_argument("--device", default="h100", help="a name of the device table (default h100) or a spec file")
    parser.add_argument("--interconnect", help="the interconnect table's name (default: the device's reference system, e.g. dgx-h100), or a file from 'jitflops calibrate --collectives N'")
    parser.add_argument("--gpus", type=int, help="GPUs in all")
    parser.add_argument("--sequence", "--seq", type=int, default=4096, help="tokens per sequence (default 4096)")
    parser.add_argument("--batch", "--global-batch", type=int, help="sequences per step (the global batch)")
    parser.add_argument("--optimizer", default="adamw", help="the optimizer whose state and step are planned (default adamw; the memory estimate's names)")
    parser.add_argument("--tokens", type=float, help="a token budget: its hours and GPU-hours")
    layout = parser.add_argument_group("a layout (without one: the best layouts are searched)")
    layout.add_argument("--tp", type=int, help="tensor-parallel ranks (with sequence parallelism)")
    layout.add_argument("--pp", type=int, help="pipeline stages")
    layout.add_argument("--dp", type=int, help="data-parallel replicas (default: the GPUs left)")
    layout.add_argument("--cp", type=int, default=1, help="context-parallel ranks: each holds 1/cp of every sequence (default 1)")
    layout.add_argument("--ep", type=int, default=1, help="expert-parallel ranks, inside the data-parallel ones: each holds 1/ep of every layer's experts (default 1)")
    layout.add_argument("--zero", type=int, default=1, choices=[0, 1, 2, 3], help="0: DDP; 1: a distributed optimizer (default); 2: and gradients; 3: FSDP2")
    layout.add_argument("--micro-batch", type=int, default=1, help="sequences per micro-batch (default 1)")
    layout.add_argument("--schedule", default="1f1b", choices=["1f1b", "interleaved"], help="the pipeline's schedule (default 1f1b)")
    layout.add_argument("--virtual-stages", type=int, default=1, help="chunks per pipeline rank (the interleaved schedule)")
    layout.add_argument("--recompute", default="none", choices=["none", "selective", "full"], help="activation recomputation (default none)")
    serving = parser.add_argument_group("serving instead of training (--serve): generate() with tensor parallelism (and --pp stages)")
    serving.add_argument("--serve", action="store_true", help="plan generate() of --batch prompts: prefill, decode step, tokens/s, memory and the largest batch per GPU, "
                         "for --tp (default: every tp of a node that divides the key-value heads)")
    serving.add_argument("--prompt", type=int, default=1024, help="with --serve: tokens per prompt (default 1024)")
    serving.add_argument("--new-tokens", type=int, default=256, help="with --serve: tokens generated per prompt (default 256)")
    parser.add_argument("--top", type=int, default=10, help="layouts shown from a search (default 10)")
    parser.add_argument("--format", default="text", choices=["text", "json"])
    parser.add_argument("--output", help="write the plan to this file (atomically) instead of stdout")
    parser.add_argument("--debug", action="store_true", help="show tracebacks")
    return parser


def _plan_model(args: argparse.Namespace) -> tuple[nn.Module, str]:
    """The model to plan, on the meta device in ``--dtype``, and its name for the printout."""
    if sum(map(bool, (args.model, args.example, args.published))) != 1:
        raise UsageError("give one model: a model's name, --example NAME or --published ROW")
    if args.published:
        run = next(run for run in MEGATRON_H100 if run.name == args.published)
        return run.model(), f"Megatron-LM's {run.name} GPT"
    if args.example:  # its configuration, as a named model's, with the head --task names
        configured = all_examples()[args.example].configured(_example_settings(args.example, args.config))
        return model_from_config(configured.to_dict(), args.task, "meta").to(DTYPES[args.dtype]), args.example
    return model_from_name(args.model, args.task, "meta", _parse_config(args.config)).to(DTYPES[args.dtype]), args.model


def run_plan(args: argparse.Namespace) -> str:
    """``jitflops plan``: one layout's plan, or the best layouts of a search."""
    if args.output:
        check_writable(args.output)
    model, name = _plan_model(args)
    published = next((run for run in MEGATRON_H100 if run.name == args.published), None)
    if published is not None:  # its GPUs and batch, and its layout unless GPUs are given (then the search's)
        if not args.gpus and not any((args.tp, args.pp, args.dp)):
            args.tp, args.pp, args.dp = published.tp, published.pp, published.dp
        args.gpus, args.batch = args.gpus or published.gpus, args.batch or published.global_batch
    if args.serve:
        return _serving_report(args, model, name)
    if not args.gpus or not args.batch:
        raise UsageError("give --gpus N and --batch SEQUENCES (the global batch)")
    if any((args.tp, args.pp, args.dp, args.cp > 1, args.ep > 1)):
        plan = plan_training(model, args.sequence, args.batch, args.device, args.gpus, args.interconnect, tp=args.tp or 1, pp=args.pp or 1, dp=args.dp,
                             cp=args.cp, ep=args.ep, zero=args.zero, micro_batch=args.micro_batch, schedule=args.schedule,
                             virtual_stages=args.virtual_stages, recompute=args.recompute, optimizer=args.optimizer, tokens=args.tokens)
        if args.format == "json":
            return json.dumps({**plan.to_dict(), "published_tflops_per_gpu": published.tflops_per_gpu if published else None}, indent=2)
        text = plan_text(plan, name)
        if published is not None:
            text += (f"\n  published: {published.tflops_per_gpu} TFLOP/s per GPU; planned {plan.model_tflops_per_gpu / published.tflops_per_gpu - 1:+.1%}")
        return text
    spec = device_spec(args.device)
    planner = Planner(model, args.sequence, args.batch, spec, args.interconnect or spec.name, args.optimizer)
    found = best_layouts(planner, args.gpus, args.micro_batch, args.tokens)
    if not found.plans:
        raise UsageError(f"no layout of {args.gpus} GPUs divides the model and the batch of {args.batch}: " + "; ".join(found.rejected[:4]))
    if args.format == "json":
        return json.dumps({"plans": [plan.to_dict() for plan in found.plans[: args.top]], "rejected": list(found.rejected)}, indent=2)
    rejected = "".join(f"\n  {why}" for why in found.rejected[:8]) + (f"\n  ... and {len(found.rejected) - 8} more" if len(found.rejected) > 8 else "")
    return (f"{len(found.plans)} layouts of {args.gpus} GPUs planned, best first:\n{plans_table(found.plans[: args.top])}\n\n"
            f"The best:\n{plan_text(found.plans[0], name)}" + (f"\n\nLeft out:{rejected}" if rejected else ""))


def _serving_report(args: argparse.Namespace, model: nn.Module, name: str) -> str:
    """``jitflops plan --serve``: generate()'s plan at each tensor parallelism asked, or every one of a node that divides the heads."""
    spec = device_spec(args.device)
    link = interconnect(args.interconnect or spec.name)
    heads = key_value_heads(model) or 1
    widest = min((args.gpus or link.gpus_per_node * (args.pp or 1)) // (args.pp or 1), link.gpus_per_node)
    sizes = [args.tp] if args.tp else [tp for tp in range(1, widest + 1) if heads % tp == 0]
    plans = [plan_serving(model, args.prompt, args.new_tokens, args.batch or 1, spec, tp, link, pp=args.pp or 1) for tp in sizes]
    if args.format == "json":
        return json.dumps({"serving": [plan.to_dict() for plan in plans]}, indent=2)
    return serving_text(plans, name)


def _emit(args: argparse.Namespace, report: str) -> None:
    if args.output:
        write_text(args.output, report)
    else:
        print(report)


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["calibrate"]:
        return calibrate_main(argv[1:])
    planning = argv[:1] == ["plan"]
    args = make_plan_parser().parse_args(argv[1:]) if planning else make_parser().parse_args(argv)
    try:
        try:
            report = run_plan(args) if planning else run(args)
        except NothingFits as nothing:  # its report, then the error line
            _emit(args, nothing.report)
            raise
        _emit(args, report)
    except KeyboardInterrupt:
        print("jitflops: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader (e.g. `head`) stopped early: leave quietly, as Python's docs advise
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except Exception as error:  # one clear line for the user; --debug shows where it came from
        if args.debug:
            raise
        print(f"jitflops: error: {one_line(error)}", file=sys.stderr)
        return 2
    return 0
