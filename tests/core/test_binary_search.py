"""Algorithm 1's outer loop: exact search over sorted candidate TPS values, batched over b."""

from __future__ import annotations

import math
import time

import pytest

from gpp_solver.binary_search import search_tps
from gpp_solver.planners.graphpipe.dp.stage_dp import StageDP
from gpp_solver.types import Cluster
from gpp_solver.workloads import build_model


@pytest.fixture(scope="module")
def mmt_dp() -> StageDP:
    g = build_model("mmt", branches=2, layers=3)
    c = Cluster(
        devices=8,
        memory_bytes=16 * 2**30,
        devices_per_node=4,
        intra_node_bandwidth=50e9,
        inter_node_bandwidth=12.5e9,
        latency=1e-5,
    )
    return StageDP(g, c, 64)


@pytest.mark.parametrize("b", [1, 4, 16, 64])
def test_search_ends_exactly_at_the_smallest_feasible_candidate(mmt_dp: StageDP, b: int) -> None:
    res = search_tps(mmt_dp, b)
    assert res is not None and res.exact
    cands = [float(x) for x in mmt_dp.candidates(b)]
    assert res.tps in cands
    assert mmt_dp.feasible(b, res.tps)
    below = [x for x in cands if x < res.tps]
    if below:
        assert not mmt_dp.feasible(b, below[-1])
    assert res.tps >= mmt_dp.lower_bound(b) * (1 - 1e-12)
    assert res.probes <= math.ceil(math.log2(res.candidates)) + 1


def test_expired_deadline_still_returns_a_feasible_answer(mmt_dp: StageDP) -> None:
    res = search_tps(mmt_dp, 8, deadline=time.perf_counter() - 1.0)
    assert res is not None and not res.exact
    assert mmt_dp.feasible(8, res.tps)
    full = search_tps(mmt_dp, 8)
    assert full is not None and full.tps <= res.tps


def test_batched_search_equals_one_size_at_a_time(mmt_dp: StageDP) -> None:
    from gpp_solver.binary_search import search_many

    sizes = [1, 2, 8, 32]
    together = search_many(mmt_dp, sizes)
    for b in sizes:
        alone = search_tps(mmt_dp, b)
        assert together[b].tps == alone.tps and together[b].stages == alone.stages


def test_search_depths_gives_the_least_target_at_every_depth_bound(mmt_dp: StageDP) -> None:
    from gpp_solver.binary_search import search_depths, search_many

    sizes = [2, 8, 32]
    pareto = search_depths(mmt_dp, sizes)
    plain = search_many(mmt_dp, sizes)
    D = mmt_dp.D
    for b in sizes:
        pts = pareto[b]
        assert pts, b
        # the deepest point is the paper's answer (smallest TPS at b), stages included
        assert pts[-1].tps == plain[b].tps and pts[-1].stages == plain[b].stages
        assert [p.tps for p in pts] == sorted({p.tps for p in pts}, reverse=True)
        assert [p.depth_bound for p in pts] == sorted({p.depth_bound for p in pts})
        cands = [float(x) for x in mmt_dp.candidates(b)]
        for p in pts:
            e = p.depth_bound
            assert max(s.depth for s in p.stages) <= e
            assert sum(s.degree for s in p.stages) <= D
            assert max(s.tps_estimate for s in p.stages) <= p.tps
            below = [x for x in cands if x < p.tps]
            if below:  # nothing smaller reaches depth <= e
                assert mmt_dp.min_devices_by_depth([(b, below[-1])])[0, e] > D
        # a depth bound that is not a Pareto point gains nothing over the next shallower one
        for e in range(1, mmt_dp.E + 1):
            best = [p.tps for p in pts if p.depth_bound <= e]
            if best:
                assert mmt_dp.min_devices_by_depth([(b, min(best))])[0, e] <= D
