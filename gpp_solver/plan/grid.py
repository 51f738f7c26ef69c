"""A stage x step text grid of micro-batch orders (one row per stage, its actions in order, as
torch.distributed.pipelining prints them), optionally with steps marked.

>>> print(order_grid({0: [("F", 0), ("B", 0)], 1: [("F", 0), ("B", 0)]}, marks={(1, 1)}))
step     0    1
stage 0  F0   B0
stage 1  F0   B0<
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence


def order_grid(
    orders: Mapping[int, Sequence[tuple[str, int]]], *, marks: Iterable[tuple[int, int]] = (), max_steps: int = 64
) -> str:
    """A stage x step grid of the orders; ``marks`` = ``{(stage, step)}`` are flagged with ``<``.

    With more than ``max_steps`` steps only a window around the first mark (or the start) is shown.
    """
    marks = set(marks)
    steps = max((len(o) for o in orders.values()), default=0)
    lo = 0
    if steps > max_steps:
        first = min((st for _, st in marks), default=0)
        lo = max(0, min(first - max_steps // 2, steps - max_steps))
    hi = min(steps, lo + max_steps)
    cells = {s: [f"{k}{j}" + ("<" if (s, i) in marks else "") for i, (k, j) in enumerate(o)] for s, o in orders.items()}
    w = max([len(c) for row in cells.values() for c in row[lo:hi]] + [len(str(hi - 1)), 2]) + 2
    head = max(len(f"stage {s}") for s in orders) + 2 if orders else 8
    lines = ["step".ljust(head) + "".join(str(i).ljust(w) for i in range(lo, hi)).rstrip()]
    for s, row in cells.items():
        lines.append(
            f"stage {s}".ljust(head)
            + "".join(c.ljust(w) for c in row[lo:hi]).rstrip()
            + (" ..." if hi < len(row) else "")
        )
    if lo:
        lines[0] = lines[0] + f"   (steps {lo}..{hi - 1} of {steps})"
    return "\n".join(lines)
