"""The MILP planner's options: one frozen dataclass, checked by :func:`gpp_solver.planners.registry.parse_options`."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from gpp_solver.errors import InvalidInputError


@dataclass(frozen=True)
class MilpOptions:
    """What ``plan_milp`` takes beside ``time_limit`` and ``progress``."""

    # candidate micro-batch sizes, one MILP each (default: powers of two dividing B)
    micro_batch_sizes: Sequence[int] | None = None
    # at most this many stages (default: min(nodes, devices))
    max_stages: int | None = None
    # "highs" or "cbc" (default: HiGHS when installed, else CBC)
    solver: str | None = None

    def __post_init__(self) -> None:
        m = self.max_stages
        if m is not None and (not isinstance(m, int) or m < 1):
            raise InvalidInputError(f"milp: max_stages must be a positive integer, got {m!r}")
