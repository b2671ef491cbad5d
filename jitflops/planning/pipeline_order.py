"""The order in which a pipeline rank runs its micro-batches' forwards and backwards, read from
torch's own schedules (``torch.distributed.pipelining``)."""
from __future__ import annotations

from types import SimpleNamespace
from typing import NamedTuple


class Action(NamedTuple):
    """A forward or a backward of one micro-batch through one stage (a chunk of the rank's)."""

    stage: int
    backward: bool
    micro_batch: int


def interleaved_rounds(pp: int, micro_batches: int) -> int:
    """The rounds torch's ``ScheduleInterleaved1F1B`` runs ``micro_batches`` in (``pp`` a round, one
    where there are fewer): it refuses a count that is not a multiple of them."""
    return max(1, micro_batches // pp)


def interleaved_actions(pp: int, virtual_stages: int, micro_batches: int, rank: int) -> list[Action]:
    """What rank ``rank`` of ``pp`` runs under torch's ``ScheduleInterleaved1F1B`` (Megatron-LM's
    interleaved 1F1B, depth first), each of its ``virtual_stages`` stages ``rank + k * pp``: torch's
    scheduler's own order, which depends on the schedule's sizes alone (its rounds of ``pp``
    micro-batches), so no stage or process group is made for it."""
    from torch.distributed.pipelining.schedules import ScheduleInterleaved1F1B, _ComputationType

    rounds = interleaved_rounds(pp, micro_batches)
    sizes = SimpleNamespace(n_local_stages=virtual_stages, pp_group_size=pp, _n_microbatches=micro_batches, number_of_rounds=rounds,
                            microbatches_per_round=micro_batches // rounds, rank=rank)
    order = ScheduleInterleaved1F1B._calculate_single_rank_operations(sizes, rank)
    return [Action(action.stage_index, action.computation_type != _ComputationType.FORWARD, action.microbatch_index) for action in order if action is not None]
