"""Models built from a name alone, with no weights: "what does ``meta-llama/Llama-3.1-8B`` cost at 4k tokens?"

:func:`model_from_name` takes

* a Hugging Face Hub id (``meta-llama/Llama-3.1-8B``; one of the Hub's oldest, without an
  organisation: ``gpt2``; ``org/repo/subfolder`` for a component of a diffusers pipeline): only its
  ``config.json`` is fetched, through the Hub's own client and cache (a token from ``HF_TOKEN``,
  offline with ``HF_HUB_OFFLINE=1`` from a cache filled before);
* a local model folder, or a ``config.json`` file;
* a timm name (``timm/resnet50.a1_in1k``), built with ``pretrained=False``.

A transformers config builds the class it names (``architectures[0]``: a checkpoint is the class its
config names, ``LlamaForCausalLM`` with its head, not the base ``LlamaModel``), the base model with
a warning saying why where transformers has no such class, or ``AutoModelFor<Task>`` with
``task``; a diffusers component config (``_class_name``: ``UNet2DConditionModel``, ...) its
class. Models are built on the meta device by default: no memory for weights, counted without
computing.
"""

from __future__ import annotations

import difflib
import json
import os
import re
import warnings
from pathlib import Path
from typing import Any, Mapping, Optional, Union

import torch
from torch import nn

from .core.errors import JitflopsError

TIMM_PREFIXES = ("timm/", "hf-hub:timm/", "hf_hub:timm/")


class ModelNameError(JitflopsError):
    """A model name that names nothing buildable: the message says what was looked for."""


def looks_like_model_name(text: str) -> bool:
    """Whether ``text`` names a model (a Hub id, a path, a timm name) rather than a ``MODULE:CALLABLE`` factory."""
    return ":" not in text.replace("hf-hub:", "").replace("hf_hub:", "") or os.path.exists(text)


def model_from_name(
    name: str, task: Optional[str] = None, device: Union[str, torch.device] = "meta", overrides: Optional[Mapping[str, Any]] = None
) -> nn.Module:
    """The model ``name`` names, built from its configuration alone on ``device``, in eval mode;
    ``overrides`` replace settings of its configuration (``{"num_hidden_layers": 2}``)."""
    if name.startswith(TIMM_PREFIXES):
        with torch.device(device):
            return _timm_model(name.split("timm/", 1)[1], overrides or {}).eval()
    return model_from_config({**_config_of(name), **(overrides or {})}, task, device)


def model_from_config(config: Mapping[str, Any], task: Optional[str] = None, device: Union[str, torch.device] = "meta") -> nn.Module:
    """The model a configuration describes (a ``config.json``'s contents: transformers' or a
    diffusers component's), built on ``device``, in eval mode, as :func:`model_from_name` builds a
    named one's."""
    with torch.device(device):
        if "_class_name" in config:
            return _diffusers_model(dict(config)).eval()
        return _transformers_model(dict(config), task).eval()


def _config_of(name: str) -> dict[str, Any]:
    path = Path(name)
    if path.is_file():
        return _read_json(path)
    if path.is_dir():
        if (path / "config.json").is_file():
            return _read_json(path / "config.json")
        if (path / "model_index.json").is_file():
            components = sorted(child.name for child in path.iterdir() if (child / "config.json").is_file())
            raise ModelNameError(f"{name!r} is a diffusers pipeline: name one of its components ({', '.join(components)}), e.g. {name.rstrip('/')}/{components[0] if components else 'unet'}")
        raise ModelNameError(f"the folder {name!r} has no config.json")
    if name.startswith((".", "/", "~")) or name.endswith(".json"):  # a path, which a Hub id never is
        raise ModelNameError(f"{name!r}: no such file or folder")
    return _read_json(Path(_hub_config(name)))


def _read_json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as error:
        raise ModelNameError(f"cannot read the model's configuration {str(path)!r}: {error}") from None


def _hub_config(name: str) -> str:
    """The local path of the Hub repository's ``config.json`` (``org/repo``, ``org/repo/subfolder``, or
    a repository without an organisation, as the Hub's oldest ids are: ``gpt2``, ``bert-base-uncased``)."""
    parts = name.strip("/").split("/")
    if len(parts) == 1:
        where = f"{name!r} is no file or folder here, nor a timm name (timm/...); as a Hub id"
    else:
        where = f"{'/'.join(parts[:2])!r}"
    try:
        from huggingface_hub import hf_hub_download
        from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError
    except ImportError:
        raise ModelNameError(f"a Hub id ({name!r}) needs huggingface_hub: pip install huggingface_hub") from None
    repo, subfolder = "/".join(parts[:2]), "/".join(parts[2:]) or None
    try:
        return hf_hub_download(repo, "config.json", subfolder=subfolder)
    except LocalEntryNotFoundError as error:
        raise ModelNameError(f"{where}, its config.json is not in the Hub cache and the Hub cannot be reached (offline): {error}") from None
    except (HfHubHTTPError, OSError, ValueError) as error:
        raise ModelNameError(f"{where}, its config.json cannot be fetched from the Hub (a private or gated repository needs HF_TOKEN): {error}") from None


def _transformers_model(config: dict[str, Any], task: Optional[str]) -> nn.Module:
    try:
        import transformers
    except ImportError:
        raise ModelNameError("a transformers config needs transformers: pip install transformers") from None
    settings = dict(config)
    model_type = settings.pop("model_type", None)
    if model_type is None:
        raise ModelNameError("the config.json has no model_type (transformers) nor _class_name (diffusers)")
    try:
        hf_config = transformers.AutoConfig.for_model(model_type, **settings)
    except ValueError as error:
        raise ModelNameError(f"transformers {transformers.__version__} does not know model_type {model_type!r}: {error}") from None
    named = None if task else _named_architecture(transformers, config.get("architectures"), type(hf_config))
    if named is not None:
        return named._from_config(hf_config)  # as AutoModel builds a class: under the config's dtype
    auto_class = _auto_class(transformers, task)
    try:
        return auto_class.from_config(hf_config)
    except ValueError as error:
        raise ModelNameError(f"{auto_class.__name__} has no {model_type!r} model: {error}") from None


def _named_architecture(transformers: Any, architectures: Any, config_class: type) -> Optional[type]:
    """The class a config names first in ``architectures``, where transformers has it for this
    config; None, with a warning saying why the base model is built instead, where it does not."""
    name = architectures[0] if isinstance(architectures, list) and architectures else None
    found = getattr(transformers, name, None) if isinstance(name, str) else None
    if found is not None and isinstance(found, type) and issubclass(found, transformers.PreTrainedModel) and issubclass(config_class, found.config_class):
        return found
    if name is None:
        reason = "the config names no architectures"
    elif found is None:
        reason = f"transformers {transformers.__version__} has no class {name!r}, the config's architectures[0] (a model with its own code?)"
    else:
        reason = f"the config's architectures[0], {name!r}, is no model of a {config_class.__name__}"
    warnings.warn(f"jitflops: {reason}: the base model is built (a task picks a head: --task causal-lm)", stacklevel=4)
    return None


def _auto_class(transformers: Any, task: Optional[str]) -> Any:
    """``AutoModel`` (the base model: no task, or ``model``), or ``AutoModelFor<Task>`` for a task
    written ``causal-lm``, ``causal_lm`` or ``CausalLM``."""
    if not task or task.lower() == "model":
        return transformers.AutoModel
    words = re.split(r"[-_]", task)
    name = "AutoModelFor" + "".join("LM" if word.lower() == "lm" else word[:1].upper() + word[1:] for word in words)
    found = getattr(transformers, name, None)
    if found is None:
        known = sorted(n.removeprefix("AutoModelFor") for n in dir(transformers) if n.startswith("AutoModelFor"))
        close = difflib.get_close_matches(name.removeprefix("AutoModelFor"), known, n=1)
        raise ModelNameError(f"no task {task!r} in transformers{f'; did you mean {close[0]!r}?' if close else ''} (tasks: {', '.join(known)})")
    return found


def _diffusers_model(config: dict[str, Any]) -> nn.Module:
    try:
        import diffusers
    except ImportError:
        raise ModelNameError("a diffusers component config needs diffusers: pip install diffusers") from None
    class_name = config["_class_name"]
    model_class = getattr(diffusers, class_name, None)
    if model_class is None:
        raise ModelNameError(f"diffusers {diffusers.__version__} has no model class {class_name!r}")
    return model_class.from_config(config)


def _timm_model(name: str, overrides: Mapping[str, Any]) -> nn.Module:
    try:
        import timm
    except ImportError:
        raise ModelNameError("a timm name needs timm: pip install timm") from None
    try:
        return timm.create_model(name, pretrained=False, **overrides)
    except RuntimeError as error:
        raise ModelNameError(f"timm has no model {name!r}: {error}") from None
