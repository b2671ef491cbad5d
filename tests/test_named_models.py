"""Any model by name, offline: a model folder, a ``config.json`` and a Hub id resolved from a Hub
cache laid out as the Hub's client lays it out (``HF_HUB_OFFLINE=1``), each counting Llama-3-8B's
shape on the meta device, checked against the hand count. A name builds the class its config names
(``LlamaForCausalLM``), as its checkpoint is: 8.03 G parameters and 35.137 T MACs at 4,096 tokens."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")

from jitflops import FlopCountAnalysis  # noqa: E402
from jitflops.named_models import ModelNameError, model_from_name  # noqa: E402

LLAMA_3_8B = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336,
    "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256,
    "max_position_embeddings": 131072, "rms_norm_eps": 1e-05, "rope_theta": 500000.0, "hidden_act": "silu",
    "bos_token_id": 128000, "eos_token_id": 128001, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
}
TOKENS = 4096
LLAMA_3_8B_PARAMETERS = 8_030_261_248
"""Llama-3-8B's published size (the sum of its checkpoint's tensors), head included."""


def _llama_macs(config: dict, tokens: int, lm_head: bool = False) -> int:
    """By hand: every projection's weight once per token, attention's two products per head, the
    language-model head if asked for (norms and activations are elementwise: not counted)."""
    hidden, heads, kv_heads = config["hidden_size"], config["num_attention_heads"], config["num_key_value_heads"]
    head_dim = hidden // heads
    projections = hidden * hidden * 2 + hidden * kv_heads * head_dim * 2 + 3 * hidden * config["intermediate_size"]
    attention = heads * tokens * tokens * 2 * head_dim
    layers = config["num_hidden_layers"] * (tokens * projections + attention)
    return layers + (tokens * hidden * config["vocab_size"] if lm_head else 0)


@pytest.fixture
def llama_folder(tmp_path: Path) -> Path:
    folder = tmp_path / "Llama-3-8B"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(LLAMA_3_8B))
    return folder


def _count(model) -> int:
    import torch

    return FlopCountAnalysis(model, torch.zeros(1, TOKENS, dtype=torch.long, device="meta")).unsupported_ops_warnings(False).total()


def test_a_folder_and_a_config_file_count_llama_3_8b_on_meta(llama_folder):
    for name in (str(llama_folder), str(llama_folder / "config.json")):
        model = model_from_name(name)
        assert all(p.is_meta for p in model.parameters()) and type(model).__name__ == "LlamaForCausalLM"
        assert sum(p.numel() for p in model.parameters()) == LLAMA_3_8B_PARAMETERS
        assert _count(model) == _llama_macs(LLAMA_3_8B, TOKENS, lm_head=True) == 35_137_127_448_576
    base = model_from_name(str(llama_folder), task="model")  # a task overrides the config's class
    assert type(base).__name__ == "LlamaModel" and _count(base) == _llama_macs(LLAMA_3_8B, TOKENS)
    shallow = model_from_name(str(llama_folder), overrides={"num_hidden_layers": 2})
    assert _count(shallow) == _llama_macs({**LLAMA_3_8B, "num_hidden_layers": 2}, TOKENS, lm_head=True)


@pytest.mark.parametrize("architectures, reason", [
    (None, "the config names no architectures"),
    (["LlamaForEverything"], "has no class 'LlamaForEverything'"),
    (["BertForMaskedLM"], "'BertForMaskedLM', is no model of a LlamaConfig"),
])
def test_a_config_naming_no_class_of_its_own_builds_the_base_model_and_says_why(tmp_path, architectures, reason):
    config = {key: value for key, value in LLAMA_3_8B.items() if key != "architectures"}
    if architectures:
        config["architectures"] = architectures
    (tmp_path / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 1}))
    with pytest.warns(UserWarning, match=reason):
        model = model_from_name(str(tmp_path / "config.json"))
    assert type(model).__name__ == "LlamaModel"


def _hub_cache(root: Path, repo: str, files: dict[str, dict]) -> Path:
    """A Hub cache holding ``files`` of ``repo``, as huggingface_hub lays it out: blobs, a snapshot
    per commit, and ``refs/main`` naming the commit."""
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo_folder = root / f"models--{repo.replace('/', '--')}"
    (repo_folder / "refs").mkdir(parents=True)
    (repo_folder / "refs" / "main").write_text(commit)
    for name, content in files.items():
        path = repo_folder / "snapshots" / commit / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(content))
    return root


def _cli(*args: str, cache: Path) -> subprocess.CompletedProcess:
    environment = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(cache), "HF_HOME": str(cache.parent)}
    return subprocess.run([sys.executable, "-m", "jitflops", *args], capture_output=True, text=True, timeout=300, env=environment)


def test_a_hub_id_resolves_from_the_hub_cache_offline(tmp_path, llama_folder, monkeypatch, capsys):
    cache = _hub_cache(tmp_path / "hub", "meta-llama/Meta-Llama-3-8B", {"config.json": LLAMA_3_8B})
    run = _cli("meta-llama/Meta-Llama-3-8B", "--input-ids", f"1,{TOKENS}", "--format", "json", "--quiet", cache=cache)
    assert run.returncode == 0, run.stderr
    document = json.loads(run.stdout)
    assert document["summary"]["macs"] == _llama_macs(LLAMA_3_8B, TOKENS, lm_head=True) and document["summary"]["device"] == "meta"
    assert document["summary"]["counted_by"] == "jit" and document["summary"]["model_class"] == "LlamaForCausalLM"
    assert document["summary"]["params"] == LLAMA_3_8B_PARAMETERS

    # the rest in this process (the Hub's client reads its cache and offline switch at each call)
    import huggingface_hub.constants

    from jitflops.cli import main

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    assert main(["meta-llama/Meta-Llama-3-8B", "--input-ids", "1,16", "--quiet"]) == 0
    table = capsys.readouterr().out
    assert table.startswith("Model: LlamaForCausalLM, built from meta-llama/Meta-Llama-3-8B\n"), table[:200]
    assert main([str(llama_folder), "--input-ids", f"1,{TOKENS}", "--format", "json", "--quiet", "--task", "model"]) == 0
    folder = json.loads(capsys.readouterr().out)
    assert folder["summary"]["macs"] == _llama_macs(LLAMA_3_8B, TOKENS) and folder["summary"]["model_class"] == "LlamaModel"
    missing = main(["meta-llama/Not-There", "--input-ids", "1,8"])
    error = capsys.readouterr().err
    assert missing == 2 and "not in the Hub cache" in error and "offline" in error


GPT2_CONFIG = {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "n_embd": 768, "n_head": 12, "n_layer": 12, "n_positions": 1024,
               "vocab_size": 50257}
GPT2_PARAMETERS = 124_439_808
"""GPT-2's published size (its checkpoint's tensors, the head tied to the token embedding)."""


def test_a_hub_id_without_an_organisation_resolves_as_the_hub_resolves_it(tmp_path, monkeypatch):
    """The Hub's oldest ids have no organisation (``gpt2``, ``bert-base-uncased``): they name a
    repository as ``org/repo`` does (until 2026-12-06 one was refused as naming nothing); a bare
    name that is no repository says it is no file or folder here either."""
    import huggingface_hub.constants

    cache = _hub_cache(tmp_path / "hub", "gpt2", {"config.json": GPT2_CONFIG})
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    model = model_from_name("gpt2")
    assert type(model).__name__ == "GPT2LMHeadModel" and sum(p.numel() for p in model.parameters()) == GPT2_PARAMETERS
    with pytest.raises(ModelNameError, match=r"'gpt3' is no file or folder here, nor a timm name .*; as a Hub id, its config.json is not in the Hub cache"):
        model_from_name("gpt3")
    for path in ("./no-such-model", str(tmp_path / "none"), "config.json"):  # a path is never sent to the Hub
        with pytest.raises(ModelNameError, match=r": no such file or folder$"):
            model_from_name(path)


def test_names_that_name_nothing_say_what_was_looked_for(tmp_path, llama_folder):
    with pytest.raises(ModelNameError, match="did you mean 'CausalLM'"):
        model_from_name(str(llama_folder), task="causallm")
    pipeline = tmp_path / "pipeline"
    (pipeline / "unet").mkdir(parents=True)
    (pipeline / "model_index.json").write_text("{}")
    (pipeline / "unet" / "config.json").write_text("{}")
    with pytest.raises(ModelNameError, match=r"diffusers pipeline: name one of its components \(unet\)"):
        model_from_name(str(pipeline))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelNameError, match="no config.json"):
        model_from_name(str(tmp_path / "empty"))
    with pytest.raises(ModelNameError, match="no model_type"):
        model_from_name(str(pipeline / "unet"))


def test_a_diffusers_component_folder(tmp_path):
    diffusers = pytest.importorskip("diffusers")
    import torch

    config = {"_class_name": "UNet2DModel", "sample_size": 32, "in_channels": 3, "out_channels": 3, "layers_per_block": 1,
              "block_out_channels": [32, 64], "down_block_types": ["DownBlock2D", "DownBlock2D"],
              "up_block_types": ["UpBlock2D", "UpBlock2D"], "norm_num_groups": 8}
    (tmp_path / "unet").mkdir()
    (tmp_path / "unet" / "config.json").write_text(json.dumps(config))
    model = model_from_name(str(tmp_path / "unet"), device="cpu")
    assert isinstance(model, diffusers.UNet2DModel)
    direct = diffusers.UNet2DModel.from_config(config)
    inputs = (torch.randn(1, 3, 32, 32), torch.tensor([10]))
    assert FlopCountAnalysis(model, inputs).total() == FlopCountAnalysis(direct, inputs).total() > 0
