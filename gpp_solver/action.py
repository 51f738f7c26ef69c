"""One step of a stage's micro-batch order: the forward or backward pass of one micro-batch.

:class:`Action` is a named tuple, so ``kind, j = action`` and ``action == ("F", 0)`` keep working;
its text form round-trips (as torch.distributed.pipelining's ``_Action``)::

    >>> a = Action.parse("B3")
    >>> a, str(a), a == ("B", 3), Action.parse(str(a)) == a
    (Action(kind='B', micro_batch=3), 'B3', True, True)

In plan JSON an action is the pair ``["F", j]`` (``docs/formats.md``); :meth:`Action.to_json` writes that pair,
``formats/plan_json.py`` reads it.
"""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Any, NamedTuple

from gpp_solver.errors import InvalidPlanError


class Kind(StrEnum):
    """``F``: forward pass of a micro-batch; ``B``: its backward pass."""

    F = "F"
    B = "B"


_TEXT = re.compile(r"([FB])(0|[1-9][0-9]*)")


class Action(NamedTuple):
    """``kind`` of micro-batch ``micro_batch`` (0-based) on the stage whose order holds it."""

    kind: Kind
    micro_batch: int

    def __str__(self) -> str:
        return f"{self.kind}{self.micro_batch}"

    def __repr__(self) -> str:
        return f"Action(kind={str(self.kind)!r}, micro_batch={self.micro_batch})"

    @classmethod
    def of(cls, kind: str, micro_batch: int) -> "Action":
        """The action ``kind`` (``"F"``/``"B"`` or a :class:`Kind`) of ``micro_batch``."""
        return cls(Kind(kind), micro_batch)

    @classmethod
    def parse(cls, text: str) -> "Action":
        """``"F0"`` -> ``Action(F, 0)``; anything else raises :class:`InvalidPlanError`."""
        m = _TEXT.fullmatch(text) if isinstance(text, str) else None
        if m is None:
            raise InvalidPlanError(f"an action is F or B followed by a micro-batch index, e.g. 'F0', got {text!r}")
        return cls(Kind(m.group(1)), int(m.group(2)))

    def to_json(self) -> list[Any]:
        """The plan JSON pair ``["F", j]``."""
        return [str(self.kind), self.micro_batch]


def as_order(actions: Any) -> tuple[Action, ...]:
    """A stage order as :class:`Action` records (pairs such as ``("F", 0)`` are converted)."""
    return tuple(a if type(a) is Action and type(a.kind) is Kind else Action.of(*a) for a in actions)


def order_text(actions: Any) -> str:
    """Compact form of an order, e.g. ``F0 F1 B0 F2 B1 B2``."""
    return " ".join(str(a) for a in as_order(actions))


def parse_order(text: str) -> tuple[Action, ...]:
    """Inverse of :func:`order_text`."""
    return tuple(Action.parse(t) for t in text.split())
