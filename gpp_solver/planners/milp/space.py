"""The search space shared by the exact MILP (``milp/model.py``), the exact iteration-time planner
(``planners/exact``) and the brute-force oracle (``oracles/brute_force.py``).

A candidate plan is

* a partition of the nodes into stages, each convex, with an acyclic stage graph (C1, C2);
* one micro-batch size ``b`` for every stage (default: the powers of two dividing ``B``);
* ``d >= 1`` devices per stage with ``b % d == 0`` (data parallelism only, no TMPC), at most
  ``cluster.devices`` in all;
* 1F1B (``k = 1``) everywhere, so a stage at depth ``j`` from the sinks of the stage graph holds
  ``min(j + 1, B / b) * b`` samples in flight — what ``plan_build`` (Algorithm 2 + the kFkB order)
  gives for uniform ``b`` and ``k = 1``;
* **placement rule**: the stages are numbered in *a* topological order of the stage graph (the
  planner chooses which one) and take contiguous device ranges in that order from device 0:
  stage ``i`` gets ``[o_i, o_i + d_i)`` with ``o_i = d_0 + ... + d_{i-1}``; unused devices are the
  highest ones.  Where placement cannot change any bandwidth (flat network, all devices in one
  node, or equal intra/inter bandwidth) every order costs the same.

The objective is the bottleneck time-per-sample of ``docs/cost-model.md`` (communication and the
all-reduce included).  Memory feasibility uses the validator's tolerance (``M(S) <= memory * (1 +
1e-9)``).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from gpp_solver.types import Graph

MEMORY_REL_TOL = 1e-9
"""A stage fits when ``M(S) <= memory_bytes * (1 + MEMORY_REL_TOL)`` (the validator's tolerance)."""


def device_options(b: int, devices: int) -> tuple[int, ...]:
    """Data-parallel degrees a stage may take: ``1 <= d <= devices`` with ``b % d == 0``."""
    return tuple(d for d in range(1, min(devices, b) + 1) if b % d == 0)


def contiguous_ranges(counts: Sequence[int]) -> list[tuple[int, ...]]:
    """The placement rule: stage ``i`` gets devices ``[o_i, o_i + counts[i])``, ``o_i`` the prefix sum."""
    out, o = [], 0
    for c in counts:
        out.append(tuple(range(o, o + c)))
        o += c
    return out


def layouts(b: int, devices: int, max_stages: int) -> Iterator[tuple[int, ...]]:
    """Every tuple of per-stage device counts (1..``max_stages`` stages, each in ``device_options``,
    total at most ``devices``) — the device side of the search space, in placement order."""
    opts = device_options(b, devices)

    def rec(prefix: tuple[int, ...], left: int) -> Iterator[tuple[int, ...]]:
        if prefix:
            yield prefix
        if len(prefix) == max_stages:
            return
        for d in opts:
            if d <= left:
                yield from rec(prefix + (d,), left - d)

    yield from rec((), devices)


def in_flight_samples(depth: int, b: int, mini_batch_size: int) -> int:
    """1F1B in-flight samples of a stage ``depth`` stages above the sinks (clamped at ``B / b`` micro-batches)."""
    return min(depth + 1, mini_batch_size // b) * b


def ordered_partitions(
    graph: Graph, max_stages: int, *, every_order: bool = True
) -> Iterator[tuple[tuple[str, ...], ...]]:
    """Every partition into convex stages with an acyclic stage graph, stages listed in a
    topological order of the stage graph.

    These are exactly the maps ``stage: V -> {0..k-1}`` onto a prefix with ``stage(u) <= stage(v)``
    for every edge ``u -> v``.  With ``every_order`` each partition comes once per topological order
    of its stage graph (placement differs); otherwise once.
    """
    topo = graph.topo_order
    preds = [[topo.index(p) for p in graph.preds(v)] for v in topo]
    n = len(topo)
    slot = [0] * n
    seen: set[frozenset[frozenset[str]]] = set()

    def rec(i: int, used: int) -> Iterator[tuple[tuple[str, ...], ...]]:
        if i == n:
            k = used.bit_length()
            if used != (1 << k) - 1:
                return
            parts = tuple(tuple(topo[j] for j in range(n) if slot[j] == s) for s in range(k))
            if not every_order:
                key = frozenset(frozenset(p) for p in parts)
                if key in seen:
                    return
                seen.add(key)
            yield parts
            return
        if used.bit_length() - used.bit_count() > n - i:
            return  # more unused labels below the highest one than nodes left to fill them
        lo = max((slot[p] for p in preds[i]), default=0)
        for s in range(lo, max_stages):
            slot[i] = s
            yield from rec(i + 1, used | (1 << s))

    yield from rec(0, 0)
