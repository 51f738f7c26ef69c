"""The stage DP's scale devices against the plain DP they replace, on random instances with deep
chains, shared sinks and many devices:

* the depth cap (``StageDP.depth_cap``, depths saturated in ``run_dp(sat=True)``): the fewest
  devices at any depth equal the uncapped DP's, the columns below the cap too, for every cap the
  DP may choose; tracebacks under the cap are valid stagings of that value, and with the retrace
  they are the uncapped DP's stagings;
* segments no target can use left out of the table (``StageDP._dev``): the same values as the
  dense table of every segment;
* the search (galloping, saturated first phase, the preliminary depth-bounded search): the same
  answers as the search without them.
"""

from __future__ import annotations

import random

import numpy as np
import pytest
from tiny_graphs import random_dag_edges

from gpp_solver import binary_search
from gpp_solver.binary_search import search_depths, search_many
from gpp_solver.formats.graph import graph_from_dict
from gpp_solver.planners.graphpipe.dp.kernel import run_dp
from gpp_solver.planners.graphpipe.dp.stage import decode, encode
from gpp_solver.planners.graphpipe.dp.stage_dp import StageDP
from gpp_solver.planners.graphpipe.dp.stage_tables import devices_by_depth
from gpp_solver.planners.graphpipe.dp.tree import SegDev
from gpp_solver.types import Cluster


def deep_instance(rng: random.Random):
    """A chain (with a few skip edges, or parallel blocks joined by a shared sink and followed by a
    chain) of up to ~22 operators on up to 16 devices, memory tight enough that stages fit only
    down to various depths."""
    if rng.random() < 0.5:  # a chain, maybe with skip edges
        n = rng.randint(2, 14)
        edges = {(i, i + 1) for i in range(n - 1)}
        if rng.random() < 0.5:
            edges |= set(random_dag_edges(rng, n, 0.15, 0.2))
    else:  # blocks of parallel branches joined by a sink, then a chain tail
        edges, n = set(), 1
        for _ in range(rng.randint(1, 2)):
            src, ends = n - 1, []
            for _ in range(rng.randint(2, 3)):
                prev = src
                for _ in range(rng.randint(1, 3)):
                    edges.add((prev, n))
                    prev, n = n, n + 1
                ends.append(prev)
            edges |= {(e, n) for e in ends}
            n += 1
        for _ in range(rng.randint(1, 3)):
            edges.add((n - 1, n))
            n += 1
    names = [f"v{i}" for i in range(n)]
    nodes = []
    for v in names:
        f1 = rng.uniform(0.5, 3.0)
        fw = [f1, f1 * rng.uniform(1.0, 2.0), 0.0, 0.0]
        fw[2] = fw[1] * rng.uniform(1.0, 2.0)
        fw[3] = fw[2] * rng.uniform(1.0, 2.0)
        nodes.append(
            {
                "id": v,
                "fw_time": fw,
                "bw_time": [2 * x for x in fw],
                "weight_bytes": rng.choice([0.0, rng.uniform(10, 100)]),
                "activation_bytes": rng.uniform(1, 40),
                "output_bytes": rng.uniform(1, 30),
            }
        )
    graph = graph_from_dict(
        {
            "name": "deep",
            "micro_batch_sizes": [1, 2, 4, 8],
            "nodes": nodes,
            "edges": [{"src": names[a], "dst": names[b]} for a, b in sorted(edges)],
        }
    )
    D = rng.choice([4, 8, 16])
    cluster = Cluster(
        devices=D,
        memory_bytes=rng.uniform(200, 3000),
        devices_per_node=rng.choice([None, 2, 4]),
        intra_node_bandwidth=rng.uniform(50, 200),
        inter_node_bandwidth=rng.uniform(5, 50),
        latency=rng.choice([0.0, 0.05]),
        optimizer_state_factor=rng.choice([1.0, 4.0]),
    )
    B = rng.choice([8, 16, 32])
    return graph, cluster, B


def _targets(dp: StageDP, b: int) -> list[float]:
    c = dp.candidates(b)
    if len(c) == 0:
        return [float("inf")]
    return [float(x) for x in np.quantile(c, [0.0, 0.1, 0.25, 0.5, 0.75, 1.0])] + [float("inf")]


def _check_staging(dp: StageDP, graph, b: int, t: float, stages, devices: int) -> None:
    assert sorted(v for s in stages for v in s.nodes) == sorted(graph.ids)
    assert sum(s.degree for s in stages) == devices <= dp.D
    assert all(s.tps_estimate <= t for s in stages)


@pytest.mark.parametrize("seed", range(60))
def test_capped_dp_equals_the_uncapped_dp(seed: int) -> None:
    graph, cluster, B = deep_instance(random.Random(9000 + seed))
    dp = StageDP(graph, cluster, B)
    for b in (1, 2, 4, 8):
        if B % b:
            continue
        pairs = [(b, t) for t in _targets(dp, b)]
        full = dp.probe(pairs)
        M1 = dp.depth_cap(b)
        for floor in range(1, dp.E + 2):
            C = dp.depth_cap(b, floor)
            assert C == min(dp.E, max(M1, floor))
            capped = dp.probe(pairs, saturate=floor)
            big = np.minimum(full.devices, dp.D + 1)  # above D: infeasible (a deeper staging than E needs more)
            got = np.minimum(capped.devices, dp.D + 1)
            assert np.array_equal(got[:, dp.E], big[:, dp.E]), (b, floor, C)
            for i, (_, t) in enumerate(pairs):
                # each target's own cap: at most its size's, at least the floor; the columns below it exact
                Ci = dp.depth_cap(b, floor, t)
                assert min(floor, dp.E) <= Ci <= C
                assert np.array_equal(got[i, :Ci], big[i, :Ci]), (b, floor, t, Ci)
                if full.devices[i, dp.E] > dp.D:
                    continue
                # the retrace: the uncapped DP's staging (either way of tracing shared sinks)
                assert dp.traceback(capped, i) == dp.traceback(full, i)
                assert dp.traceback(capped, i, False) == dp.traceback(full, i, False)
                # without it: a staging of the same value under the cap
                old = dp.RETRACE_BYTES
                dp.RETRACE_BYTES = -1
                try:
                    st = dp.traceback(capped, i)
                finally:
                    dp.RETRACE_BYTES = old
                # (the traceback stages the shallowest depth bound that fits in D devices)
                e0 = int(np.nonzero(capped.devices[i] <= dp.D)[0][0])
                _check_staging(dp, graph, b, t, st, int(capped.devices[i, e0]))
                assert max(s.depth for s in st) <= min(e0, Ci)


@pytest.mark.parametrize("seed", range(40))
def test_the_table_of_used_segments_equals_the_dense_table(seed: int) -> None:
    graph, cluster, B = deep_instance(random.Random(9500 + seed))
    dp = StageDP(graph, cluster, B)
    for b in (1, 2, 4, 8):
        if B % b:
            continue
        tb = dp.tables(b)
        ts = _targets(dp, b)
        dense = encode(devices_by_depth(tb.tps, tb.maxdepth, tb.degrees, np.asarray(ts), dp.E))
        want = decode(run_dp(dp.idx, SegDev(dense), dp.E)[0][:, 0, :])
        got = dp.probe([(b, t) for t in ts], keep=False).devices
        assert np.array_equal(np.minimum(got, 10**9), np.minimum(want, 10**9))
        pr = dp._dev([(b, t) for t in ts], dp.E)
        assert np.array_equal(pr[:, np.arange(len(tb.tps))], dense)


@pytest.mark.parametrize("seed", range(25))
def test_search_with_depth_caps_equals_the_search_without(seed: int, monkeypatch) -> None:
    graph, cluster, B = deep_instance(random.Random(9800 + seed))
    sizes = [b for b in (1, 2, 4, 8) if B % b == 0]
    for max_bound, pre in ((None, 16), (1, 1), (3, 2), (None, 3)):
        with monkeypatch.context() as m:  # the large-tree path: galloping, capped first phase,
            m.setattr(StageDP, "LARGE_TABLE", 0)  # a preliminary search bounded to depth `pre`
            m.setattr(binary_search, "PRE_DEPTH", pre)
            got = search_depths(StageDP(graph, cluster, B), sizes, max_bound=max_bound)
            nocap = search_many(StageDP(graph, cluster, B), sizes)
        with monkeypatch.context() as m:  # the small-tree path: k-ary over every candidate, no cap
            m.setattr(StageDP, "LARGE_TABLE", 1 << 62)
            want = search_depths(StageDP(graph, cluster, B), sizes, max_bound=max_bound)
            plain = search_many(StageDP(graph, cluster, B), sizes)
        for b in sizes:
            assert (nocap[b] is None) == (plain[b] is None)
            if plain[b] is not None:
                assert (nocap[b].tps, nocap[b].stages) == (plain[b].tps, plain[b].stages)
        for b in sizes:
            assert [(r.tps, r.stages, r.depth_bound) for r in got[b]] == [
                (r.tps, r.stages, r.depth_bound) for r in want[b]
            ], (b, max_bound)
