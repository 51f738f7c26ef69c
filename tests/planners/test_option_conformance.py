"""Every option that restricts the space holds in the plan returned, for every registered planner,
or the planner refuses it with :class:`InvalidInputError`.

Each restriction is chosen to bind: the allowed micro-batch sizes leave out those the planner picks
unrestricted, the cluster has fewer devices than the unrestricted plan uses, the memory limit is
below its peak.  What each plan must satisfy is checked from the plan itself (its stages' sizes,
devices, schedules) and the cost model's memory of each stage, not from the planner's own record.
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from tiny_graphs import chain_dict, diamond_dict, node

import gpp_solver as gs
from gpp_solver.cost.memory import stage_memory
from gpp_solver.errors import (
    InfeasibleError,
    InvalidInputError,
    SearchSpaceTooLargeError,
)
from gpp_solver.planners.graphpipe.staging import K_OPTIONS
from gpp_solver.planners.registry import REGISTRY, get_planner
from gpp_solver.types import Cluster, Graph, Plan

REPO = Path(__file__).resolve().parents[2]
B = 8
SIZES = (1, 2, 4, 8)
#: planners without a ``micro_batch_sizes`` option (they refuse it by name)
NO_SIZES_OPTION = {"piper"}
TIME_LIMIT = 20


def two_branch() -> dict:
    nodes = [node("in", 0.2), node("a1", 2.0), node("a2", 1.5), node("b1", 1.0), node("b2", 1.0), node("out", 0.5)]
    edges = [("in", "a1"), ("a1", "a2"), ("in", "b1"), ("b1", "b2"), ("a2", "out"), ("b2", "out")]
    return {
        "format": "gpp-graph/1",
        "name": "two-branch",
        "micro_batch_sizes": [1, 2],
        "nodes": nodes,
        "edges": [{"src": u, "dst": v} for u, v in edges],
    }


GRAPHS = {"chain": chain_dict(4, [1.0, 2.0, 1.0, 3.0]), "diamond": diamond_dict(), "two-branch": two_branch()}
CLUSTER = {
    "format": "gpp-cluster/1",
    "devices": 4,
    "memory_bytes": 1e6,
    "devices_per_node": 2,
    "intra_node_bandwidth": 1000.0,
    "inter_node_bandwidth": 100.0,
    "latency": 0.001,
}


def graph(gname: str) -> Graph:
    return gs.graph_from_dict(copy.deepcopy(GRAPHS[gname]))


def cluster(**changes: Any) -> Cluster:
    return gs.cluster_from_dict({**CLUSTER, **changes})


def run(name: str, g: Graph, c: Cluster, **options: Any) -> Plan | None:
    """The planner's plan (validated), or ``None`` when nothing fits (an honest InfeasibleError)."""
    try:
        fn = get_planner(name)
    except InvalidInputError:
        pytest.skip(f"planner {name!r} is not installed")
    try:
        p = fn(g, c, B, time_limit=TIME_LIMIT, **options)
    except InfeasibleError as exc:
        assert exc.required_memory_bytes is None or exc.required_memory_bytes > c.memory_bytes
        return None
    except SearchSpaceTooLargeError:
        pytest.skip("instance above this planner's limit")
    gs.validate(p, g, c)
    return p


def assert_fits(p: Plan, g: Graph, c: Cluster) -> None:
    """Devices and memory of ``p`` on ``c``, from the plan's stages and the cost model."""
    used = [d for s in p.stages for d in s.devices]
    assert len(used) == len(set(used)) and all(0 <= d < c.devices for d in used)
    for s in p.stages:
        assert stage_memory(g, c, s, s.in_flight_samples) <= c.memory_bytes * (1 + 1e-9)


def sizes_of(p: Plan) -> set[int]:
    return {s.micro_batch_size for s in p.stages}


@pytest.mark.parametrize("name", sorted(REGISTRY))
@pytest.mark.parametrize("gname", sorted(GRAPHS))
def test_micro_batch_sizes_hold(name, gname):
    """Sizes the unrestricted plan does not use, alone and together with a tight cluster (two
    devices, memory below the unrestricted plan's peak)."""
    g = graph(gname)
    if name in NO_SIZES_OPTION:
        with pytest.raises(InvalidInputError, match="no option 'micro_batch_sizes'"):
            get_planner(name)(g, cluster(), B, micro_batch_sizes=[2])
        return
    p0 = run(name, g, cluster())
    assert p0 is not None
    others = tuple(b for b in SIZES if b not in sizes_of(p0))
    tight = cluster(devices=2, memory_bytes=0.9 * max(s.predicted.memory_bytes for s in p0.stages))
    planned = 0
    for allowed in [others, *((b,) for b in others)]:
        for c in (cluster(), tight):
            p = run(name, g, c, micro_batch_sizes=allowed)
            if p is None:
                continue
            planned += 1
            assert sizes_of(p) <= set(allowed), (allowed, sizes_of(p))
            assert_fits(p, g, c)
    assert planned >= 2, "nearly every restricted run found no plan: too little was checked"


@pytest.mark.parametrize("name", sorted(REGISTRY))
@pytest.mark.parametrize("gname", sorted(GRAPHS))
def test_devices_and_memory_hold(name, gname):
    """Fewer devices than the unrestricted plan uses; memory below its peak."""
    g = graph(gname)
    p0 = run(name, g, cluster())
    assert p0 is not None
    peak = max(s.predicted.memory_bytes for s in p0.stages)
    planned = 0
    for c in (
        cluster(devices=1),
        cluster(devices=max(1, p0.devices_used - 1)),
        cluster(devices=3),
        cluster(memory_bytes=0.8 * peak),
        cluster(devices=2, memory_bytes=0.6 * peak),
    ):
        p = run(name, g, c)
        if p is not None:
            planned += 1
            assert p.devices_used <= c.devices
            assert_fits(p, g, c)
    assert planned >= 2, "nearly every restricted run found no plan: too little was checked"


def uniform(p: Plan) -> bool:
    return len(sizes_of(p)) == 1


def join_graph() -> Graph:
    """a1 -> a2 and b1 -> b2 joined by a free ``j``, no weights: at b = 1 on four devices the join
    rides with one branch's tail (GraphPipe's shared sink) for TPS 3."""
    nodes = [{**node(v, 0.0 if v == "j" else 1.0), "weight_bytes": 0} for v in ("a1", "a2", "b1", "b2", "j")]
    edges = [("a1", "a2"), ("b1", "b2"), ("a2", "j"), ("b2", "j")]
    return gs.graph_from_dict(
        {
            "format": "gpp-graph/1",
            "name": "join",
            "micro_batch_sizes": [1, 2],
            "nodes": nodes,
            "edges": [{"src": u, "dst": v} for u, v in edges],
        }
    )


def no_shared_sink(p: Plan) -> bool:
    """join: the stage holding ``j`` holds none or all of the branches."""
    block = {"a1", "a2", "b1", "b2"}
    held = block & set(next(s.nodes for s in p.stages if "j" in s.nodes))
    return not held or held == block


def one_b(b: int):
    return lambda p: sizes_of(p) == {b}


ALL_SEEDS = ("graphpipe", "pipedream", "pipedream-2bw", "alpa", "piper", "milp", "exact")
#: (planner, options beside the one tested, the restricting option, graph, what every plan under both
#: must satisfy, whether the plan under the first options alone violates it on one of the clusters:
#: the option binds there; None: not asserted)
SPECIFIC = [
    ("graphpipe", {"per_stage_micro_batch": True}, {"micro_batch_sizes": (2,)}, "two-branch", one_b(2), True),
    (
        "graphpipe",
        {"per_stage_micro_batch": True, "search_k": True},
        {"micro_batch_sizes": (1, 4)},
        "diamond",
        lambda p: sizes_of(p) <= {1, 4} and all(s.schedule.k in K_OPTIONS for s in p.stages),
        True,
    ),
    ("graphpipe", {}, {"per_stage_micro_batch": False}, "two-branch", uniform, False),
    ("graphpipe", {}, {"search_k": False}, "diamond", lambda p: all(s.schedule.k == 1 for s in p.stages), False),
    ("graphpipe", {}, {"degree_options": (1,)}, "chain", lambda p: all(s.data_parallel == 1 for s in p.stages), True),
    ("graphpipe", {}, {"degree_options": (2,)}, "diamond", lambda p: all(s.data_parallel == 2 for s in p.stages), True),
    ("graphpipe", {"micro_batch_sizes": (1,)}, {"shared_sinks": False}, "join", no_shared_sink, True),
    ("milp", {}, {"max_stages": 1}, "two-branch", lambda p: len(p.stages) == 1, True),
    ("milp", {}, {"max_stages": 2}, "diamond", lambda p: len(p.stages) <= 2, True),
    ("exact", {}, {"max_stages": 1}, "two-branch", lambda p: len(p.stages) == 1, True),
    ("exact", {}, {"max_stages": 2}, "diamond", lambda p: len(p.stages) <= 2, None),
    (
        "piper",
        {},
        {"micro_batch_size": 1},
        "diamond",
        lambda p: all(s.micro_batch_size == s.data_parallel for s in p.stages),
        True,
    ),
    (
        "piper",
        {},
        {"micro_batch_size": 4},
        "chain",
        lambda p: all(s.micro_batch_size == 4 * s.data_parallel for s in p.stages),
        True,
    ),
    ("pipedream", {"linearization": "topological"}, {"micro_batch_sizes": (2,)}, "two-branch", one_b(2), True),
    ("pipedream", {"mode": "pipedream-costs"}, {"micro_batch_sizes": (1,)}, "diamond", one_b(1), True),
    (
        "pipedream-2bw",
        {"balance": "layers"},
        {"micro_batch_sizes": (4,)},
        "two-branch",
        lambda p: sizes_of(p) == {4} and len({len(s.devices) for s in p.stages}) == 1,
        True,
    ),
    ("alpa", {}, {"micro_batch_sizes": (1, 2)}, "two-branch", lambda p: sizes_of(p) <= {1, 2}, True),
    ("gpp", {"objective": "time_per_sample"}, {"micro_batch_sizes": (1,)}, "two-branch", one_b(1), True),
    ("gpp", {"prove": True}, {"micro_batch_sizes": (1,)}, "diamond", one_b(1), True),
    ("gpp", {"exact": True}, {"micro_batch_sizes": (4, 8)}, "two-branch", lambda p: sizes_of(p) <= {4, 8}, True),
    ("gpp", {"seed_planners": ALL_SEEDS}, {"micro_batch_sizes": (1,)}, "chain", one_b(1), True),
]
#: per graph, memory that forces a pipeline on two devices yet holds a plan
TIGHT = {"chain": 1430.0, "diamond": 1430.0, "two-branch": 2150.0, "join": 1e6}


@pytest.mark.parametrize(
    "name,base,option,gname,holds,binds",
    SPECIFIC,
    ids=[f"{n}-{'-'.join([*b, *o])}-{gn}" for n, b, o, gn, _, _ in SPECIFIC],
)
def test_planner_options_hold(name, base, option, gname, holds, binds):
    g = join_graph() if gname == "join" else graph(gname)
    violated, planned = False, 0
    for c in (cluster(), cluster(devices=2, memory_bytes=TIGHT[gname])):
        p = run(name, g, c, **base, **option)
        if p is not None:
            planned += 1
            assert holds(p), gs.plan_to_dict(p)["stages"]
            assert_fits(p, g, c)
        if binds is not None:
            p0 = run(name, g, c, **base)
            violated |= p0 is not None and not holds(p0)
    assert planned, "no plan under the option on either cluster: nothing was checked"
    assert binds is None or violated == binds


def test_gpp_drops_a_given_seed_plan_outside_the_sizes():
    """A seed plan handed in (``seed_plans``) at a size outside ``micro_batch_sizes`` is no candidate."""
    g = graph("chain")
    seed = run("graphpipe", g, cluster(), micro_batch_sizes=(8,))
    assert seed is not None and sizes_of(seed) == {8}
    p = run("gpp", g, cluster(), micro_batch_sizes=(1, 2), seed_plans={"graphpipe": seed})
    assert p is not None and sizes_of(p) <= {1, 2}
    assert p.search.extra["seeds"]["graphpipe"]["status"].startswith("dropped")


def test_cli_micro_batch_sizes_hold(tmp_path):
    """Through ``gpp plan``: the plan written uses only the sizes given; a planner without the
    option exits 2 naming it."""
    (tmp_path / "g.json").write_text(json.dumps(GRAPHS["two-branch"]))
    (tmp_path / "c.json").write_text(json.dumps(CLUSTER))
    base = [
        sys.executable,
        "-m",
        "gpp_solver",
        "plan",
        str(tmp_path / "g.json"),
        "--cluster",
        str(tmp_path / "c.json"),
        "--batch",
        str(B),
        "--quiet",
        "--time-limit",
        "20",
    ]
    for planner in ("gpp", "graphpipe"):
        out = tmp_path / f"{planner}.json"
        res = subprocess.run(
            base + ["--planner", planner, "--micro-batch-sizes", "2", "-o", str(out)],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
            cwd=REPO,
        )
        assert res.returncode == 0, res.stderr
        assert {s["micro_batch_size"] for s in json.loads(out.read_text())["stages"]} == {2}
    res = subprocess.run(
        base + ["--planner", "piper", "--micro-batch-sizes", "2"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=REPO,
    )
    assert res.returncode == 2 and "micro_batch_sizes" in res.stderr and "Traceback" not in res.stderr


@pytest.mark.parametrize("name", ["graphpipe", "pipedream", "alpa"])
def test_tightened_orders_keep_the_options(name):
    """``solve(tighten=True)`` rewrites the orders (CP-SAT): sizes, devices and memory still hold."""
    g = graph("two-branch")
    c = cluster(devices=2, memory_bytes=TIGHT["two-branch"])
    p = gs.solve(g, c, mini_batch_size=B, planner=name, tighten=True, micro_batch_sizes=(2,), time_limit=TIME_LIMIT)
    assert sizes_of(p) == {2}
    assert_fits(p, g, c)
    assert p.search.cp_tighten is not None
