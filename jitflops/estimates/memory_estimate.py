"""What a memory estimate found, as data: the peak, what was alive at it, and each module's share.

Built by :mod:`jitflops.estimates.memory_footprint` from a :class:`~jitflops.estimates.memory_recorder.MemoryRecording`
by the pure functions here; printed by :mod:`jitflops.reports.memory_report`. Every figure is bytes.
"""

from __future__ import annotations

import bisect
import dataclasses
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Optional, Union

from .devices import DeviceSpec, device_spec
from .memory_recorder import FORWARD, MemoryRecording

CATEGORIES = ("parameters", "buffers", "inputs", "gradients", "optimizer_state", "saved_activations", "outputs", "temporaries")
"""What a live storage is, in the order the printouts show them. ``optimizer_state`` holds fp32
master weights too; ``outputs`` are the forward's outputs (kept until the backward has run);
``temporaries`` everything else (an op's workspace, a gradient on its way, an all-gathered
parameter)."""


@dataclass(frozen=True)
class ModuleMemory:
    """One module's memory, its submodules' included (a storage counted once, in the module that
    made it). ``temporaries`` is a peak, not a sum: the most the module's forward held at once
    beyond what it kept when it returned. ``unseen_saved``: bytes its forward left alive that
    autograd's saved-tensor hooks did not see and the output does not hold (a custom autograd
    ``Function`` keeping tensors on ``ctx``, or state the module keeps itself)."""

    name: str
    parameters: int = 0
    buffers: int = 0
    gradients: int = 0
    optimizer_state: int = 0
    saved_activations: int = 0
    temporaries: int = 0
    unseen_saved: int = 0

    @property
    def total(self) -> int:
        """What the module holds through a training step: weights, gradients, state and saved activations."""
        return self.parameters + self.buffers + self.gradients + self.optimizer_state + self.saved_activations


@dataclass(frozen=True)
class KVCache:
    """A generation cache: its bytes per token of one sequence; ``batch`` sequences of ``length``
    tokens hold :attr:`bytes`, of which the estimated call's ``prompt`` tokens are in its peak."""

    bytes_per_token: int
    batch: int
    prompt: int
    length: int

    @property
    def bytes(self) -> int:
        return self.bytes_per_token * self.batch * self.length

    @property
    def growth(self) -> int:
        """Bytes the cache grows by from the prompt to ``length`` tokens."""
        return self.bytes_per_token * self.batch * max(self.length - self.prompt, 0)


@dataclass(frozen=True)
class StepRecord:
    """The recorded step an estimate was read from: every storage's life, what each turned out to
    be (:data:`CATEGORIES`; unclaimed ones are temporaries or saved activations) and the module
    owning each parameter's, gradient's or state's storage. A planner extrapolates its timeline to
    a model with more blocks (:mod:`jitflops.planning.step_peak`)."""

    recording: MemoryRecording
    categories: Mapping[int, str]
    owners: Mapping[int, str]


@dataclass(frozen=True)
class MemoryEstimate:
    """A step's memory: ``mode`` is ``inference`` (the forward under ``no_grad``) or ``training``
    (forward, backward, optimizer step, with the optimizer's state as after a first step)."""

    mode: str
    peak: int
    peak_phase: str
    at_peak: Mapping[str, int]
    """Bytes alive at the peak per category (:data:`CATEGORIES`)."""
    modules: Mapping[str, ModuleMemory]
    """Every module by name ("" is the model), parents before children."""
    optimizer: Optional[str] = None
    settings: Mapping[str, Any] = field(default_factory=dict)
    """What the step ran with: dtype, autocast, master weights, checkpointing, FSDP ranks, batch."""
    kv_cache: Optional[KVCache] = None
    rounding: int = 1
    step: Optional[StepRecord] = field(default=None, repr=False, compare=False)
    """The recorded step itself (left out of :meth:`to_dict`)."""

    @property
    def model(self) -> ModuleMemory:
        return self.modules[""]

    @property
    def unseen_saved_modules(self) -> list[str]:
        """Modules whose forward left memory alive that saved-tensor hooks did not see (innermost first)."""
        flagged = [m.name for m in self.modules.values() if m.unseen_saved]
        return [name for name in flagged if not any(other.startswith(name + ".") or (not name and other) for other in flagged)]

    def capacity_of(self, memory: Union[int, str, DeviceSpec]) -> int:
        """Bytes of ``memory``: a number of bytes, or a device (a name of the device table, a spec)."""
        if isinstance(memory, bool) or not isinstance(memory, (int, str, DeviceSpec)):
            raise TypeError(f"memory must be bytes (an int) or a device name or spec, got {type(memory).__name__}")
        if isinstance(memory, int):
            return memory
        spec = device_spec(memory)
        if spec.memory_bytes is None:
            raise ValueError(f"device {spec.name!r} has no memory size in its spec: give the memory in bytes")
        return spec.memory_bytes

    def needed(self) -> int:
        """The peak, with the KV cache grown to its full length where the estimate has one."""
        return self.peak + (self.kv_cache.growth if self.kv_cache else 0)

    def fits(self, memory: Union[int, str, DeviceSpec]) -> bool:
        """Whether the peak fits in ``memory`` (bytes, or a device of the device table)."""
        return self.needed() <= self.capacity_of(memory)

    def to_dict(self) -> dict[str, Any]:
        document = dataclasses.asdict(dataclasses.replace(self, step=None))
        del document["step"]
        document["modules"] = [dataclasses.asdict(module) for module in self.modules.values()]
        document["needed"] = self.needed()
        document["settings"] = {key: str(value) if value is not None and not isinstance(value, (int, float, bool, str)) else value for key, value in self.settings.items()}
        return document


def _ancestors(name: str) -> list[str]:
    """``a.b.c`` -> ``["", "a", "a.b", "a.b.c"]``."""
    parts = name.split(".") if name else []
    return [""] + [".".join(parts[: i + 1]) for i in range(len(parts))]


def peak_of(recording: MemoryRecording, since: int) -> tuple[int, int]:
    """The most bytes alive at once from tick ``since`` on, and the tick it was reached at."""
    changes: list[tuple[int, int]] = []
    for life in recording.lives:
        changes.append((life.born, life.nbytes))
        if life.died is not None:
            changes.append((life.died, -life.nbytes))
    changes.sort()
    alive = best = 0
    best_tick = since
    for tick, delta in changes:
        alive += delta
        if tick >= since and alive > best:
            best, best_tick = alive, tick
    return best, best_tick


def phase_at(recording: MemoryRecording, tick: int) -> str:
    started = [(start, phase) for phase, start in recording.phase_starts.items() if start <= tick]
    return max(started)[1] if started else "setup"


def bytes_by_category(recording: MemoryRecording, categories: Mapping[int, str], tick: int) -> dict[str, int]:
    """Bytes alive at ``tick`` per category (``categories``: a life's index -> its category; others are temporaries)."""
    found = dict.fromkeys(CATEGORIES, 0)
    for index, life in enumerate(recording.lives):
        if life.alive_at(tick):
            found[categories.get(index, "temporaries")] += life.nbytes
    return found


def _temporaries_per_module(recording: MemoryRecording) -> dict[str, int]:
    """Each module's largest transient: over its forward calls, the most bytes allocated inside the
    call and alive at once, less what was still alive when the call returned."""
    peaks: dict[str, int] = {}
    lives = sorted(recording.lives, key=lambda life: life.born)
    births = [life.born for life in lives]

    for call in recording.calls:
        if call.end < 0:
            continue
        inside = lives[bisect.bisect_left(births, call.start): bisect.bisect_right(births, call.end)]
        changes = sorted([(life.born, life.nbytes) for life in inside] + [(life.died, -life.nbytes) for life in inside if life.died is not None and life.died <= call.end])
        alive = most = 0
        for _, delta in changes:
            alive += delta
            most = max(most, alive)
        kept = sum(life.nbytes for life in inside if life.died is None or life.died > call.end)
        peaks[call.module] = max(peaks.get(call.module, 0), most - kept)
    return peaks


def module_memory(
    module_names: Iterable[str],
    owners: Mapping[int, str],
    categories: Mapping[int, str],
    recording: MemoryRecording,
    unseen: Iterable[int],
) -> dict[str, ModuleMemory]:
    """Each module's bytes per category, its submodules' included. ``owners``: the module owning a
    parameter's, buffer's, gradient's or state's life (index); saved activations belong to the
    module that saved them, unseen ones to the module that made them."""
    totals: dict[str, dict[str, int]] = {name: {} for name in module_names}

    def add(module: str, key: str, nbytes: int) -> None:
        for name in _ancestors(module):
            if name in totals:
                totals[name][key] = totals[name].get(key, 0) + nbytes

    lives = recording.lives
    for index, module in owners.items():
        add(module, categories[index], lives[index].nbytes)
    for index, module in recording.saved.items():
        if categories.get(index) == "saved_activations":
            add(module, "saved_activations", lives[index].nbytes)
    for index in unseen:
        add(lives[index].module, "unseen_saved", lives[index].nbytes)
    temporaries = _temporaries_per_module(recording)
    return {
        name: ModuleMemory(name, **counts, temporaries=temporaries.get(name, 0))
        for name, counts in totals.items()
    }


def unseen_saved(recording: MemoryRecording, categories: Mapping[int, str], forward_end: int) -> list[int]:
    """Lives made in the forward, alive after it, that no category claims: kept by something
    saved-tensor hooks do not see."""
    return [
        index for index, life in enumerate(recording.lives)
        if life.phase == FORWARD and index not in categories and life.alive_at(forward_end)
    ]

