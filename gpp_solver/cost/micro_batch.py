"""Candidate micro-batch sizes: one rule for every planner.

By default a planner tries the powers of two that divide the mini-batch size ``B`` (GraphPipe §5,
"we consider powers of 2 for micro-batch sizes").  Sizes a user gives must be positive integers
dividing ``B``; anything else is bad input, never silently dropped.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from gpp_solver.errors import InvalidInputError, show
from gpp_solver.limits import MAX_COUNT


def powers_of_two_dividing(mini_batch_size: int) -> tuple[int, ...]:
    """``(1, 2, 4, ...)`` up to the largest power of two dividing ``mini_batch_size``."""
    out, b = [], 1
    while b <= mini_batch_size and mini_batch_size % b == 0:
        out.append(b)
        b *= 2
    return tuple(out)


def check_mini_batch_size(mini_batch_size: object) -> int:
    """``B`` itself, or :class:`InvalidInputError` when it is not a positive integer (at most
    :data:`~gpp_solver.formats.jsonio.MAX_COUNT`, the supported range)."""
    if (
        not isinstance(mini_batch_size, int)
        or isinstance(mini_batch_size, bool)
        or not 1 <= mini_batch_size <= MAX_COUNT
    ):
        raise InvalidInputError(
            f"mini_batch_size must be a positive integer (at most {MAX_COUNT}), got {show(mini_batch_size)}"
        )
    return mini_batch_size


def check_micro_batch_sizes(mini_batch_size: int, sizes: Sequence[int] | Iterable[int] | None) -> tuple[int, ...]:
    """Validate ``B`` and the candidate sizes (default: powers of two dividing ``B``); sorted, unique."""
    check_mini_batch_size(mini_batch_size)
    if sizes is None:
        return powers_of_two_dividing(mini_batch_size)
    out = []
    for b in sizes:
        if not isinstance(b, int) or isinstance(b, bool) or b < 1:
            raise InvalidInputError(f"micro_batch_sizes must be positive integers, got {b!r}")
        if mini_batch_size % b:
            raise InvalidInputError(f"`B % b == 0` must hold, but got (B={mini_batch_size}, b={b})")
        out.append(b)
    if not out:
        raise InvalidInputError("micro_batch_sizes is empty")
    return tuple(sorted(set(out)))
