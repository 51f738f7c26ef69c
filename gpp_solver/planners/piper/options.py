"""The Piper planner's options: one frozen dataclass, checked by :func:`gpp_solver.planners.registry.parse_options`."""

from __future__ import annotations

from dataclasses import dataclass

from gpp_solver.errors import InvalidInputError

DEFAULT_MAX_DOWNSETS = 20_000
MODES = ("shared", "piper")


@dataclass(frozen=True)
class PiperOptions:
    """What ``plan_piper`` takes beside ``time_limit`` and ``progress`` (module docstring of
    :mod:`gpp_solver.planners.piper.planner`)."""

    # refuse (SearchSpaceTooLargeError) a graph with more downsets than this
    max_downsets: int = DEFAULT_MAX_DOWNSETS
    # "shared": the shared cost model's figures; "piper": Piper's own model, as published
    mode: str = "shared"
    # the micro-batch size per replica b' (default: every profiled size dividing B; 1 in mode "piper")
    micro_batch_size: int | None = None

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise InvalidInputError(f"mode must be one of {', '.join(MODES)}, got {self.mode!r}")
