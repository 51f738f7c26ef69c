"""HiGHS runs in a worker process so that OR-Tools (CP-SAT) and highspy never share a process."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from gpp_solver._backend.highs_worker import highs_available

pytestmark = pytest.mark.skipif(not highs_available(), reason="HiGHS (highspy) is not installed")


def test_the_solution_comes_back_into_the_problem() -> None:
    import pulp

    from gpp_solver._backend.highs_worker import solve_highs

    prob = pulp.LpProblem("t", pulp.LpMinimize)
    x = prob.add_variable("x", 0, 10, cat="Integer")
    y = prob.add_variable("y", 0)
    prob += x + 2 * y
    prob += x + y >= 3.5
    out = solve_highs(prob, msg=False)
    assert out.model_status == "kOptimal" and out.dual_bound == pytest.approx(4.0)
    assert prob.status == pulp.LpStatusOptimal and prob.sol_status == pulp.LpSolutionOptimal
    assert (x.varValue, y.varValue) == (4.0, 0.0) and pulp.value(prob.objective) == pytest.approx(4.0)
    prob += x + y <= 1.0  # now infeasible
    assert solve_highs(prob, msg=False).model_status == "kInfeasible"


def test_a_killed_worker_is_restarted() -> None:
    import pulp

    from gpp_solver._backend import highs_worker

    prob = pulp.LpProblem("t", pulp.LpMaximize)
    x = prob.add_variable("x", 0, 3)
    prob += x
    highs_worker.solve_highs(prob, msg=False)
    highs_worker.worker().kill()
    highs_worker.worker().wait()
    assert highs_worker.solve_highs(prob, msg=False).model_status == "kOptimal" and x.varValue == 3.0


def test_milp_then_cp_sat_in_one_fresh_process() -> None:
    """The MILP (PuLP, HiGHS) first, then gpp with its CP-SAT tightening: both work, and the MILP
    was solved by HiGHS (in the worker) — highspy is never loaded beside OR-Tools."""
    code = textwrap.dedent("""
        import sys
        from gpp_solver.compare import compare
        from gpp_solver.workloads import build_model
        from gpp_solver.formats.cluster import v100_cluster
        rows, plans = compare(build_model("candle-uno", branches=2), v100_cluster(4), 64, ["milp", "gpp"],
                              time_limit=20)
        assert plans["milp"].search.status == "optimal-time-per-sample", plans["milp"].search
        assert "highs" in plans["milp"].search.extra["solver"].lower(), plans["milp"].search.extra
        tight = plans["gpp"].search.cp_tighten["status"]
        assert not tight.startswith("unavailable"), tight
        assert "highspy" not in sys.modules
        print("ok")
    """)
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=240)
    assert run.returncode == 0 and run.stdout.strip().endswith("ok"), run.stderr[-2000:]
