"""torch.distributed.pipelining's own ZB1P order (``benchmarks/torch_zb1p_order.py``), converted to our
orders: every action once, valid under our validator, and timed as the paper's ZB-H1 on a uniform chain.
Skipped without torch."""

from __future__ import annotations

import copy
import importlib.util
import sys
from collections import Counter
from pathlib import Path

import pytest
from conftest import CLUSTER
from tiny_graphs import chain_dict

import gpp_solver as gs
from gpp_solver.action import Action, Kind
from gpp_solver.cost.model import in_flight_from_order
from gpp_solver.plan.build import StageSpec, build_plan
from gpp_solver.plan.validate import check_order

pytest.importorskip("torch.distributed.pipelining")

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


def _bench(name: str):
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCH / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


tz = _bench("torch_zb1p_order")


@pytest.mark.parametrize(("p", "n"), [(4, 8), (2, 6), (3, 9), (4, 6), (4, 4)])
def test_every_f_b_w_once_per_micro_batch_and_c4(p, n):
    raw = tz.torch_pipeline_order(p, n)
    orders = tz.torch_zb1p_orders(p, n)
    assert sorted(orders) == list(range(p))
    for s, order in orders.items():
        want = Counter(Action(k, j) for j in range(n) for k in (Kind.F, Kind.B, Kind.W))
        assert Counter(order) == want and len(order) == 3 * n
        assert len(order) == sum(a is not None for a in raw[s])  # only the idle slots dropped
        check_order(s, order, n)  # raises InvalidPlanError on a C4 violation
    assert any(a is None for a in raw[p - 1]), "torch's order has idle slots that the conversion drops"


@pytest.mark.parametrize(("p", "n"), [(4, 8), (3, 6), (2, 6)])
def test_validates_and_takes_the_papers_zb_h1_time_on_a_uniform_chain(p, n):
    """F = B_in = W = 1 on every stage (``bw_time`` 2, half of it the weight gradient), free
    transfers.  With one stage per rank torch's ZB1P is the paper's ZB-H1 schedule, whose iteration
    time is ``n (F + B + W) + (p - 1)(F + B - W)`` (Qi et al., ZB-H1: the bubble shrinks to
    ``(p - 1)(F + B - W)``): 27 for p = 4, n = 8.  1F1B on the same chain: ``(n + p - 1)(F + B + W)``."""
    d = chain_dict(p)
    for v in d["nodes"]:
        v["output_bytes"] = 0.0
    cl = copy.deepcopy(CLUSTER) | {"devices": p, "latency": 0.0}
    g, c = gs.graph_from_dict(d), gs.cluster_from_dict(cl)
    orders = tz.torch_zb1p_orders(p, n)
    specs = [StageSpec((f"n{i}",), (i,), 1, order=orders[i]) for i in range(p)]
    plan = build_plan(g, c, specs, n, planner="manual", search=gs.SearchInfo(0.0, "feasible"))
    gs.validate(plan, g, c)
    assert [tuple(s.schedule.order) for s in plan.stages] == [orders[i] for i in range(p)]
    assert plan.predicted.iteration_time == pytest.approx(n * 3 + (p - 1) * 1)
    one_f_one_b = build_plan(
        g,
        c,
        [StageSpec((f"n{i}",), (i,), 1) for i in range(p)],
        n,
        planner="manual",
        search=gs.SearchInfo(0.0, "feasible"),
    )
    assert one_f_one_b.predicted.iteration_time == pytest.approx((n + p - 1) * 3)
    # ZB1P keeps 1F1B's peak: no stage holds more than the first stage's p micro-batches
    assert max(in_flight_from_order(o, 1) for o in orders.values()) == min(p, n)


@pytest.mark.parametrize(("p", "n"), [(4, 8), (2, 6), (3, 9), (5, 10), (4, 4)])
def test_torch_order_is_the_benchmarks_zb_h1_chain_order(p, n):
    zb = _bench("zero_bubble")
    assert tz.torch_zb1p_orders(p, n) == {i: zb.zb_h1_chain_order(p, i, n) for i in range(p)}


def test_torch_refusal_is_a_value_error():
    with pytest.raises(ValueError, match="multiple of the number of rounds"):
        tz.torch_zb1p_orders(4, 9)  # max(1, 9 // 4) = 2 rounds do not divide 9


def test_chain_cell_says_so_without_torch(monkeypatch):
    """The benchmark's column reads "(torch not installed)" when torch's schedules cannot be imported."""
    zb = _bench("zero_bubble")
    monkeypatch.syspath_prepend(str(BENCH))
    monkeypatch.delitem(sys.modules, "torch_zb1p_order", raising=False)
    monkeypatch.setitem(sys.modules, "torch.distributed.pipelining.schedules", None)
    assert zb.torch_zb1p_cell(4, 8, [0, 1, 2, 3], (), {}) == "(torch not installed)"
