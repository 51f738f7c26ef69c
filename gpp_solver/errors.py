"""One exception tree for the whole package.

``GppError`` is the root.  Bad input (``InvalidInputError`` and its children) is separated from
"no feasible answer" (``InfeasibleError``) and from a solver that failed or was stopped
(``SolverError``), so the CLI can map them to exit codes 2, 1 and 1.
"""

from __future__ import annotations

import math
from typing import Any


class GppError(Exception):
    """Root of every error raised on purpose by gpp_solver."""


class InvalidInputError(GppError, ValueError):
    """The input (graph, cluster, plan, option, argument) is malformed.  CLI exit code 2."""


class InvalidGraphError(InvalidInputError):
    """A graph document or object breaks the gpp-graph/1 contract."""


class InvalidClusterError(InvalidInputError):
    """A cluster document or object breaks the gpp-cluster/1 contract."""


class InvalidPlanError(InvalidInputError):
    """A plan breaks the gpp-plan/1 contract or one of C1-C4, the device partition or memory."""


class SearchSpaceTooLargeError(InvalidInputError):
    """The requested planner refuses an instance above the size it can handle (limit named)."""


class InfeasibleError(GppError):
    """No plan fits.  ``required_memory_bytes`` / ``required_devices`` say what would be needed."""

    def __init__(
        self, message: str, *, required_memory_bytes: float | None = None, required_devices: int | None = None
    ) -> None:
        super().__init__(message)
        self.required_memory_bytes = required_memory_bytes
        self.required_devices = required_devices

    def rerun_hint(self) -> str:
        """``"; needs memory_bytes >= N"`` with N the required memory ROUNDED UP to whole bytes (a figure
        printed with a few digits may round down below it), and/or the devices; empty when unknown."""
        parts = []
        m = self.required_memory_bytes
        if m is not None and m == m and m not in (float("inf"), float("-inf")):
            parts.append(f"memory_bytes >= {math.ceil(m)}")
        if self.required_devices is not None:
            parts.append(f"devices >= {self.required_devices}")
        return f"; a re-run needs cluster {' or '.join(parts)} (rounded up)" if parts else ""


class SolverError(GppError):
    """A solver backend failed (crashed, returned an unknown status)."""


class TimeLimitError(SolverError):
    """The search reached its time limit before it had any plan (status ``time-limit``)."""


class DeadlockError(InvalidPlanError):
    """Stage orders that wait on each other forever."""


class VizUnavailableError(GppError):
    """matplotlib is not installed (``pip install 'gpp_solver[viz]'``)."""


def exit_status(exc: BaseException) -> tuple[int, str]:
    """The ``gpp`` command's exit code and one-line message for ``exc``: 2 bad input (also a file it
    cannot read, input too deep or too large), 1 no feasible plan, solver failure, interruption or a
    bug (named as one, never a traceback)."""
    if isinstance(exc, InfeasibleError):
        return 1, f"gpp: no feasible plan: {exc}{exc.rerun_hint()}"
    if isinstance(exc, InvalidInputError):
        return 2, f"gpp: {exc}"
    if isinstance(exc, GppError):
        return 1, f"gpp: {exc}"
    if isinstance(exc, KeyboardInterrupt):
        return 1, "gpp: interrupted"
    if isinstance(exc, (RecursionError, MemoryError)):
        return 2, f"gpp: the input is too large or too deeply nested to process ({type(exc).__name__})"
    if isinstance(exc, OSError):
        return 2, f"gpp: {exc.strerror or exc}: {getattr(exc, 'filename', '') or ''}".rstrip(": ")
    return 1, f"gpp: internal error (a bug; please report it with the inputs): {type(exc).__name__}: {str(exc)[:300]}"


def check_types(**named: tuple[object, type]) -> None:
    """``check_types(plan=(plan, Plan), ...)``: an argument of the wrong type is one InvalidInputError
    naming it (a library entry point never answers a wrong argument with AttributeError/TypeError)."""
    for name, (value, kind) in named.items():
        if not isinstance(value, kind):
            raise InvalidInputError(f"{name} must be a {kind.__name__}, got {type(value).__name__}")


def show(value: Any) -> str:
    """``value`` as an error message names it: short, a huge integer by its digit count, a container by its kind."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10**24:
        return f"an integer of about {int(value.bit_length() * 0.30103) + 1} digits"
    if isinstance(value, (dict, list)):
        return f"a {'JSON object' if isinstance(value, dict) else 'list'}"
    r = repr(value)
    return r if len(r) <= 40 else r[:37] + "..."


__all__ = [
    "GppError",
    "InvalidInputError",
    "InvalidGraphError",
    "InvalidClusterError",
    "InvalidPlanError",
    "SearchSpaceTooLargeError",
    "InfeasibleError",
    "SolverError",
    "TimeLimitError",
    "DeadlockError",
    "check_types",
    "exit_status",
    "show",
]
