"""Brute-force oracle: enumerate every plan of a tiny graph and keep the best.

The search space is the exact planners' (convex stages with an acyclic stage graph, one
micro-batch size, ``b % d == 0``, 1F1B, contiguous device ranges in a topological order of the
stage graph); the objective is the cost model's bottleneck time-per-sample.  Both are enumerated
and evaluated here independently of the MILP (its space module is not used: the stages come
from :func:`ordered_partitions` below, the figures straight from the cost-model formulas), and the winner is built with
``build_plan`` so its figures are the cost model's.  Only for tiny inputs: at most
:data:`MAX_NODES` nodes and :data:`MAX_DEVICES` devices.

Also here: small random instances (chains, diamonds, series-parallel and general DAGs with several
sources/sinks) that the oracle-based tests and ``benchmarks/optimality_gap.py`` share.
"""

from __future__ import annotations

import logging
import math
import random
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from itertools import accumulate, product

from gpp_solver.cost.micro_batch import check_micro_batch_sizes
from gpp_solver.cost.model import comm_time, memory_per_device, node_compute, time_per_sample
from gpp_solver.cost.network import constant_bandwidth
from gpp_solver.cost.time_terms import TimeTerms
from gpp_solver.errors import SearchSpaceTooLargeError
from gpp_solver.formats.graph import graph_from_dict
from gpp_solver.plan.build import StageSpec, build_plan
from gpp_solver.types import Cluster, Graph, Plan, SearchInfo, Status

logger = logging.getLogger(__name__)

MAX_NODES = 8
MAX_DEVICES = 4
#: A stage fits when ``M(S) <= memory_bytes * (1 + MEMORY_REL_TOL)`` (the validator's tolerance).
MEMORY_REL_TOL = 1e-9


def ordered_partitions(
    graph: Graph, max_stages: int, *, every_order: bool = True
) -> Iterator[tuple[tuple[str, ...], ...]]:
    """Every partition of the nodes into at most ``max_stages`` convex stages with an acyclic stage
    graph, the stages listed in a topological order of the stage graph.

    A stage numbering of the nodes that never decreases along an edge and uses the numbers
    ``0..k-1`` is exactly such a partition listed in such an order; the numberings come in
    lexicographic order (nodes in the graph's topological order).  With ``every_order`` each
    partition comes once per topological order of its stage graph (the placement differs);
    otherwise once.
    """
    topo = graph.topo_order
    at = {v: i for i, v in enumerate(topo)}
    earlier_preds = [[at[p] for p in graph.preds(v)] for v in topo]
    label: list[int] = []
    seen: set[frozenset[frozenset[str]]] = set()

    def numberings() -> Iterator[tuple[int, ...]]:
        i = len(label)
        if i == len(topo):
            if len(set(label)) == max(label) + 1:
                yield tuple(label)
            return
        for s in range(max((label[p] for p in earlier_preds[i]), default=0), max_stages):
            label.append(s)
            yield from numberings()
            label.pop()

    for numbering in numberings():
        parts = tuple(tuple(v for v, s in zip(topo, numbering) if s == t) for t in range(max(numbering) + 1))
        if not every_order:
            key = frozenset(frozenset(p) for p in parts)
            if key in seen:
                continue
            seen.add(key)
        yield parts


def device_options(b: int, devices: int) -> tuple[int, ...]:
    """Data-parallel degrees of a stage of micro-batch size ``b``: ``1 <= d <= devices``, ``d`` divides ``b``."""
    return tuple(d for d in range(1, devices + 1) if b % d == 0)


def contiguous_ranges(counts: Sequence[int]) -> list[tuple[int, ...]]:
    """The placement: the stages take consecutive device ranges from device 0, in their order."""
    ends = list(accumulate(counts))
    return [tuple(range(end - c, end)) for c, end in zip(counts, ends)]


def in_flight_samples(depth: int, b: int, mini_batch_size: int) -> int:
    """1F1B: a stage ``depth`` stages above the sinks holds ``depth + 1`` micro-batches, at most all ``B / b``."""
    return b * min(depth + 1, mini_batch_size // b)


@dataclass(frozen=True)
class Candidate:
    """One point of the search space with its cost-model figures."""

    tps: float
    peak_memory: float
    stages: tuple[tuple[str, ...], ...]
    micro_batch_size: int
    devices: tuple[int, ...]


def candidates(
    graph: Graph, cluster: Cluster, mini_batch_size: int, *, micro_batch_sizes: Sequence[int] | None = None
) -> Iterator[Candidate]:
    """Every plan of the search space (memory not checked), priced by the cost model."""
    if len(graph.nodes) > MAX_NODES or cluster.devices > MAX_DEVICES:
        raise SearchSpaceTooLargeError(
            f"brute-force oracle handles at most {MAX_NODES} nodes and {MAX_DEVICES} devices, "
            f"got {len(graph.nodes)} nodes and {cluster.devices} devices"
        )
    B, N = mini_batch_size, cluster.devices
    sizes = check_micro_batch_sizes(B, micro_batch_sizes)
    const_bw = constant_bandwidth(cluster)
    lat, osf = cluster.latency, cluster.optimizer_state_factor
    gs = graph.micro_batch_sizes
    comp: dict[tuple[str, float], float] = {}
    terms = TimeTerms.of(graph, cluster, B)

    def c(v: str, x: float) -> float:
        r = comp.get((v, x))
        if r is None:
            nd = graph.node(v)
            r = comp[(v, x)] = node_compute(nd.fw_time, nd.bw_time, gs, x, terms.node_overhead)
        return r

    max_stages = min(N, len(graph.nodes))
    for parts in ordered_partitions(graph, max_stages, every_order=const_bw is None):
        k = len(parts)
        stage_of = {v: s for s, p in enumerate(parts) for v in p}
        tr: dict[tuple[str, int], float] = {}
        for (u, v), nbytes in graph.edge_bytes_map.items():
            if stage_of[u] != stage_of[v]:
                tr[(u, stage_of[v])] = max(tr.get((u, stage_of[v]), 0.0), nbytes)
        transfers = [(stage_of[u], cs, nb) for (u, cs), nb in tr.items()]
        succ: list[set[int]] = [set() for _ in range(k)]
        for ps, cs, _ in transfers:
            succ[ps].add(cs)
        depth = [0] * k
        for s in reversed(range(k)):  # parts are in topological order
            depth[s] = max((depth[t] + 1 for t in succ[s]), default=0)
        weight = [sum(graph.node(v).weight_bytes for v in p) for p in parts]
        act = [sum(graph.node(v).activation_bytes for v in p) for p in parts]
        for b in sizes:
            opts = device_options(b, N)
            for counts in product(opts, repeat=k):
                if sum(counts) > N:
                    continue
                ranges = contiguous_ranges(counts)
                tps = mem = 0.0
                for s in range(k):
                    d = counts[s]
                    x = b / d
                    comm = 0.0
                    for ps, cs, nb in transfers:
                        if s in (ps, cs):
                            bw = const_bw if const_bw is not None else cluster.bandwidth(ranges[ps] + ranges[cs])
                            comm += comm_time(nb, x, bw, lat)
                    bw_self = const_bw if const_bw is not None else cluster.bandwidth(ranges[s])
                    t = time_per_sample(
                        sum(c(v, x) for v in parts[s]) + 2 * comm, b, terms.tail(weight[s], d, bw_self, b), B
                    )
                    m = memory_per_device(osf, weight[s], in_flight_samples(depth[s], b, B), d, act[s])
                    tps, mem = max(tps, t), max(mem, m)
                yield Candidate(tps, mem, parts, b, tuple(counts))


def _plan(graph: Graph, cluster: Cluster, B: int, cand: Candidate, seconds: float) -> Plan:
    specs = [
        StageSpec(nodes=p, devices=r, micro_batch_size=cand.micro_batch_size)
        for p, r in zip(cand.stages, contiguous_ranges(cand.devices))
    ]
    return build_plan(
        graph,
        cluster,
        specs,
        B,
        planner="oracle",
        search=SearchInfo(seconds=seconds, status=Status.OPTIMAL_TIME_PER_SAMPLE),
    )


def best_plan_bruteforce(
    graph: Graph, cluster: Cluster, mini_batch_size: int, *, micro_batch_sizes: Sequence[int] | None = None
) -> tuple[float, Plan | None]:
    """``(bottleneck TPS, plan)`` of the best plan that fits in memory; ``(inf, None)`` if none fits.

    Raises :class:`SearchSpaceTooLargeError` above :data:`MAX_NODES` nodes or :data:`MAX_DEVICES` devices.
    """
    t0 = time.perf_counter()
    limit = cluster.memory_bytes * (1 + MEMORY_REL_TOL)
    best: Candidate | None = None
    for cand in candidates(graph, cluster, mini_batch_size, micro_batch_sizes=micro_batch_sizes):
        if cand.peak_memory <= limit and (best is None or cand.tps < best.tps):
            best = cand
    if best is None:
        return math.inf, None
    return best.tps, _plan(graph, cluster, mini_batch_size, best, time.perf_counter() - t0)


def min_peak_memory_bruteforce(
    graph: Graph, cluster: Cluster, mini_batch_size: int, *, micro_batch_sizes: Sequence[int] | None = None
) -> float:
    """The smallest per-device memory with which some plan of the search space fits."""
    return min(c.peak_memory for c in candidates(graph, cluster, mini_batch_size, micro_batch_sizes=micro_batch_sizes))


# --------------------------------------------------------------------------------------------
# tiny random instances

GRAPH_KINDS = ("chain", "diamond", "sp", "dag")


def _edges(rng: random.Random, kind: str, n: int) -> list[tuple[int, int]]:
    if kind == "chain":
        return [(i, i + 1) for i in range(n - 1)]
    if kind == "diamond":  # a fan-out, parallel branches (some of length 2), a fan-in
        k = n - 2
        branches: list[list[int]] = [[] for _ in range(rng.randint(2, max(2, k // 2 + 1)))]
        for i in range(1, n - 1):
            branches[(i - 1) % len(branches)].append(i)
        out = []
        for br in (b for b in branches if b):
            out += [(0, br[0])] + list(zip(br, br[1:])) + [(br[-1], n - 1)]
        return out
    if kind == "sp":  # recursive series / parallel composition over nodes 0..n-1, series at the top

        def build(lo: int, hi: int, top: bool) -> tuple[list[tuple[int, int]], list[int], list[int]]:
            if hi - lo == 1:
                return [], [lo], [lo]
            mid = rng.randint(lo + 1, hi - 1)
            e1, s1, t1 = build(lo, mid, False)
            e2, s2, t2 = build(mid, hi, False)
            if top or rng.random() < 0.5:  # series
                return e1 + e2 + [(a, b) for a in t1 for b in s2], s1, t2
            return e1 + e2, s1 + s2, t1 + t2

        return build(0, n, True)[0]
    # general DAG: each node takes 1-2 predecessors among earlier nodes, some nodes start fresh
    out = []
    for i in range(1, n):
        if i >= 2 and rng.random() < 0.2:
            continue  # a new source (connected later through its successors)
        out += [(p, i) for p in rng.sample(range(i), min(i, rng.choice((1, 1, 2))))]
    return out


def random_graph(rng: random.Random, kind: str, n: int, *, name: str | None = None) -> Graph:
    """A random weakly connected DAG of ``n`` nodes of the given ``kind`` with random costs."""
    import networkx as nx

    for _ in range(100):
        edges = sorted(set(_edges(rng, kind, n)))
        g = nx.DiGraph(edges)
        g.add_nodes_from(range(n))
        if nx.is_weakly_connected(g):
            break
    else:  # pragma: no cover - the generators above almost always connect
        edges = [(i, i + 1) for i in range(n - 1)]
    sizes = [1, 2, 4, 8]
    nodes = []
    for i in range(n):
        base, per = rng.uniform(1e-4, 1e-3), rng.uniform(1e-4, 2e-3)
        fw = [base + per * x for x in sizes]
        nodes.append(
            {
                "id": f"n{i}",
                "fw_time": fw,
                "bw_time": [t * rng.uniform(1.5, 2.5) for t in fw],
                "weight_bytes": rng.uniform(1e6, 6e7),
                "activation_bytes": rng.uniform(1e5, 8e6),
                "output_bytes": rng.uniform(1e5, 8e6),
            }
        )
    return graph_from_dict(
        {
            "name": name or f"{kind}-{n}",
            "micro_batch_sizes": sizes,
            "nodes": nodes,
            "edges": [{"src": f"n{a}", "dst": f"n{b}"} for a, b in edges],
        }
    )


def random_cluster(
    rng: random.Random, devices: int = 4, *, placement: bool = False, memory_bytes: float = 64e9
) -> Cluster:
    """A small cluster: flat network, or two devices per node with a faster intra-node link."""
    if placement:
        return Cluster(
            devices=devices,
            memory_bytes=memory_bytes,
            devices_per_node=2,
            intra_node_bandwidth=rng.uniform(2e10, 6e10),
            inter_node_bandwidth=rng.uniform(2e9, 8e9),
            latency=1e-5,
        )
    return Cluster(
        devices=devices, memory_bytes=memory_bytes, inter_node_bandwidth=rng.uniform(3e9, 2e10), latency=1e-5
    )
