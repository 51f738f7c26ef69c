"""Sequential start states for ``gpp``'s local search: balanced prefix cuts of two topological
orders (the graph's own and a branch-by-branch one) with devices re-split, and the uniform chains of
PipeDream-2BW's and Alpa's spaces (``D / d`` stages of ``d`` devices each)."""

from __future__ import annotations

import bisect
import functools
import itertools
from collections.abc import Iterator, Sequence

from gpp_solver.planners.gpp.partition_eval import Problem, State

ALL_CHAIN_LENGTHS = 64  # balanced chains of every stage count up to this many (then a geometric ladder)


def branch_order(P: Problem, nodes: Sequence[int]) -> list[int]:
    """A topological order of ``nodes`` that finishes one branch before starting the next (DFS-like)."""
    inside = set(nodes)
    indeg = {u: 0 for u in nodes}
    for u in nodes:
        for v, _ in P.succ[u]:
            if v in inside:
                indeg[v] += 1
    stack = sorted((u for u in nodes if indeg[u] == 0), reverse=True)
    out = []
    while stack:
        u = stack.pop()
        out.append(u)
        ready = []
        for v, _ in P.succ[u]:
            if v in inside:
                indeg[v] -= 1
                if indeg[v] == 0:
                    ready.append(v)
        stack.extend(sorted(ready, reverse=True))
    return out


def topological_orders(P: Problem) -> list[list[int]]:
    """The graph's own topological order and a branch-by-branch one."""
    idx = P.graph.index
    a = [idx[v] for v in P.graph.topo_order]
    b = branch_order(P, list(range(P.N)))
    return [a] if a == b else [a, b]


def _linear_partition(w: Sequence[float], k: int) -> list[int]:
    """:func:`_balanced_cuts`, remembered (the sizes ``b`` with the same ``b / d`` share weights)."""
    return list(_balanced_cuts(tuple(w), k))


@functools.lru_cache(maxsize=4096)
def _balanced_cuts(w: tuple[float, ...], k: int) -> tuple[int, ...]:
    """Cut points of at most ``k`` contiguous segments minimising the largest sum (bisection + greedy:
    each segment runs as far as its sum stays within the threshold, at least one item; found on the
    prefix sums by bisection, so a threshold costs O(k log n))."""
    prefix = list(itertools.accumulate(w, initial=0.0))
    n = len(w)

    def cuts(t: float) -> list[int] | None:
        out, i = [], 0
        while True:
            j = max(bisect.bisect_right(prefix, prefix[i] + t, i + 1) - 1, i + 1)
            if j >= n:
                return out
            out.append(j)
            if len(out) + 1 > k:
                return None
            i = j

    lo, hi = max(w), sum(w)
    for _ in range(40):
        mid = (lo + hi) / 2
        if cuts(mid) is None:
            lo = mid
        else:
            hi = mid
    return tuple(cuts(hi) or ())


def _assign_from_cuts(P: Problem, order: Sequence[int], cuts: Sequence[int]) -> tuple[tuple[int, ...], int]:
    a = [0] * P.N
    stage, bounds = 0, set(cuts)
    for i, u in enumerate(order):
        if i in bounds:
            stage += 1
        a[u] = stage
    return tuple(a), stage + 1


def chain_lengths(most: int) -> list[int]:
    """Stage counts of the balanced chains: every one up to ``ALL_CHAIN_LENGTHS``, then a geometric
    ladder (ratio ~1.25) up to ``most`` — on 1,000 operators and 1,024 devices every count would
    cost seconds for starts the search refines anyway."""
    out = list(range(1, min(most, ALL_CHAIN_LENGTHS) + 1))
    while out[-1] < most:
        out.append(min(most, max(out[-1] + 1, round(out[-1] * 1.25))))
    return out


def chain_states(P: Problem) -> Iterator[tuple[str, State]]:
    """Sequential partitions of topological orders (every prefix cut is convex): ``k`` balanced
    stages with re-split devices for every ``k``; then the uniform chains of PipeDream-2BW's and
    Alpa's spaces — ``D / d`` stages of ``d`` devices each, balanced at degree ``d``."""
    seen = set()
    orders = topological_orders(P)
    for oi, order in enumerate(orders):
        w = [P.comp[1][u] for u in order]
        for k in chain_lengths(min(P.D, P.N)):
            cuts = _linear_partition(w, k)
            key = tuple(cuts)
            if (oi, key) in seen:
                continue
            seen.add((oi, key))
            a, k_used = _assign_from_cuts(P, order, cuts)
            devs = P.rebalance(a, k_used)
            if devs is not None:
                yield f"chain{oi}", State(a, devs)
    for oi, order in enumerate(orders):
        for d in P.degrees:
            k = min(P.D // d, P.N)
            cuts = _linear_partition([P.comp[d][u] for u in order], k)
            a, k_used = _assign_from_cuts(P, order, cuts)
            yield f"uniform{oi}", State(a, (d,) * k_used)
