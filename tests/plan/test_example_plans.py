"""The shipped example plans are complete gpp-plan/1 documents (``in_flight_samples`` included)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpp_solver.cost.model import in_flight_from_order
from gpp_solver.formats.plan_json import load_plan

PLANS = sorted((Path(__file__).resolve().parents[2] / "examples" / "plans").glob("*.json"))


@pytest.mark.parametrize("path", PLANS, ids=[p.stem for p in PLANS])
def test_example_plan_reads_with_the_solver_reader(path):
    plan = load_plan(path)
    for st in plan.stages:
        assert st.in_flight_samples == in_flight_from_order(st.schedule.order, st.micro_batch_size)


def test_there_are_example_plans():
    assert len(PLANS) >= 3
