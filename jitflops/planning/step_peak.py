"""A rank's peak in a training step of a model with many blocks, from the recorded step of a copy
that holds three blocks of each kind.

A step's memory moves with its blocks. The forward keeps each block's saved activations (and, where
the model returns a cache, its keys and values) until that block's backward frees them; the backward
leaves each block's gradients behind it, unless a buffer holds them all the step (data
parallelism's, or a later micro-batch's accumulation). Inside block ``k``'s backward (``k`` blocks
above it done), a model of ``L`` blocks holds ``k`` blocks' gradients and ``L - 1 - k`` blocks'
activations beside what the block has in hand: the most over ``k`` is at one end,
``(L - 1) * max(a, g)``. What a block has in hand depends on its neighbours: under FSDP2 it
prefetches the next block's weights, and the reduce-scatter of the block before it still holds that
block's unsharded gradients. Three blocks show a block between two others: the copy's step is
recorded (the memory estimate, exact against ``MemTracker``), and each moment of it is lifted to
``L`` blocks by what the blocks it lacks hold then (:data:`SEGMENTS`).

Before 2026-11-29 a plan added a one-block copy's "transient" at its peak to all blocks' saved
activations and gradients, which missed FSDP2's prefetched block and the gradients in the
reduce-scatter (-4% against the whole model's estimate on 4 ranks) and put every gradient beside
every activation (+7% under FSDP2 by tensor parallelism).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Container, Mapping, Optional, Sequence

from ..estimates.memory_estimate import StepRecord
from ..estimates.memory_recorder import BACKWARD, FORWARD, OPTIMIZER

PERSISTENT = frozenset({"parameters", "optimizer_state"})
"""What a plan counts apart, per rank and layout (ZeRO's shares of them)."""

SEGMENTS = ("before the blocks", "forward", "backward of the middle blocks", "backward of the first block", "optimizer")
"""The parts of the copy's step, each lifted by what a block it lacks holds then: nothing before its
first block's forward; its activations and outputs from there through the head's backward and the
last block's (a block in the copy's middle stands for every block between); the larger of
activations and gradients (beside its outputs) in the middle block's backward; its gradients and
outputs once the first block's backward has begun; its gradients in the optimizer's step."""


def _within(module: str, block: str) -> bool:
    return module == block or module.startswith(f"{block}.")


@dataclass(frozen=True)
class BlockShare:
    """What one block of a kind holds as the plan sees it: its saved activations, its gradients (0
    where a buffer holds them apart) and the outputs it adds to the model's (a returned cache)."""

    activation_bytes: float
    gradient_bytes: float
    output_bytes: float

    def held(self, segment: str) -> float:
        """What one more such block holds during ``segment`` of the copy's step."""
        if segment == "before the blocks":
            return 0.0
        if segment == "optimizer":
            return self.gradient_bytes
        made = {"forward": self.activation_bytes, "backward of the middle blocks": max(self.activation_bytes, self.gradient_bytes)}
        return made.get(segment, self.gradient_bytes) + self.output_bytes


@dataclass(frozen=True)
class CopiedStep:
    """The copy's recorded step, read by block (``blocks``: the copy's, in the model's order;
    ``kinds``: each one's kind): which block (its position; None outside them) each saved
    activation, gradient and output is of. A saved activation is a storage autograd saved in the
    forward and still holds when the backward starts (FSDP2's gathered weights, saved too, are freed
    at the end of the forward). Each reading is taken once: a search plans every layout from it."""

    step: StepRecord
    blocks: Sequence[str]
    kinds: Sequence[int]

    def _block_of(self, module: str) -> Optional[int]:
        return next((position for position, name in enumerate(self.blocks) if _within(module, name)), None)

    @cached_property
    def _lives(self) -> dict[str, dict[int, Optional[int]]]:
        recording, categories, backward = self.step.recording, self.step.categories, self.step.recording.phase_starts[BACKWARD]
        return {
            "saved_activations": {index: self._block_of(module) for index, module in recording.saved.items()
                                  if categories.get(index) == "saved_activations" and recording.lives[index].alive_at(backward)},
            "gradients": {index: self._block_of(self.step.owners.get(index, "")) for index, found in categories.items() if found == "gradients"},
            "outputs": {index: self._block_of(recording.lives[index].module) for index, found in categories.items() if found == "outputs"},
        }

    def lives(self, category: str) -> dict[int, Optional[int]]:
        """The lives of ``category`` (saved activations, gradients or outputs), each with its block."""
        return self._lives[category]

    @cached_property
    def _per_block(self) -> dict[str, list[int]]:
        found = {category: [0] * (len(self.blocks) + 1) for category in self._lives}
        for category, lives in self._lives.items():
            for index, block in lives.items():
                found[category][len(self.blocks) if block is None else block] += self.step.recording.lives[index].nbytes
        return found

    def per_block(self, category: str) -> list[int]:
        """The bytes of :meth:`lives` of ``category`` of each block, then of the rest."""
        return self._per_block[category]

    def middle_block(self, kind: int) -> int:
        """The copy's block that stands for one of ``kind``: the middle one of its kind (the first
        also saves what the blocks share, a 1-D mask or the rotary tables)."""
        return self.kinds.index(kind) + self.kinds.count(kind) // 2

    @cached_property
    def _first_freed(self) -> list[int]:
        """Per block, the tick the first of its saved activations is freed at: its backward's start."""
        recording = self.step.recording
        firsts: dict[int, int] = {}
        for index, block in self._lives["saved_activations"].items():
            died = recording.lives[index].died
            if block is not None and died is not None:
                firsts[block] = min(firsts.get(block, died), died)
        return [firsts.get(block, recording.phase_starts[BACKWARD]) for block in range(len(self.blocks))]

    @cached_property
    def _blocks_forward(self) -> tuple[int, int]:
        """The ticks the first block's forward starts at and the last block's ends at."""
        calls = self.step.recording.calls
        return min(call.start for call in calls if call.module == self.blocks[0]), max(call.end for call in calls if call.module == self.blocks[-1])

    @cached_property
    def outside_parts(self) -> dict[int, str]:
        """The lives (their index) the parts outside the blocks made, each with its part: the
        "embeddings" before the first block's forward and once the first block's backward has begun
        (the embeddings' own backward), the "head" from the end of the last block's forward until
        the last of its own saved activations is freed (the last norm, the head, the loss and their
        backward; a block's backward makes its gradients with no module running). What the blocks
        share (made among them) and the optimizer's are in neither."""
        recording = self.step.recording
        forward, last = self._blocks_forward
        first_backward, optimizer = self._first_freed[0], recording.phase_starts[OPTIMIZER]
        head_backward = max((recording.lives[index].died or optimizer for index, block in self._lives["saved_activations"].items()
                             if block is None and recording.lives[index].born >= last), default=self._first_freed[-1])
        inside = {index for lives in self._lives.values() for index, block in lives.items() if block is not None}
        parts = {}
        for index, life in enumerate(recording.lives):
            if index in inside or self._block_of(life.module) is not None:
                continue
            if life.born < forward or first_backward <= life.born < optimizer:
                parts[index] = "embeddings"
            elif last <= life.born < head_backward:
                parts[index] = "head"
        return parts

    @cached_property
    def segment_starts(self) -> list[int]:
        """The tick each of :data:`SEGMENTS` starts at: the forward's, the first block's first
        forward call, the first saved activation freed of the block before the last (the middle
        one), of the first block, and the optimizer's step."""
        recording = self.step.recording
        middle = self._first_freed[max(len(self.blocks) - 2, 0)]
        return [recording.phase_starts[FORWARD], self._blocks_forward[0], middle, max(middle, self._first_freed[0]), recording.phase_starts[OPTIMIZER]]


def extrapolated_peak(copied: CopiedStep, counts: Mapping[int, int], activation_scales: Sequence[float],
                      gradient_bytes: Sequence[float], root_gradient_bytes: float, outside: Container[str] = ("embeddings", "head"),
                      accumulated: bool = False, received_input: float = 0.0, received_gradient: float = 0.0) -> int:
    """The most a rank holds at once in the step, parameters and optimizer state left out, with
    ``counts`` blocks of each kind. Per kind, what the plan's block
    holds of the copy's saved activations (``activation_scales``: sequence parallelism splits them)
    and its gradients (``gradient_bytes``: ZeRO's share); and the gradients outside the blocks;
    ``accumulated``: a buffer holds the gradients all the step (the plan counts it apart), and each
    one the backward makes is added into it and freed at once (autograd's accumulation, a DDP
    bucket's copy); ``received_input``: the input a rank receives into a buffer counted apart (a
    pipeline stage after the first: its first block saves it there), which the copy's first block
    saves as the embeddings made it, from its forward through its backward; ``received_gradient``:
    the gradient of its output a rank receives so (a stage before the last), where the copy makes it
    in the backward of the block after its first and middle blocks (counted for a stage of one
    block, for which those moments stand); ``outside``: the parts outside the blocks the rank holds (a
    pipeline's first stage the embeddings, its last the head: :attr:`CopiedStep.outside_parts`).
    Each moment of the copy's step, its blocks' activations and gradients scaled to the plan's, gets
    what the blocks it lacks hold then (:data:`SEGMENTS`), one of each kind as its
    :meth:`CopiedStep.middle_block` holds it."""
    recording = copied.step.recording
    activations, gradients = copied.lives("saved_activations"), copied.lives("gradients")
    saved, made, outputs = copied.per_block("saved_activations"), copied.per_block("gradients"), copied.per_block("outputs")
    kinds = copied.kinds
    shares = {kind: BlockShare(saved[block] * activation_scales[kind], 0.0 if accumulated else gradient_bytes[kind], outputs[block])
              for kind, block in ((kind, copied.middle_block(kind)) for kind in set(kinds))}
    saved_scales = [activation_scales[kind] for kind in kinds] + [1.0]
    gradient_scales = [gradient_bytes[kind] / made[block] if made[block] else 0.0 for block, kind in enumerate(kinds)]
    gradient_scales.append(root_gradient_bytes / made[-1] if made[-1] else 0.0)
    starts = copied.segment_starts
    apart = {"forward": received_input, "backward of the middle blocks": received_input + received_gradient,
             "backward of the first block": received_input + received_gradient}
    lifted = [sum((counts.get(kind, 0) - kinds.count(kind)) * share.held(segment) for kind, share in shares.items()) - apart.get(segment, 0.0)
              for segment in SEGMENTS]
    changes: list[tuple[int, float]] = [(tick, 0.0) for tick in starts]
    elsewhere = {index for index, part in copied.outside_parts.items() if part not in outside}
    for index, life in enumerate(recording.lives):
        if copied.step.categories.get(index) in PERSISTENT or index in elsewhere:
            continue
        scale = 1.0
        if index in gradients or index in activations:
            block = gradients[index] if index in gradients else activations[index]
            scale = (gradient_scales if index in gradients else saved_scales)[len(kinds) if block is None else block]
        changes.append((life.born, scale * life.nbytes))
        if accumulated and index in gradients:
            changes.append((life.born + 1, -scale * life.nbytes))
        elif life.died is not None:
            changes.append((life.died, -scale * life.nbytes))
    changes.sort()
    alive = best = 0.0
    for tick, delta in changes:
        alive += delta
        if tick >= starts[0]:
            best = max(best, alive + lifted[sum(start <= tick for start in starts[1:])])
    return int(best)
