"""Local search over all convex partitions for one micro-batch size (the engine of ``plan_gpp``).

States and their exact pricing are :mod:`gpp_solver.planners.gpp.partition_eval`'s.  :func:`search` repeatedly
takes the best improving move (smaller key) among, in this fixed order: a global device re-split;
for the most loaded stage ``s`` (then the next one): boundary nodes of ``s`` moved to an adjacent
stage, boundary nodes of neighbours pulled into ``s``, more/fewer devices for ``s`` (from the free
pool or another stage), ``s`` split in two along two topological orders, merges of adjacent stages
(freed devices to ``s``, or everything re-split); when none improves, an exact re-partition of
``s`` with each neighbour (every down-set split of their union).  Every candidate is a valid plan
(acyclic stage graph, memory), so every accepted state is one too.

Deterministic: no randomness, fixed move order, capped by ``max_iterations`` and (optionally)
``max_evaluations`` — a count of priced states, so the cap does not depend on the machine; the
wall clock (``deadline``) is only a safety stop.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from gpp_solver.planners.gpp.chains import branch_order
from gpp_solver.planners.gpp.partition_eval import Eval, Problem, State, canonical

MERGE_LIGHTEST = 3  # merges considered: pairs with the loaded stage or one of this many lightest stages
FAR_MOVE_STAGES = 8  # up to this many stages, nodes also move to / are pulled from non-adjacent stages
EXACT_SPLITS = 48  # a stage with at most this many down-sets is split at every one of them


# ---------------------------------------------------------------------------------- moves
def _members(assign: Sequence[int], k: int) -> list[list[int]]:
    out: list[list[int]] = [[] for _ in range(k)]
    for u, s in enumerate(assign):
        out[s].append(u)
    return out


def _merge(state: State, t: int, u: int, d_u: int) -> tuple[tuple[int, ...], list[int]]:
    """Stage ``t`` folded into ``u`` (which gets ``d_u`` devices); labels above ``t`` shift down."""
    assign = tuple((u if s == t else s) - (1 if (u if s == t else s) > t else 0) for s in state.assign)
    devs = list(state.devs)
    devs[u] = d_u
    del devs[t]
    return assign, devs


def _largest_degree(P: Problem, limit: int) -> int:
    return max(d for d in P.degrees if d <= limit)


def _split_devices(P: Problem, part1: Sequence[int], part2: Sequence[int], avail: int) -> tuple[int, int] | None:
    """Degrees ``(d1, d2)``, ``d1 + d2 <= avail``, balancing the two parts' compute."""
    best = None
    fits = [d for d in P.degrees if d < avail]
    c2s = {d2: sum(P.comp[d2][u] for u in part2) for d2 in fits}
    for d1 in fits:
        c1 = sum(P.comp[d1][u] for u in part1)
        for d2 in P.degrees:
            if d1 + d2 > avail:
                break
            c2 = c2s[d2]
            score = (max(c1, c2), d1 + d2)
            if best is None or score < best[0]:
                best = (score, (d1, d2))
    return None if best is None else best[1]


def neighbours(P: Problem, state: State, s: int, tps: Sequence[float] | None = None) -> Iterator[tuple[str, State]]:
    """Candidate moves that change stage ``s`` (the loaded one), in a fixed order: its boundary
    nodes moved out, its neighbours' pulled in, its devices changed, it split in two, two adjacent
    stages merged."""
    members = _members(state.assign, len(state.devs))
    yield from _moves(P, state, s, members)
    yield from _pulls(P, state, s, members)
    yield from _device_moves(P, state, s)
    yield from _splits(P, state, s, members)
    yield from _merges(P, state, s, tps)


def _moves(P: Problem, state: State, s: int, members: list) -> Iterator[tuple[str, State]]:
    """Boundary nodes of ``s`` to an adjacent stage (to any stage when there are few)."""
    assign, devs = state.assign, state.devs
    k = len(devs)
    if len(members[s]) > 1:
        for u in members[s]:
            near = sorted({assign[w] for w in P.adj[u]} - {s})
            for t in near:
                a = list(assign)
                a[u] = t
                yield "move", State(tuple(a), devs)
            if k <= FAR_MOVE_STAGES:  # parallel branches share no edge but may share a stage
                for t in range(k):
                    if t != s and t not in near:
                        a = list(assign)
                        a[u] = t
                        yield "move", State(tuple(a), devs)


def _pulls(P: Problem, state: State, s: int, members: list) -> Iterator[tuple[str, State]]:
    """Boundary nodes of the neighbours into ``s`` (any node when there are few stages)."""
    assign, devs = state.assign, state.devs
    k = len(devs)
    for u in range(P.N):
        t = assign[u]
        if t != s and len(members[t]) > 1 and (k <= FAR_MOVE_STAGES or any(assign[w] == s for w in P.adj[u])):
            a = list(assign)
            a[u] = s
            yield "pull", State(tuple(a), devs)


def _device_moves(P: Problem, state: State, s: int) -> Iterator[tuple[str, State]]:
    """More (or fewer) devices for ``s``, from the free pool or from one other stage."""
    assign, devs = state.assign, state.devs
    k = len(devs)
    free = P.D - sum(devs)
    for d in P.degrees:
        if d == devs[s]:
            continue
        need = d - devs[s]
        if need <= free:
            yield "devices", State(assign, devs[:s] + (d,) + devs[s + 1 :])
            continue
        for t in range(k):
            if t == s:
                continue
            give = [x for x in P.degrees if x < devs[t] and devs[t] - x >= need - free]
            if give:
                dv = list(devs)
                dv[s], dv[t] = d, give[-1]
                yield "devices", State(assign, tuple(dv))


def _splits(P: Problem, state: State, s: int, members: list) -> Iterator[tuple[str, State]]:
    """``s`` split in two: every down-set of s when there are at most EXACT_SPLITS of them, else the
    prefixes of two topological orders; devices shared or from the pool."""
    assign, devs = state.assign, state.devs
    k = len(devs)
    free = P.D - sum(devs)
    if len(members[s]) > 1:
        avail = devs[s] + free
        exact = _down_sets(P, members[s], EXACT_SPLITS)
        if exact is not None:
            parts = [(x, [u for u in members[s] if u not in xs]) for x in exact for xs in (set(x),)]
        else:
            orders = [sorted(members[s], key=lambda u: P.topo_rank[P.graph.ids[u]])]
            br = branch_order(P, members[s])
            if br != orders[0]:
                orders.append(br)
            parts = [(order[:c], order[c:]) for order in orders for c in range(1, len(order))]
        for p1, p2 in parts:
            dd = _split_devices(P, p1, p2, avail)
            if dd is None:
                continue
            a = list(assign)
            for u in p2:
                a[u] = k
            dv = list(devs) + [dd[1]]
            dv[s] = dd[0]
            yield "split", State(tuple(a), tuple(dv))


def _merges(P: Problem, state: State, s: int, tps: Sequence[float] | None) -> Iterator[tuple[str, State]]:
    """Two adjacent stages merged (one of them ``s`` or one of the lightest stages); the freed
    devices go to ``s`` (or everything is re-split)."""
    assign, devs = state.assign, state.devs
    k = len(devs)
    light = set(sorted(range(k), key=lambda x: (tps[x], x))[:MERGE_LIGHTEST]) if tps is not None else set(range(k))
    pairs = sorted(
        {
            (min(assign[u], assign[v]), max(assign[u], assign[v]))
            for u in range(P.N)
            for v, _ in P.succ[u]
            if assign[u] != assign[v]
        }
    )
    for src, dst in pairs:
        if not ({src, dst} & (light | {s})):
            continue
        d_dst = _largest_degree(P, max(devs[dst], devs[src]))
        a, dv = _merge(state, src, dst, d_dst)
        merged = dst - (1 if dst > src else 0)
        tgt = merged if s in (src, dst) else s - (1 if s > src else 0)
        dv[tgt] = _largest_degree(P, dv[tgt] + P.D - sum(dv))
        yield "merge", State(a, tuple(dv))
        rb = P.rebalance(a, k - 1)
        if rb is not None:
            yield "merge+rebalance", State(a, rb)


def _down_sets(P: Problem, nodes: Sequence[int], cap: int) -> list[list[int]] | None:
    """Every non-trivial down-closed subset of ``nodes`` (w.r.t. edges inside it); ``None`` above ``cap``.

    Depth-first over the nodes in topological order, each left out before it is taken (the order
    of the list), with an explicit stack: no recursion, whatever the set's size.  A set of ``k``
    nodes has at least ``k - 1`` of them (the prefixes of a topological order), so ``k - 1 > cap``
    answers ``None`` at once."""
    if len(nodes) - 1 > cap:
        return None
    order = sorted(nodes, key=lambda u: P.topo_rank[P.graph.ids[u]])
    inside = set(order)
    preds: dict[int, list[int]] = {u: [] for u in order}
    for u in order:
        for v, _ in P.succ[u]:
            if v in inside:
                preds[v].append(u)
    out: list[list[int]] = []
    chosen: set[int] = set()
    stack = [(0, _SKIP)]  # (position, what to do there next)
    while stack:
        i, step = stack.pop()
        if i == len(order):
            if 0 < len(chosen) < len(order):
                out.append(sorted(chosen))
                if len(out) > cap:
                    return None
            continue
        u = order[i]
        if step == _SKIP:  # first every set without u, then those with it
            stack += [(i, _TAKE), (i + 1, _SKIP)]
        elif step == _TAKE:
            if all(p in chosen for p in preds[u]):
                chosen.add(u)
                stack += [(i, _UNDO), (i + 1, _SKIP)]
        else:
            chosen.discard(u)
    return out


_SKIP, _TAKE, _UNDO = range(3)


def repartitions(P: Problem, state: State, s: int, *, cap: int = 512) -> Iterator[tuple[str, State]]:
    """Exact re-partition of stage ``s`` with each adjacent stage: every down-set split of their
    union (up to ``cap`` per pair), devices re-shared between the two parts."""
    assign, devs = state.assign, state.devs
    k = len(devs)
    members = _members(assign, k)
    free = P.D - sum(devs)
    nbrs = sorted({assign[w] for u in members[s] for w in P.adj[u]} - {s})
    for t in nbrs:
        union = members[s] + members[t]
        splits = _down_sets(P, union, cap)
        if splits is None:
            continue
        lo, hi = min(s, t), max(s, t)
        for x in splits:
            xs = set(x)
            y = [u for u in union if u not in xs]
            dd = _split_devices(P, x, y, devs[s] + devs[t] + free)
            if dd is None:
                continue
            a = list(assign)
            for u in x:
                a[u] = lo
            for u in y:
                a[u] = hi
            dv = list(devs)
            dv[lo], dv[hi] = dd
            yield "repartition", State(tuple(a), tuple(dv))


@dataclass
class SearchResult:
    state: State
    ev: Eval
    moves: int
    iterations: int
    stopped: str  # "converged", "iterations", "evaluations" (max_evaluations) or "time"
    move_counts: dict[str, int]
    evaluations: int = 0  # states priced by this search (cache hits included)


# complexity: the local search's one loop (moves, acceptance, budget, deadline) kept whole to read as the algorithm
def search(  # noqa: C901, PLR0912, PLR0915
    P: Problem,
    state: State,
    *,
    max_iterations: int = 300,
    tiers: int = 2,
    deadline: float | None = None,
    exact: bool = True,
    max_evaluations: int | None = None,
) -> SearchResult:
    """Best-improvement local search from ``state`` (see the module docstring).  With
    ``max_evaluations`` it stops once it has priced that many states (``stopped="evaluations"``),
    taking the best improving move of the part of the neighbourhood priced so far."""
    first = P.evaluations
    ev = P.evaluate(state.assign, state.devs)
    if ev is None:
        raise ValueError("the start state's stage graph has a cycle")
    state = canonical(state, ev)
    ev = P.evaluate(state.assign, state.devs)
    limit = None if max_evaluations is None else first + max_evaluations
    counts: dict[str, int] = {}
    moves = iterations = 0
    stopped = "iterations"

    def spent() -> bool:
        return limit is not None and P.evaluations >= limit

    while iterations < max_iterations:
        if deadline is not None and time.perf_counter() > deadline:
            stopped = "time"
            break
        if spent():
            stopped = "evaluations"
            break
        iterations += 1
        k = len(state.devs)
        ranked = sorted(range(k), key=lambda s: (-max(0.0, ev.memory[s] - P.cap), -ev.tps[s], s))
        found = None
        cut = False  # the neighbourhood was not priced whole (deadline or max_evaluations)
        rb = P.rebalance(state.assign, k)
        if rb is not None and rb != state.devs:
            e = P.evaluate(state.assign, rb)
            if e is not None and e.key < ev.key:
                found = ("rebalance", State(state.assign, rb), e)
        for s in ranked[:tiers]:
            if found is not None or cut:
                break
            best = None
            for label, cand in neighbours(P, state, s, ev.tps):
                e = P.evaluate(cand.assign, cand.devs)
                if e is not None and e.key < ev.key and (best is None or e.key < best[2].key):
                    best = (label, cand, e)
                if spent() or (deadline is not None and P.evaluations % 64 == 0 and time.perf_counter() > deadline):
                    cut = True
                    break
            found = best
        if found is None and exact and not cut:
            best = None
            for label, cand in repartitions(P, state, ranked[0]):
                e = P.evaluate(cand.assign, cand.devs)
                if e is not None and e.key < ev.key and (best is None or e.key < best[2].key):
                    best = (label, cand, e)
                if spent():
                    cut = True
                    break
            found = best
        if found is None:
            stopped = ("evaluations" if spent() else "time") if cut else "converged"
            break
        label, cand, e = found
        state = canonical(cand, e)
        ev = P.evaluate(state.assign, state.devs)
        moves += 1
        counts[label] = counts.get(label, 0) + 1
    return SearchResult(state, ev, moves, iterations, stopped, counts, P.evaluations - first)
