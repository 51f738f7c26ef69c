"""GraphPipe's planner options: one frozen dataclass, checked by :func:`gpp_solver.planners.registry.parse_options`."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from gpp_solver.errors import InvalidInputError
from gpp_solver.plan.zero_bubble import check_schedule

#: how many stagings, best by iteration estimate, are built and simulated (``None``: all of them,
#: each skipped when its lower bound ``B * TPS`` already exceeds the best simulated iteration)
SIMULATE_TOP = None
#: the depth sweep's largest bound below the least-TPS staging's depth (see ``depth_tradeoff``)
MAX_DEPTH_BOUND = 8


@dataclass(frozen=True)
class GraphPipeOptions:
    """What ``plan_graphpipe`` takes beside ``time_limit`` and ``progress`` (module docstring of
    :mod:`gpp_solver.planners.graphpipe.planner`)."""

    # candidate micro-batch sizes (default: the powers of two dividing B)
    micro_batch_sizes: Sequence[int] | None = None
    # each stage its own micro-batch size (and with search_k its own k): the DP of dp/general.py
    per_stage_micro_batch: bool = False
    # each stage's kFkB k from K_OPTIONS by A.1's rule (Algorithm 2 in plan_build)
    search_k: bool = False
    # data-parallel degrees a stage may take (default: powers of two up to the devices)
    degree_options: Sequence[int] | None = None
    # the depth sweep: also the least TPS per bound on the stage graph's depth (False: Algorithm 1 alone)
    depth_tradeoff: bool = True
    # simulate only the best this many stagings by iteration estimate (None: all of them)
    simulate_top: int | None = SIMULATE_TOP
    # validate the plan before returning it
    validate_plan: bool = True
    # GraphPipe's shared terminals: a stage may hold a parallel block's sink and a branch's tail
    shared_sinks: bool = True
    # the depth sweep's largest bound below the least-TPS staging's depth
    max_depth_bound: int | None = MAX_DEPTH_BOUND
    # micro-batch orders: "1f1b" (kFkB), "zb" (split backward, W actions), "auto" (the faster per plan)
    schedule: str = "1f1b"

    def __post_init__(self) -> None:
        check_schedule(self.schedule)
        for name in ("simulate_top", "max_depth_bound"):
            v = getattr(self, name)
            if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 1):
                raise InvalidInputError(f"{name} must be a positive integer or None, got {v!r}")
