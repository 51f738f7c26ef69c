"""How ``gpp`` treats its seed plans' orders under a zero-bubble schedule: made again once, when
they join the candidates and there is time for it (about ``RESCHEDULE_VALIDATIONS`` validations of
the plan), kept when the plan is the pick; and a seed planner's own validation is not run twice."""

from __future__ import annotations

import pytest

from gpp_solver.formats.cluster import v100_cluster
from gpp_solver.formats.plan_json import plan_to_dict
from gpp_solver.plan.validate import validate
from gpp_solver.planners.gpp import searches
from gpp_solver.planners.gpp.plans import rebuild_as_gpp, reschedule
from gpp_solver.planners.registry import get_planner
from gpp_solver.types import SearchInfo, Status
from gpp_solver.workloads import build_model


@pytest.fixture(scope="module")
def mmt8():
    g = build_model("mmt", branches=2, layers=3)
    c = v100_cluster(8)
    return g, c, get_planner("graphpipe")(g, c, 64)


def test_a_rescheduled_seed_renamed_is_the_plan_made_again(mmt8):
    """``orders="built"`` (the pick was rescheduled when it joined the pool) gives, without making
    its orders again, the plan that ``"remake"`` makes: the same orders, figures and records."""
    g, c, seed = mmt8
    q = reschedule(seed, g, c, "auto")
    assert q is not seed and any(a[0] == "W" for s in q.stages for a in s.schedule.order)
    assert q.predicted.iteration_time < seed.predicted.iteration_time  # zero bubble wins here
    info = SearchInfo(0.0, Status.FEASIBLE)
    built = rebuild_as_gpp(q, g, c, info, "auto", orders="built")
    remade = rebuild_as_gpp(q, g, c, info, "auto", orders="remake")
    assert plan_to_dict(built) == plan_to_dict(remade)
    validate(built, g, c)
    own = rebuild_as_gpp(seed, g, c, info, "auto", orders="own")
    assert [s.schedule.order for s in own.stages] == [s.schedule.order for s in seed.stages]


def test_a_seed_without_time_for_new_orders_keeps_its_own(monkeypatch):
    """When the time left is less than the estimate, the seed joins with its own orders; the run
    says so and is cut (its result depends on the machine's speed)."""
    g, c = build_model("mmt", branches=2, layers=3), v100_cluster(8)
    plan = get_planner("gpp")(g, c, 64, time_limit=5.0)
    seeds = plan.search.extra["seeds"]
    assert "rescheduled" not in seeds["graphpipe"] and plan.search.status is not Status.TIME_LIMIT
    monkeypatch.setattr(searches, "RESCHEDULE_VALIDATIONS", 1e12)
    cut = get_planner("gpp")(g, c, 64, time_limit=5.0)
    seeds = cut.search.extra["seeds"]
    assert seeds["graphpipe"]["rescheduled"] == "no: time limit"
    assert cut.search.status is Status.TIME_LIMIT
    validate(cut, g, c)
    assert cut.predicted.iteration_time >= plan.predicted.iteration_time * (1 - 1e-9)  # never a better plan


@pytest.mark.parametrize("name", ["graphpipe", "pipedream-2bw", "alpa", "pipedream"])
def test_a_seed_with_its_own_orders_built_again_is_the_same_plan(name):
    """What lets ``answer.finish`` rename a seed kept with its own orders instead of building and
    validating it again: built again from its stages and orders, a validated seed plan is itself
    (stages, edges, figures), whatever planner made it."""
    g, c = build_model("mmt", branches=2, layers=3), v100_cluster(8)
    seed = get_planner(name)(g, c, 64)
    validate(seed, g, c)
    own = rebuild_as_gpp(seed, g, c, SearchInfo(0.0, Status.FEASIBLE), "auto", orders="own")

    def what(plan):  # all but the schedule's kind: kept orders are written "custom"
        return [
            (
                s.nodes,
                s.devices,
                s.micro_batch_size,
                s.schedule.order,
                s.in_flight_samples,
                s.predicted,
                s.tensor_parallel,
                s.recompute,
                s.zero,
            )
            for s in plan.stages
        ]

    assert what(own) == what(seed) and own.edges == seed.edges and own.predicted == seed.predicted
    assert own.search.iteration_time_estimate == seed.search.iteration_time_estimate


def test_the_pick_kept_with_its_own_orders_is_validated_once(monkeypatch):
    """A seed kept with its own orders (no time to make them again) is the answer as the seed phase
    validated it: the answer is not built or validated a second time, and it is valid."""
    from gpp_solver.planners.gpp import answer, planner, plans, seeds

    g, c = build_model("mmt", branches=2, layers=3), v100_cluster(8)
    monkeypatch.setattr(searches, "RESCHEDULE_VALIDATIONS", 1e12)
    for phase in ("search_sizes", "restart", "polish_best"):  # none ran, as when the seeds took the time
        monkeypatch.setattr(planner, phase, lambda run: None)
    monkeypatch.setattr(plans, "build_plan", lambda *a, **k: pytest.fail("built again"))  # rebuild_as_gpp's builds
    calls = []
    monkeypatch.setattr(seeds, "validate", lambda p, *a: calls.append("seed") or validate(p, *a))
    monkeypatch.setattr(answer, "validate", lambda p, *a: calls.append("answer") or validate(p, *a))
    plan = get_planner("gpp")(g, c, 64, time_limit=5.0, tighten=False, exact=False, seed_planners=("graphpipe",))
    assert plan.search.extra["seed_planner"] == "graphpipe" and plan.search.extra["moves"] == 0
    assert plan.search.extra["seeds"]["graphpipe"]["rescheduled"] == "no: time limit"
    assert calls == ["seed"]
    validate(plan, g, c)


def test_graphpipe_as_a_seed_skips_its_own_validation(monkeypatch):
    """``gpp`` validates every seed plan itself (and times it), so GraphPipe's own final check is
    off there (a validation of a 5,000-operator plan takes seconds); on its own it still runs."""
    from gpp_solver.planners.graphpipe import planner as gp

    calls = []
    real = gp.validate
    monkeypatch.setattr(gp, "validate", lambda *a, **k: calls.append(1) or real(*a, **k))
    g, c = build_model("mmt", branches=2, layers=3), v100_cluster(8)
    get_planner("graphpipe")(g, c, 64)
    assert len(calls) == 1
    calls.clear()
    plan = get_planner("gpp")(g, c, 64, time_limit=5.0)
    assert calls == [] and plan.search.extra["seeds"]["graphpipe"]["validate_seconds"] > 0
