"""The exact iteration-time planner (``exact``) against every other planner and a slow brute force.

The brute force below is independent of the planner's search: it builds every plan of the space
(``planners/milp/space.py``: ordered convex partitions, one ``b``, degrees dividing ``b``,
contiguous ranges) with ``build_plan`` and keeps the least simulated iteration time that fits.
"""

from __future__ import annotations

import itertools
import math
import random
import time

import pytest

from gpp_solver.cost.micro_batch import powers_of_two_dividing
from gpp_solver.cost.network import constant_bandwidth
from gpp_solver.errors import InfeasibleError, InvalidInputError, SearchSpaceTooLargeError
from gpp_solver.oracles.brute_force import random_cluster, random_graph
from gpp_solver.plan.build import StageSpec, build_plan
from gpp_solver.plan.simulate import simulate
from gpp_solver.plan.validate import validate
from gpp_solver.planners.exact.planner import STATUS_OPTIMAL, plan_exact
from gpp_solver.planners.exact.search import search_exact
from gpp_solver.planners.milp.space import contiguous_ranges, device_options, ordered_partitions
from gpp_solver.planners.registry import get_planner
from gpp_solver.types import SearchInfo

B = 8


def _instances() -> list:
    rng = random.Random(16)
    out = []
    for i, (kind, n) in enumerate(itertools.product(("chain", "diamond", "sp", "dag"), (5, 6, 7, 8))):
        if i % 4 == 3 and kind == "chain":
            continue
        g = random_graph(rng, kind, n)
        c = random_cluster(rng, 4, placement=i % 3 == 0, memory_bytes=rng.choice((64e9, 1.2e9)))
        out.append((g, c))
    return out[:15]


INSTANCES = _instances()


def brute_force_iteration_time(graph, cluster, mini_batch_size) -> float:
    best = math.inf
    N = cluster.devices
    for part in ordered_partitions(graph, min(N, len(graph.nodes)), every_order=constant_bandwidth(cluster) is None):
        for b in powers_of_two_dividing(mini_batch_size):
            for counts in itertools.product(device_options(b, N), repeat=len(part)):
                if sum(counts) > N:
                    continue
                specs = [
                    StageSpec(nodes=p, devices=r, micro_batch_size=b) for p, r in zip(part, contiguous_ranges(counts))
                ]
                plan = build_plan(
                    graph, cluster, specs, mini_batch_size, planner="bf", search=SearchInfo(0, "feasible")
                )
                if plan.predicted.peak_memory_bytes <= cluster.memory_bytes * (1 + 1e-9):
                    best = min(best, plan.predicted.iteration_time)
    return best


@pytest.mark.parametrize("idx", range(len(INSTANCES)))
def test_exact_not_slower_than_any_planner(idx):
    """On every instance (flat and two-level networks) no planner's plan simulates faster than
    ``exact``'s; ``gpp`` without CP-SAT tightening and with 1F1B orders (tightened orders and W
    actions leave the 1F1B space)."""
    graph, cluster = INSTANCES[idx]
    ex = plan_exact(graph, cluster, B)
    validate(ex, graph, cluster)
    assert ex.search.status == STATUS_OPTIMAL
    assert math.isclose(simulate(ex, graph, cluster).iteration_time, ex.predicted.iteration_time, rel_tol=1e-12)
    for name in ("gpp", "graphpipe", "pipedream", "pipedream-2bw", "alpa", "piper", "milp"):
        opts = {"tighten": False, "schedule": "1f1b"} if name == "gpp" else {}
        other = get_planner(name)(graph, cluster, B, time_limit=20, **opts)
        it = simulate(other, graph, cluster).iteration_time
        assert ex.predicted.iteration_time <= it * (1 + 1e-9), (name, ex.predicted.iteration_time, it)


@pytest.mark.parametrize("idx", [0, 5, 9, 13])
def test_exact_equals_brute_force(idx):
    graph, cluster = INSTANCES[idx]
    bf = brute_force_iteration_time(graph, cluster, B)
    try:
        ex = plan_exact(graph, cluster, B).predicted.iteration_time
    except InfeasibleError:
        ex = math.inf
    assert ex == bf or math.isclose(ex, bf, rel_tol=1e-12)


def test_upper_bound_prunes_and_proves():
    graph, cluster = INSTANCES[2]
    full = search_exact(graph, cluster, B)
    assert full.finished and full.best is not None
    # no candidate beats the optimum itself: proven with nothing returned
    again = search_exact(graph, cluster, B, upper_bound=full.iteration_time)
    assert again.finished and again.best is None and again.simulated <= full.simulated
    looser = search_exact(graph, cluster, B, upper_bound=full.iteration_time * 1.5)
    assert looser.best == full.best


def test_deadline_gives_time_limit():
    graph, cluster = INSTANCES[8]
    r = search_exact(graph, cluster, B, deadline=time.perf_counter() - 1)
    assert not r.finished and r.best is None


def test_infeasible_reports_memory_that_fits():
    graph, cluster = INSTANCES[1]
    tiny = cluster.with_(memory_bytes=1e6)
    with pytest.raises(InfeasibleError) as ei:
        plan_exact(graph, tiny, B)
    need = ei.value.required_memory_bytes
    assert need is not None and need > 1e6
    assert plan_exact(graph, cluster.with_(memory_bytes=need), B).predicted.peak_memory_bytes <= need
    with pytest.raises(InfeasibleError):
        plan_exact(graph, cluster.with_(memory_bytes=need * (1 - 1e-6)), B)


def test_refuses_large_and_bad_options():
    rng = random.Random(3)
    big = random_graph(rng, "chain", 20)
    with pytest.raises(SearchSpaceTooLargeError, match="nodes"):
        plan_exact(big, random_cluster(rng, 4), B)
    graph, cluster = INSTANCES[0]
    with pytest.raises(InvalidInputError, match="no option"):
        plan_exact(graph, cluster, B, bogus=1)
    with pytest.raises(InvalidInputError, match="time_limit"):
        plan_exact(graph, cluster, B, time_limit=0)


@pytest.mark.parametrize("idx", [3, 8, 14])
def test_gpp_uses_exact_on_small_graphs(idx):
    """gpp is never slower than the least 1F1B iteration time over all convex partitions and says
    so (with 1F1B orders, the exact search's space); without the exact search (and the memory
    ladder, which finds the optimum of instance 8 too) it can be slower (instance 8) and does not
    claim optimality; with its default schedule (W actions allowed) it is
    no slower and claims no optimum."""
    graph, cluster = INSTANCES[idx]
    ex = plan_exact(graph, cluster, B)
    zb = get_planner("gpp")(graph, cluster, B)
    validate(zb, graph, cluster)
    assert zb.predicted.iteration_time <= ex.predicted.iteration_time * (1 + 1e-9)
    assert zb.search.status != STATUS_OPTIMAL
    gp = get_planner("gpp")(graph, cluster, B, schedule="1f1b")
    validate(gp, graph, cluster)
    assert gp.predicted.iteration_time <= ex.predicted.iteration_time * (1 + 1e-9)
    assert gp.search.status == STATUS_OPTIMAL and gp.search.extra["exact"]["finished"]
    off = get_planner("gpp")(graph, cluster, B, exact=False, ladder=0, tighten=False, schedule="1f1b")
    assert off.search.status in ("feasible", "time-limit") and off.search.extra["exact"] == {"status": "off"}
    if idx == 8:
        assert off.predicted.iteration_time > ex.predicted.iteration_time * 1.005
        assert gp.search.extra["exact"]["improved"]


def test_gpp_skips_exact_above_its_limits():
    rng = random.Random(4)
    graph = random_graph(rng, "chain", 14)
    gp = get_planner("gpp")(graph, random_cluster(rng, 4), B, seed_planners=("pipedream",), tighten=False)
    assert gp.search.extra["exact"]["status"] == "skipped" and gp.search.status != STATUS_OPTIMAL


def test_exact_prices_the_gradient_sums_as_the_plan_does(chain, cluster_dict):
    """A graph with ``grad_accumulation_time_per_byte``: the search simulates the sums inside the
    backwards as ``build_plan`` does, so the plan it builds has the time it searched (the search
    once left them in the tail, and its best candidate's built plan came out slower: a SolverError)."""
    from gpp_solver import cluster_from_dict, graph_from_dict

    g = graph_from_dict({**chain, "grad_accumulation_time_per_byte": 1e-9})
    c = cluster_from_dict(cluster_dict)
    plan = plan_exact(g, c, B, micro_batch_sizes=[1, 2])
    assert plan.mini_batch_size // plan.stages[0].micro_batch_size > 1  # sums to price
    assert plan.predicted.iteration_time == pytest.approx(simulate(plan, g, c).iteration_time, rel=1e-9)
