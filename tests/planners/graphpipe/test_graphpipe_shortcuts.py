"""GraphPipe's planner shortcuts against the full paths they replace:

* micro-batch sizes pruned by a seed staging (``uniform.prune_sizes``): the plan picked is the
  same as with every size searched (or better: the seed is a candidate of its own);
* ``run_dp`` in chunks of targets: the same tables as one batch;
* ``devices_for_segments``'s lookup by bit mask (and with :func:`segment_fits` kept): the same
  values as ``devices_by_depth``.
"""

from __future__ import annotations

import random
import time

import numpy as np
import pytest
from test_dp_caps import deep_instance

from gpp_solver.formats.cluster import v100_cluster
from gpp_solver.planners.graphpipe import uniform
from gpp_solver.planners.graphpipe.dp import kernel
from gpp_solver.planners.graphpipe.dp.kernel import run_dp
from gpp_solver.planners.graphpipe.dp.stage_dp import StageDP
from gpp_solver.planners.graphpipe.dp.stage_tables import devices_by_depth, devices_for_segments, segment_fits
from gpp_solver.planners.graphpipe.planner import plan_graphpipe
from gpp_solver.workloads import build_model

MODELS = [
    ("mmt", 8, 128),
    ("transformer", 16, 256),
    ("dlrm", 8, 512),
    ("candle-uno", 4, 4096),
    ("transformer", 64, 1024),
]


def _same_or_better(got, want) -> None:
    a, b = got.predicted.iteration_time, want.predicted.iteration_time
    assert a <= b * (1 + 1e-12), (a, b)
    if a >= b * (1 - 1e-12):  # the same pick: the same plan
        assert [s.nodes for s in got.stages] == [s.nodes for s in want.stages]
        assert [s.devices for s in got.stages] == [s.devices for s in want.stages]


def _plans(graph, cluster, B, monkeypatch):
    with monkeypatch.context() as m:
        m.setattr(StageDP, "LARGE_TABLE", 0)  # the large-tree path on small instances
        pruned = []
        real = uniform.prune_sizes

        def spy(*a, **k):
            out = real(*a, **k)
            pruned.append(out[1])
            return out

        m.setattr(uniform, "prune_sizes", spy)
        got = plan_graphpipe(graph, cluster, B)
        m.setattr(uniform, "PRUNE_SIZES", False)
        want = plan_graphpipe(graph, cluster, B)
    return got, want, pruned


@pytest.mark.parametrize("name,devices,B", MODELS)
def test_pruned_sizes_pick_the_same_plan(name: str, devices: int, B: int, monkeypatch) -> None:
    graph, cluster = build_model(name), v100_cluster(devices)
    got, want, pruned = _plans(graph, cluster, B, monkeypatch)
    _same_or_better(got, want)
    assert got.search.extra.get("micro_batch_sizes_pruned", []) == (pruned[0] if pruned else [])
    assert set(got.search.extra["micro_batch_sizes_infeasible"]) <= set(
        want.search.extra["micro_batch_sizes_infeasible"]
    )


@pytest.mark.parametrize("seed", range(12))
def test_pruned_sizes_on_random_instances(seed: int, monkeypatch) -> None:
    graph, cluster, B = deep_instance(random.Random(7100 + seed))
    try:
        want_plan = True
        got, want, _ = _plans(graph, cluster, B, monkeypatch)
    except Exception as exc:  # noqa: BLE001 - infeasible instances: both paths must say so
        want_plan = False
        err = type(exc)
    if want_plan:
        _same_or_better(got, want)
    else:
        with monkeypatch.context() as m, pytest.raises(err):
            m.setattr(uniform, "PRUNE_SIZES", False)
            plan_graphpipe(graph, cluster, B)


@pytest.mark.parametrize("seed", range(10))
def test_run_dp_in_chunks_equals_one_batch(seed: int, monkeypatch) -> None:
    graph, cluster, B = deep_instance(random.Random(7300 + seed))
    dp = StageDP(graph, cluster, B)
    b = 1
    c = dp.candidates(b)
    ts = [float(x) for x in np.quantile(c, [0.0, 0.3, 0.6, 1.0])] if len(c) else [float("inf")]
    dev = dp._dev([(b, t) for t in ts], dp.E)
    whole = run_dp(dp.idx, dev, dp.E, keep=True)
    monkeypatch.setattr(kernel, "CHUNK_BYTES", 1)  # one target per chunk
    parts = run_dp(dp.idx, dev, dp.E, keep=True)
    assert np.array_equal(whole[0], parts[0])
    for x, y in zip(whole[1] + whole[2], parts[1] + parts[2]):
        assert np.array_equal(x, y)


@pytest.mark.parametrize("seed", range(200))
def test_devices_for_segments_equals_devices_by_depth(seed: int) -> None:
    rng = np.random.default_rng(seed)
    G, J, E, T = (int(x) for x in (rng.integers(1, 30), rng.integers(1, 14), rng.integers(1, 10), rng.integers(1, 5)))
    tps = rng.uniform(0, 1, (G, J))
    if seed % 3 == 0:
        tps[rng.uniform(size=(G, J)) < 0.2] = np.inf
    md = rng.choice([0, 1, 2, 3, 5, 8, 12, 1 << 30], size=(G, J)) if seed % 2 else rng.choice([0, 1 << 30], size=(G, J))
    if seed % 4 < 2:  # maxdepth non-decreasing along the degrees: the lookup
        md = np.sort(md, axis=1)
    degs = np.sort(rng.choice(np.arange(1, 40), size=J, replace=False))
    ts = rng.uniform(0, 1.2, T)
    used = np.sort(rng.choice(G, size=int(rng.integers(1, G + 1)), replace=False))
    want = devices_by_depth(tps, md, degs, ts, E)[:, used]
    assert np.array_equal(devices_for_segments(tps, md, degs, ts, used, E), want)
    big = np.zeros((T + 1, len(used) + 1, E + 2), dtype=np.int64)  # into a slice, with the fits kept
    devices_for_segments(tps, md, degs, ts, used, E, out=big[1:, :-1], fits=segment_fits(md, E))
    assert np.array_equal(big[1:, :-1], want)


@pytest.mark.parametrize(
    "name,kw,devices", [("mmt", {}, 32), ("transformer", {"layers": 24}, 64), ("mmt", {"branches": 8, "layers": 8}, 64)]
)
def test_large_path_on_mid_sized_trees(name: str, kw: dict, devices: int, monkeypatch) -> None:
    """``StageDP.large`` measures a pass by segments x depth^2: these trees (1,500-3,100 segments,
    depth bounds 27-64) take the large-tree path, which picks the plan the small-tree path picks."""
    graph, cluster, B = build_model(name, **kw), v100_cluster(devices), 16 * devices
    dp = StageDP(graph, cluster, B)
    assert dp.large() and len(dp.idx.seg_lo) * (dp.E + 2) < 1 << 20  # large by the square only
    got = plan_graphpipe(graph, cluster, B)
    monkeypatch.setattr(StageDP, "LARGE_TABLE", 1 << 62)  # the small-tree path
    want = plan_graphpipe(graph, cluster, B)
    _same_or_better(got, want)


def test_no_pruning_pass_that_cannot_end_before_the_deadline(monkeypatch) -> None:
    """The pruning pass of the lower-bound DP costs about ``LB_PASS_SHARE`` of the quick search's
    seconds per size; when that does not fit before the deadline it is not run: the seed stands,
    no size is pruned, and the search itself gets the time (MMT 25 x 66 on 1,024 V100s spent 10 s
    of a 20 s limit in a pruning pass that the deadline then threw away)."""
    from gpp_solver.planners.graphpipe import lower_bound_pruning as lbp
    from gpp_solver.sp_tree import decompose

    graph, cluster, B = build_model("mmt"), v100_cluster(8), 128
    monkeypatch.setattr(StageDP, "LARGE_TABLE", 0)
    dec = decompose(graph)
    sizes = [1, 2, 4, 8, 16, 32, 64, 128]

    def run(deadline):
        dp = StageDP(graph, cluster, B, decomposition=dec)
        return lbp.prune_sizes(graph, cluster, B, dec, dp, sizes, False, deadline, None)

    kept, pruned, seeds, lb, quick = run(None)
    assert pruned and lb is not None and seeds  # roomy: the pass runs and prunes
    monkeypatch.setattr(lbp, "LB_PASS_SHARE", 1e9)  # no pass can end before any deadline
    kept, pruned, seeds2, lb, quick2 = run(time.perf_counter() + 3600)
    assert (kept, pruned, lb) == (sizes, [], None)
    assert [(r.b, r.stages) for r, _ in seeds2] == [(r.b, r.stages) for r, _ in seeds] and quick2


def test_a_depth_search_called_out_of_time_runs_no_pass(monkeypatch) -> None:
    """``search_depths`` past its deadline with known stagings (``feasible``) answers ``[]`` for
    every size without a DP pass or a traceback: the caller's seed stands."""
    from gpp_solver.binary_search import search_depths

    graph, cluster, B = build_model("mmt"), v100_cluster(8), 128
    dp = StageDP(graph, cluster, B)
    monkeypatch.setattr(StageDP, "probe", lambda *a, **k: pytest.fail("a DP pass past the deadline"))
    got = search_depths(dp, [8, 16], deadline=time.perf_counter() - 1.0, feasible={16: (1.0, 2)})
    assert got == {8: [], 16: []}


def test_a_pass_out_of_time_builds_no_size_tables() -> None:
    """A size's tables take about a second on 5,000 operators: a pass checks its deadline before
    building each (in the grouping of its targets and their depth caps too), so a pass started
    past its deadline stops before building any."""
    from gpp_solver.errors import TimeLimitError

    graph, cluster, B = build_model("mmt"), v100_cluster(8), 128
    dp = StageDP(graph, cluster, B)
    pairs = [(8, 1.0), (16, 1.0), (32, 1.0)]
    for saturate in (None, 1):
        with pytest.raises(TimeLimitError):
            dp.probe(pairs, keep=False, saturate=saturate, deadline=time.perf_counter() - 1.0)
        assert dp._cache == {}
    assert dp.probe(pairs, keep=False).devices.shape == (3, dp.E + 1)  # no deadline: the pass as before


def test_a_pass_stops_inside_a_long_series_at_its_deadline():
    """A pass checks its deadline at every child of a series, not only between groups of tree
    nodes: MMT of two 40-layer branches at 1,024 devices is three groups, one of which holds
    0.36 of a 1.2 s pass (on MMT 25 x 66 such groups ran a pruning pass 54 s past a 120 s
    limit)."""
    from gpp_solver.errors import TimeLimitError

    dp = StageDP(build_model("mmt", branches=2, layers=40), v100_cluster(1024), 16384)
    dev = dp._dev([(16, 1.0)], dp.E)
    t0 = time.perf_counter()
    run_dp(dp.idx, dev, dp.E)
    full = time.perf_counter() - t0
    t0 = time.perf_counter()
    with pytest.raises(TimeLimitError):
        run_dp(dp.idx, dev, dp.E, deadline=t0 + 0.05 * full)
    assert time.perf_counter() - t0 < 0.25 * full, (time.perf_counter() - t0, full)  # 0.36 when checked per group
