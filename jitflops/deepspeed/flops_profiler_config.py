"""The ``flops_profiler`` section of a DeepSpeed config, as the engine reads it."""

from __future__ import annotations

import difflib
import json
import os
import warnings
from dataclasses import dataclass, fields
from typing import Any, Mapping, Optional, Union


@dataclass(frozen=True)
class FlopsProfilerConfig:
    """The ``flops_profiler`` section of a DeepSpeed config, with DeepSpeed's defaults."""

    enabled: bool = False
    recompute_fwd_factor: float = 0.0
    profile_step: int = 1
    module_depth: int = -1
    top_modules: int = 1
    detailed: bool = True
    output_file: Optional[str] = None

    @classmethod
    def from_deepspeed(cls, config: Union[Mapping[str, Any], str, os.PathLike]) -> "FlopsProfilerConfig":
        """From a whole DeepSpeed config (dict or JSON file) or just its ``flops_profiler`` section.
        Unknown keys are ignored, as DeepSpeed ignores them, with a warning naming the closest key."""
        if not isinstance(config, Mapping):
            with open(config, encoding="utf-8") as file:
                config = json.load(file)
        known = [f.name for f in fields(cls)]
        section = config["flops_profiler"] if "flops_profiler" in config else config if set(config) & set(known) else {}
        for key in section:
            if key not in known:  # DeepSpeed ignores it silently; a typo should not go unnoticed
                close = [name for name in known if key in name] or difflib.get_close_matches(key, known, n=1)
                hint = f"did you mean {close[0]!r}?" if close else f"known keys: {', '.join(known)}"
                warnings.warn(f"unknown key {key!r} in the flops_profiler config is ignored, as DeepSpeed ignores it; {hint}", stacklevel=3)
        return cls(**{key: value for key, value in section.items() if key in known})
