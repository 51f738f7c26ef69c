"""torch.distributed.pipelining's own ZB1P order (``ScheduleInterleavedZeroBubble``) as our per-stage orders.

Needs torch (``benchmarks/zero_bubble.py`` imports this module only when torch is installed; the
solver never imports torch).  The order comes from torch's code, not from a copy of its algorithm:
the schedule's constructor is run in full, which computes ``pipeline_order`` for every rank
(``_calculate_single_rank_operations``, then ``_add_bubbles_to_actions``).  No process group is
made: the constructor is given one stand-in stage, a ``SimpleNamespace`` holding only what it reads
from a stage (``group_size``, ``group_rank``, ``num_stages``, ``submod``; it writes
``stage_index_to_group_rank``).  With one stage per rank, rank ``i`` runs pipeline stage ``i``.
"""

from __future__ import annotations

from types import SimpleNamespace

from torch.distributed.pipelining.schedules import ScheduleInterleavedZeroBubble, _ComputationType

from gpp_solver.action import Action, Kind

#: torch's compute actions and ours: its ``I`` (backward input) is our ``B`` in an order with ``W``.
KINDS = {
    _ComputationType.FORWARD: Kind.F,
    _ComputationType.BACKWARD_INPUT: Kind.B,
    _ComputationType.BACKWARD_WEIGHT: Kind.W,
}


def torch_pipeline_order(p: int, n: int) -> dict[int, list]:
    """``pipeline_order`` of torch's ZB1P schedule for ``p`` ranks (one stage each) and ``n``
    micro-batches: per rank, torch's actions with ``None`` for idle slots.  Raises ``ValueError``
    where torch refuses ``n`` (a multiple of ``max(1, n // p)``) and for ``p < 1``."""
    if p < 1 or n < 1:
        raise ValueError(f"need at least one rank and one micro-batch, got p = {p}, n = {n}")
    stage = SimpleNamespace(group_size=p, group_rank=0, num_stages=p, submod=None)
    return ScheduleInterleavedZeroBubble([stage], n).pipeline_order


def torch_zb1p_orders(p: int, n: int) -> dict[int, tuple[Action, ...]]:
    """Rank ``i``'s ZB1P actions as stage ``i``'s order of ``F``/``B``/``W`` actions, the idle slots
    (``None``) dropped: our simulator starts each action when its inputs are ready."""
    out: dict[int, tuple[Action, ...]] = {}
    for rank, actions in sorted(torch_pipeline_order(p, n).items()):
        order = []
        for a in actions:
            if a is None:
                continue
            if a.stage_index != rank or a.computation_type not in KINDS:
                raise ValueError(f"rank {rank}: torch's action {a} is not F/I/W of stage {rank}")
            order.append(Action(KINDS[a.computation_type], a.microbatch_index))
        out[rank] = tuple(order)
    return out
