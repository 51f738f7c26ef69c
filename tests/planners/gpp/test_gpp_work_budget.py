"""gpp's local-search work cap (``max_work``, node-evaluations): a count, so a capped run is still
deterministic and ``feasible`` (not ``time-limit``); the cap holds; it does not bind on the paper's
workloads; bad values are refused."""

from __future__ import annotations

import pytest

import gpp_solver as gs
from gpp_solver.errors import InvalidInputError
from gpp_solver.formats.cluster import v100_cluster
from gpp_solver.planners.gpp.chains import chain_states
from gpp_solver.planners.gpp.local_search import search
from gpp_solver.planners.gpp.options import DEFAULT_MAX_WORK, WORK_SHARE
from gpp_solver.planners.gpp.partition_eval import Problem
from gpp_solver.planners.gpp.planner import plan_gpp
from gpp_solver.workloads import build_model


@pytest.fixture(scope="module")
def mmt():
    return build_model("mmt", branches=2, layers=3)


@pytest.mark.parametrize("cap", [1, 7, 40, 200])
def test_search_stops_after_max_evaluations(mmt, cap):
    P = Problem(mmt, v100_cluster(8), 64, 8)
    start = min((st for _, st in chain_states(P)), key=lambda st: P.evaluate(st.assign, st.devs).key)
    full = search(P, start, max_iterations=400)
    res = search(P, start, max_iterations=400, max_evaluations=cap)
    assert res.evaluations <= cap + 3  # the start's pricing, one move's re-pricing
    if full.evaluations > cap + 3:
        assert res.stopped == "evaluations"
    assert res.ev.key >= full.ev.key and res.ev.key <= P.evaluate(start.assign, start.devs).key


def test_capped_run_is_deterministic_feasible_and_keeps_to_the_cap(mmt):
    c = v100_cluster(8)
    n = len(mmt.nodes)
    cap = 300 * n
    p1 = plan_gpp(mmt, c, 64, max_work=cap, time_limit=60)
    p2 = plan_gpp(mmt, c, 64, max_work=cap, time_limit=60)
    w = p1.search.extra["work"]
    assert w["max_work"] == cap and w["used"] <= cap + WORK_SHARE * 3 * n
    assert p1.search.status == "feasible"
    stops = [v.get("stopped") for v in p1.search.extra["per_micro_batch"].values()]
    assert w["skipped"] > 0 or "evaluations" in stops  # the cap did bind
    assert p1.predicted.iteration_time == p2.predicted.iteration_time
    assert [s.nodes for s in p1.stages] == [s.nodes for s in p2.stages]
    gs.validate(p1, mmt, c)
    # never worse than its seeds, capped or not
    for _name, info in p1.search.extra["seeds"].items():
        if "iteration_time" in info:
            assert p1.predicted.iteration_time <= info["iteration_time"] * (1 + 1e-12)
    uncapped = plan_gpp(mmt, c, 64, max_work=None, time_limit=60)
    assert uncapped.search.extra["work"]["used"] >= w["used"]


def test_default_cap_does_not_bind_on_a_paper_workload():
    g = build_model("dlrm")
    p = plan_gpp(g, v100_cluster(8), 512, time_limit=60)
    w = p.search.extra["work"]
    assert w["max_work"] == DEFAULT_MAX_WORK and w["skipped"] == 0
    assert w["used"] < DEFAULT_MAX_WORK / WORK_SHARE / 4
    assert all(v.get("stopped") != "evaluations" for v in p.search.extra["per_micro_batch"].values())


@pytest.mark.parametrize("bad", [0, -5, 1.5, True, "10"])
def test_bad_max_work_is_refused(mmt, bad):
    with pytest.raises(InvalidInputError, match="max_work"):
        plan_gpp(mmt, v100_cluster(8), 64, max_work=bad)
