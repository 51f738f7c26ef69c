"""The sequential baselines' options (PipeDream, PipeDream-2BW, Alpa): one frozen dataclass per
planner, checked by :func:`gpp_solver.planners.registry.parse_options`."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from gpp_solver.errors import InvalidInputError
from gpp_solver.planners.sequential.linearize import DEFAULT_MAX_STATES

#: Alpa's stage tables (per group size and device count) may take at most this many bytes
MAX_TABLE_BYTES = 2**30
PIPEDREAM_MODES = ("shared", "pipedream-costs")


@dataclass(frozen=True)
class PipeDreamOptions:
    """What ``plan_pipedream`` takes beside ``time_limit`` and ``progress``."""

    # "shared": the shared cost model; "pipedream-costs": PipeDream's own optimizer and cost model
    mode: str = "shared"
    # candidate micro-batch sizes (default: powers of two dividing B)
    micro_batch_sizes: Sequence[int] | None = None
    # the chain of downsets the DP cuts: "antichain" states or one "topological" order's prefixes
    linearization: str = "antichain"
    # above this many antichain states, fall back to topological prefixes
    max_states: int | None = DEFAULT_MAX_STATES
    # mode "pipedream-costs" only: one flat network at this many bytes/s (default 1e9, or the cluster's levels)
    bandwidth: float | None = None
    # mode "pipedream-costs" only: PipeDream's activation compression ratio
    activation_compression_ratio: float | None = None

    def __post_init__(self) -> None:
        own = [k for k in ("bandwidth", "activation_compression_ratio") if getattr(self, k) is not None]
        if own and self.mode != "pipedream-costs":
            raise InvalidInputError(
                f"planner 'pipedream' has no option {', '.join(map(repr, own))} in mode "
                f"{self.mode!r}; its options there: linearization, max_states, "
                f"micro_batch_sizes, mode"
            )
        if self.mode not in PIPEDREAM_MODES:
            raise InvalidInputError(f"mode must be 'shared' or 'pipedream-costs', got {self.mode!r}")


@dataclass(frozen=True)
class PipeDream2BWOptions:
    """What ``plan_pipedream_2bw`` takes beside ``time_limit`` and ``progress``."""

    # stage cuts balance "compute" (f + g at b / d) or "layers" (node count)
    balance: str = "compute"
    # candidate micro-batch sizes (default: powers of two dividing B)
    micro_batch_sizes: Sequence[int] | None = None

    def __post_init__(self) -> None:
        if self.balance not in ("compute", "layers"):
            raise InvalidInputError(f"balance must be 'compute' or 'layers', got {self.balance!r}")


@dataclass(frozen=True)
class AlpaOptions:
    """What ``plan_alpa`` takes beside ``time_limit`` and ``progress``."""

    # candidate micro-batch sizes (default: powers of two dividing B)
    micro_batch_sizes: Sequence[int] | None = None
    # the stage tables may take at most this many bytes (SearchSpaceTooLargeError above)
    max_table_bytes: int = MAX_TABLE_BYTES
    # candidate stagings per micro-batch size that are built and simulated at most
    max_candidates: int = 64
