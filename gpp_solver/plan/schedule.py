"""GraphPipe's static micro-batch scheduler (Algorithm 2, Appendix A.1 Table 2).

* :func:`compute_in_flight` — Table 2: samples stage ``x`` keeps in flight given one successor ``y``.
* :func:`schedule_stage_graph` — Algorithm 2 over a stage DAG, from the sinks backwards: a sink
  holds ``k*b``; any other stage the max over its successors of ``ComputeInFlight``; with ``k``
  free, each stage picks the ``k`` that minimises that max (``ScheduleStage``).
* :func:`kfkb_order` — ``ScheduleTask``/``GenerateSchedule``: the warm-up forwards, then every
  backward as early as possible alternating with the next forward, then the last backwards.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable, Mapping, Sequence

import networkx as nx

from gpp_solver.action import Action, Kind
from gpp_solver.errors import InvalidInputError


def compute_in_flight(kx: int, bx: int, ky: int, by: int, iy: int) -> int:
    """In-flight samples of stage ``x`` followed by stage ``y`` (GraphPipe Table 2).

    ``kx, bx``: k of the kFkB schedule and micro-batch size of ``x``; ``ky, by, iy``: the same and
    the in-flight samples of its successor ``y``.  The ten rows of the table cover every case.
    """
    if min(kx, bx, ky, by) < 1 or iy < 0:
        raise InvalidInputError(f"compute_in_flight needs positive k and b, got (kx={kx}, bx={bx}, ky={ky}, by={by})")
    ax, ay, m = kx * bx, ky * by, max(bx, by)
    if ax < ay:
        if ax < by:  # row 9: bx <= kx bx < by <= ky by
            return iy + by
        if ax == m:  # row 2: max{bx,by} = kx bx < ky by
            return iy + m
        return iy + 2 * m  # row 1: max{bx,by} < kx bx < ky by
    if ax > ay:
        if ay < bx:  # row 10: by <= ky by < bx <= kx bx
            return iy + ax - ay + bx
        if bx <= by:
            if ay == by:  # row 4: bx <= by = ky by < kx bx
                return iy + ax
            return iy + ax - ay + 2 * by  # row 3: bx <= by < ky by < kx bx
        if ay == bx:  # row 6: by <= bx = ky by < kx bx
            return iy + ax
        return iy + ax - ay + 2 * bx  # row 5: by <= bx < ky by < kx bx
    if ax == m:  # row 7: max{bx,by} = ky by = kx bx
        return iy + ay
    return iy + 2 * m  # row 8: max{bx,by} < ky by = kx bx


def schedule_stage_graph(
    succs: Mapping[int, Sequence[int]],
    micro_batch: Mapping[int, int],
    k: Mapping[int, int] | None = None,
    *,
    k_options: Iterable[int] = (1,),
) -> dict[int, tuple[int, int]]:
    """Algorithm 2 on a stage DAG: ``{stage: (k, in_flight_samples)}``.

    ``succs`` maps every stage to its successor stages.  With ``k`` given it is used as is;
    otherwise each stage takes the ``k`` from ``k_options`` minimising its in-flight samples
    (smallest ``k`` on ties).
    """
    g = nx.DiGraph()
    g.add_nodes_from(succs)
    for s, ys in succs.items():
        g.add_edges_from((s, y) for y in ys)
    options = sorted(set(k_options))
    out: dict[int, tuple[int, int]] = {}
    for s in reversed(list(nx.topological_sort(g))):
        b = micro_batch[s]
        cands = [k[s]] if k is not None and s in k else options
        best: tuple[int, int] | None = None
        for kx in cands:
            ys = list(g.successors(s))
            i = kx * b if not ys else max(compute_in_flight(kx, b, out[y][0], micro_batch[y], out[y][1]) for y in ys)
            if best is None or i < best[1]:
                best = (kx, i)
        assert best is not None
        out[s] = best
    return out


def warmup_micro_batches(in_flight_samples: int, b: int, num_micro_batches: int) -> int:
    """Forwards a stage runs before its first backward to hold ``in_flight_samples``."""
    return max(1, min(num_micro_batches, math.ceil(in_flight_samples / b)))


@functools.lru_cache(maxsize=4096)  # immutable result; planners build the same orders many times
def kfkb_order(num_micro_batches: int, warmup: int) -> tuple[Action, ...]:
    """``warmup`` forwards, then B/F alternating (backward as early as possible), then the rest."""
    if num_micro_batches < 1:
        raise InvalidInputError(f"a stage needs at least one micro-batch, got {num_micro_batches}")
    w = max(1, min(warmup, num_micro_batches))
    order = [Action(Kind.F, j) for j in range(w)]
    nxt = w
    for j in range(num_micro_batches):
        order.append(Action(Kind.B, j))
        if nxt < num_micro_batches:
            order.append(Action(Kind.F, nxt))
            nxt += 1
    return tuple(order)
