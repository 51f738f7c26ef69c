"""Typed records that cross modules: a plan's status, a schedule action, SearchInfo's common fields,
and the plan JSON round trip of every planner."""

from __future__ import annotations

import copy
import json

import pytest
from tiny_graphs import diamond_dict

import gpp_solver as gs
from gpp_solver.action import Action, Kind, order_text, parse_order
from gpp_solver.errors import InvalidPlanError, SearchSpaceTooLargeError
from gpp_solver.planners.registry import REGISTRY, get_planner
from gpp_solver.types import SEARCH_FIELDS, SearchInfo, Status

CLUSTER = {
    "format": "gpp-cluster/1",
    "devices": 4,
    "memory_bytes": 1e6,
    "devices_per_node": 2,
    "intra_node_bandwidth": 1000.0,
    "inter_node_bandwidth": 100.0,
    "latency": 0.001,
}


@pytest.fixture(scope="module")
def plans() -> dict[str, gs.Plan]:
    """One plan of every installed planner on the diamond."""
    g, c = gs.graph_from_dict(copy.deepcopy(diamond_dict())), gs.cluster_from_dict(CLUSTER)
    out = {}
    for name in sorted(REGISTRY):
        try:
            out[name] = get_planner(name)(g, c, 8, time_limit=20)
        except (gs.InvalidInputError, SearchSpaceTooLargeError):
            continue
    assert {"gpp", "graphpipe", "pipedream"} <= set(out)
    return out


def test_every_planner_reports_a_status_member(plans):
    for name, p in plans.items():
        assert type(p.search.status) is Status, name
        assert p.search.status is not Status.UNKNOWN


def test_plan_json_round_trips_byte_identical(plans):
    for name, p in plans.items():
        text = json.dumps(gs.plan_to_dict(p))
        again = gs.plan_from_dict(json.loads(text))
        assert json.dumps(gs.plan_to_dict(again)) == text, name
        assert again.search.status is p.search.status


def test_status_values_are_the_json_strings():
    assert [s.value for s in Status] == [str(s) for s in Status] == [f"{s}" for s in Status]
    assert json.dumps({"s": Status.TIME_LIMIT}) == '{"s": "time-limit"}'
    assert gs.SearchInfo(0.0, "feasible").status is Status.FEASIBLE  # a string is converted
    with pytest.raises(ValueError):
        gs.SearchInfo(0.0, "optimall")


def test_unknown_status_is_rejected_by_name(plans):
    d = gs.plan_to_dict(plans["graphpipe"])
    d["search"]["status"] = "optimall"
    with pytest.raises(InvalidPlanError, match=r"search\.status .*'optimall'"):
        gs.plan_from_dict(d)
    d["search"]["status"] = ["feasible"]
    with pytest.raises(InvalidPlanError, match=r"search\.status"):
        gs.plan_from_dict(d)
    del d["search"]
    assert gs.plan_from_dict(d).search.status is Status.UNKNOWN


def test_every_action_of_every_planner_round_trips_its_text(plans):
    n = 0
    for name, p in plans.items():
        for s in p.stages:
            assert all(type(a) is Action and type(a.kind) is Kind for a in s.schedule.order), name
            for a in s.schedule.order:
                assert Action.parse(str(a)) == a and str(a) == f"{a.kind}{a.micro_batch}"
                n += 1
            assert parse_order(s.schedule.text()) == s.schedule.order
    assert n >= 2 * 8 // 4 * len(plans)


def test_action_is_a_pair_and_its_json_is_unchanged():
    a = Action.parse("F12")
    kind, j = a
    assert (kind, j) == ("F", 12) and a == ("F", 12) and hash(a) == hash(("F", 12))
    assert a.to_json() == ["F", 12] and json.dumps(a.to_json()) == '["F", 12]'
    assert repr(a) == "Action(kind='F', micro_batch=12)"
    sched = gs.Schedule("custom", 1, (("F", 0), ("B", 0)))  # pairs are converted
    assert sched.order == (Action(Kind.F, 0), Action(Kind.B, 0)) and sched.text() == "F0 B0"
    assert order_text([("F", 0), ("F", 1), ("B", 0), ("B", 1)]) == "F0 F1 B0 B1"


@pytest.mark.parametrize("bad", ["", "F", "f0", "X1", "F-1", "F01", "F 1", "B1x", 5, None])
def test_action_text_rejects_malformed(bad):
    with pytest.raises(InvalidPlanError, match="an action is F, B or W"):
        Action.parse(bad)


def test_search_common_keys_are_typed_fields(plans):
    for name, p in plans.items():
        assert not set(SEARCH_FIELDS) & set(p.search.extra), name
        assert isinstance(p.search.iteration_time_estimate, float) and p.search.iteration_time_estimate > 0, name
        d = gs.plan_to_dict(p)["search"]
        assert d["iteration_time_estimate"] == p.search.iteration_time_estimate  # JSON: a key of search
        again = gs.plan_from_dict(gs.plan_to_dict(p)).search

        def typed(s):
            return json.loads(json.dumps([s.iteration_time_estimate, s.micro_batch_size, s.cp_tighten, dict(s.extra)]))

        assert typed(again) == typed(p.search), name
    for name in ("gpp", "graphpipe", "milp"):
        if name in plans:
            assert plans[name].search.micro_batch_size == plans[name].stages[0].micro_batch_size, name
    assert plans["gpp"].search.cp_tighten["status"]


def test_a_typed_key_given_in_extra_moves_into_its_field():
    s = SearchInfo(
        1.0, Status.FEASIBLE, extra={"cp_tighten": {"status": "OPTIMAL"}, "mine": 1}, iteration_time_estimate=2.0
    )
    assert s.cp_tighten == {"status": "OPTIMAL"} and dict(s.extra) == {"mine": 1} and s.iteration_time_estimate == 2.0
    from dataclasses import replace

    t = replace(s, extra={**s.extra, "micro_batch_size": 4})
    assert (t.micro_batch_size, t.cp_tighten, t.iteration_time_estimate, dict(t.extra)) == (
        4,
        s.cp_tighten,
        2.0,
        {"mine": 1},
    )


@pytest.mark.parametrize(
    "key,value",
    [
        ("iteration_time_estimate", "fast"),
        ("iteration_time_estimate", -1.0),
        ("micro_batch_size", 0),
        ("micro_batch_size", 2.5),
        ("cp_tighten", [1]),
    ],
)
def test_typed_search_keys_are_checked_when_read(plans, key, value):
    d = gs.plan_to_dict(plans["graphpipe"])
    d["search"][key] = value
    with pytest.raises(InvalidPlanError, match=rf"search\.{key}"):
        gs.plan_from_dict(d)


def test_statuses_name_their_objective(plans, tmp_path, capsys):
    """milp's optimum is for the bottleneck TPS only: its status and the CLI say so."""
    if "milp" not in plans:
        pytest.skip("milp is not installed")
    p = plans["milp"]
    assert p.search.status is Status.OPTIMAL_TIME_PER_SAMPLE and "time per sample" in p.search.objective
    assert all(p.search.status is not Status.OPTIMAL for p in plans.values())  # the legacy name is not written
    from gpp_solver.cli import main

    g, c = tmp_path / "g.json", tmp_path / "c.json"
    g.write_text(json.dumps(diamond_dict()))
    c.write_text(json.dumps(CLUSTER))
    assert (
        main(["plan", str(g), "--cluster", str(c), "--batch", "8", "--planner", "milp", "-o", str(tmp_path / "p.json")])
        == 0
    )
    out = capsys.readouterr().out
    assert "status optimal-time-per-sample (least bottleneck time per sample" in out
    assert "the iteration time is not optimised" in out


def test_a_legacy_optimal_plan_still_loads_and_round_trips(plans):
    d = gs.plan_to_dict(plans["graphpipe"])
    d["search"]["status"] = "optimal"
    text = json.dumps(d)
    p = gs.plan_from_dict(json.loads(text))
    assert p.search.status is Status.OPTIMAL and json.dumps(gs.plan_to_dict(p)) == text


def test_action_module_example_holds():
    import doctest

    import gpp_solver.action as action

    assert doctest.testmod(action).failed == 0
