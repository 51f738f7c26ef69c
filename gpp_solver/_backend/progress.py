"""Progress of long searches: a tqdm bar on a terminal, and one-line notes of the search's steps.

Every planner takes ``progress``: ``False`` never shows a bar; ``True`` or ``None`` shows one on
stderr when stderr is a terminal and tqdm is installed (the ``viz`` extra), after ``delay`` seconds
so short searches stay silent.  The bar goes to stderr, so ``gpp plan ... > plan.json`` stays clean.

:func:`note` reports a step of a long search (a seed planner starting or done, CP-SAT running) on
the ``gpp_solver.progress`` logger at INFO when ``progress`` is on (DEBUG otherwise); the ``gpp``
command shows that logger's records on stderr unless ``--quiet``.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

logger = logging.getLogger(__name__)
PROGRESS_LOGGER = logging.getLogger("gpp_solver.progress")


class _StderrHandler(logging.Handler):
    """Writes each record's message to the ``sys.stderr`` of the moment (it may be replaced later)."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            print(record.getMessage(), file=sys.stderr, flush=True)
        except Exception:  # noqa: BLE001 — logging's own convention
            self.handleError(record)


def show_progress_on_stderr(quiet: bool = False) -> None:
    """For the command line: show :func:`note`'s lines on stderr (once), unless ``quiet``."""
    if quiet or any(isinstance(h, _StderrHandler) for h in PROGRESS_LOGGER.handlers):
        return
    PROGRESS_LOGGER.addHandler(_StderrHandler())
    PROGRESS_LOGGER.setLevel(logging.INFO)
    PROGRESS_LOGGER.propagate = False


def note(enabled: bool | None, message: str, *args: object) -> None:
    """One progress line (``logging`` style arguments) on ``gpp_solver.progress``: INFO when
    ``enabled``, DEBUG otherwise."""
    PROGRESS_LOGGER.log(logging.INFO if enabled else logging.DEBUG, message, *args)


class ProgressBar:
    """``update``/``set_postfix_str``/``close`` that do nothing when no bar is shown."""

    def __init__(self, total: int | None, desc: str, unit: str, enabled: bool | None, delay: float = 1.0) -> None:
        self.bar: Any = None
        if enabled is False or not sys.stderr.isatty():
            return
        try:
            from tqdm import tqdm
        except ImportError:  # tqdm is an optional extra
            logger.info("%s (install tqdm for a progress bar)", desc)
            return
        self.bar = tqdm(total=total, desc=desc, unit=unit, delay=delay, file=sys.stderr, leave=False)

    def update(self, n: int = 1) -> None:
        if self.bar is not None:
            self.bar.update(n)

    def set_postfix_str(self, text: str) -> None:
        if self.bar is not None:
            self.bar.set_postfix_str(text)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None

    def __enter__(self) -> ProgressBar:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
