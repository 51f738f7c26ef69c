"""``gpp``'s memory ladder (``planners/gpp/ladder.py``): more memory never gives a slower plan on the
limits swept, and ``gpp`` is never slower than another planner's valid plan at the same limit.

The sweeps run from the memory of the unconstrained plan down to limits where no plan fits, on the
paper's workload generators.  The DLRM sweep at 8 V100s is the defect the ladder answers: without
it (``ladder=0``) the same sweep is not monotone."""

from __future__ import annotations

from dataclasses import replace

import pytest

from gpp_solver import solve
from gpp_solver.errors import InfeasibleError
from gpp_solver.formats.cluster import v100_cluster
from gpp_solver.plan.validate import validate
from gpp_solver.workloads import build_model

OTHERS = ("graphpipe", "pipedream-2bw", "alpa", "pipedream")
FRACTIONS = (1.0, 0.9, 0.8, 0.7, 0.6, 0.5)


def _iteration(graph, cluster, B, planner, **options):
    """The plan's predicted iteration time, or None when no plan fits."""
    try:
        p = solve(graph, cluster, mini_batch_size=B, planner=planner, **options)
    except InfeasibleError:
        return None
    validate(p, graph, cluster)
    assert p.predicted.peak_memory_bytes <= cluster.memory_bytes * (1 + 1e-9)
    return p.predicted.iteration_time


def _sweep(workload, devices, fractions, others=OTHERS, **options):
    """Per memory limit (largest first): gpp's iteration time and the other planners'."""
    graph, cluster, B = build_model(workload), v100_cluster(devices), 16 * devices
    roomy = solve(graph, cluster, mini_batch_size=B, planner="gpp", **options)
    top = roomy.predicted.peak_memory_bytes
    rows = []
    for f in fractions:
        at = replace(cluster, memory_bytes=top * f)
        rows.append(
            (
                f,
                _iteration(graph, at, B, "gpp", **options),
                {name: _iteration(graph, at, B, name) for name in others},
            )
        )
    return roomy, rows


def _slower_with_more_memory(rows):
    """Pairs (more memory, less memory) where gpp's plan with more memory is slower, or missing."""
    out = []
    for i, (f_hi, hi, _) in enumerate(rows):
        for f_lo, lo, _ in rows[i + 1 :]:
            if lo is not None and (hi is None or hi > lo * (1 + 1e-9)):
                out.append((f_hi, hi, f_lo, lo))
    return out


def _slower_than_others(rows):
    return [
        (f, gpp, name, t)
        for f, gpp, others in rows
        for name, t in others.items()
        if t is not None and (gpp is None or gpp > t * (1 + 1e-9))
    ]


def test_dlrm_on_8_v100s_more_memory_is_never_slower():
    roomy, rows = _sweep("dlrm", 8, FRACTIONS)
    ladder = roomy.search.extra["ladder"]
    assert ladder["rungs"] == 3 and ladder["steps"], ladder  # a small instance: the ladder ran
    assert any(gpp is not None for _, gpp, _ in rows) and rows[-1][1] is None  # down to no plan
    assert _slower_with_more_memory(rows) == []
    assert _slower_than_others(rows) == []


def test_without_the_ladder_dlrm_is_slower_with_more_memory():
    """The defect the ladder answers, on the same sweep (no other planner: only gpp's monotony)."""
    _, rows = _sweep("dlrm", 8, FRACTIONS, others=(), ladder=0)
    assert _slower_with_more_memory(rows)


def test_the_ladder_is_recorded_and_the_option_is_checked():
    graph, cluster = build_model("candle-uno"), v100_cluster(8)
    p = solve(graph, cluster, mini_batch_size=128, planner="gpp", ladder=1)
    ladder = p.search.extra["ladder"]
    assert ladder["rungs"] == 1 and len(ladder["steps"]) == 1 and ladder["picked"] in (0, 1)
    step = ladder["steps"][0]
    # the rung's limit is LADDER_STEP below the first run's plan, and its pick fits it
    assert step["memory_bytes"] < cluster.memory_bytes
    assert "stopped" in step or step["peak_memory_bytes"] <= step["memory_bytes"]
    off = solve(graph, cluster, mini_batch_size=128, planner="gpp", ladder=0)
    assert off.search.extra["ladder"] == {"rungs": 0, "steps": [], "picked": 0}
    assert p.predicted.iteration_time <= off.predicted.iteration_time * (1 + 1e-9)
    for bad in (-1, 1.5, True, "2"):
        with pytest.raises(Exception, match="ladder must be a non-negative integer"):
            solve(graph, cluster, mini_batch_size=128, planner="gpp", ladder=bad)


@pytest.mark.parametrize(("workload", "devices"), [("dlrm", 8), ("mmt", 8), ("candle-uno", 8)])
def test_no_plan_states_a_memory_that_suffices(workload, devices):
    """Below the tightest limit, the error names a memory per device at which gpp does find a plan,
    and it is no more than what GraphPipe's search space needs (a seed gpp runs)."""
    graph, cluster, B = build_model(workload), v100_cluster(devices), 16 * devices
    tight = replace(cluster, memory_bytes=1e9)
    with pytest.raises(InfeasibleError) as info:
        solve(graph, tight, mini_batch_size=B, planner="gpp")
    need = info.value.required_memory_bytes
    assert need is not None and need > 1e9 and f"{need:.6g} bytes per device give one" in str(info.value)
    with pytest.raises(InfeasibleError) as gp:
        solve(graph, tight, mini_batch_size=B, planner="graphpipe")
    assert need <= gp.value.required_memory_bytes * (1 + 1e-9)
    p = solve(graph, replace(cluster, memory_bytes=need), mini_batch_size=B, planner="gpp")
    assert p.predicted.peak_memory_bytes <= need * (1 + 1e-9)


@pytest.mark.slow
@pytest.mark.parametrize(("workload", "devices"), [("dlrm", 16), ("candle-uno", 8), ("candle-uno", 16)])
def test_more_memory_is_never_slower_on_small_paper_workloads(workload, devices):
    _, rows = _sweep(workload, devices, (*FRACTIONS, 0.4, 0.3))
    assert _slower_with_more_memory(rows) == []
    assert _slower_than_others(rows) == []
