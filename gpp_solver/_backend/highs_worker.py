"""HiGHS (``highspy``) solves in a worker process, never in the planner's own process.

The highspy wheel and OR-Tools each ship a ``libhighs.so.1`` of a different HiGHS version under the
same soname, and the dynamic loader keeps whichever came first: once one is loaded in a process,
the other package fails to import (``undefined symbol``).  PuLP imports highspy when it is itself
imported.  CP-SAT (OR-Tools) is the schedule model of every plan, so this package loads OR-Tools
before PuLP (:mod:`gpp_solver._backend.load_order`) and runs HiGHS — the exact MILP's solver and
:mod:`gpp_solver.oracles.tps_bound`'s — in a worker: ``python -m gpp_solver._backend.highs_worker``, started on
first use and kept for the next solves (it exits with its parent).  A PuLP problem goes there as
``LpProblem.toDict()`` (pickled over a pipe), is solved with ``pulp.HiGHS``, and its status,
variable values, objective and HiGHS's dual bound come back into the caller's problem.
:func:`highs_available` looks for highspy without loading it.
"""

from __future__ import annotations

if __name__ != "__main__":  # in the planner's process: OR-Tools before PuLP
    from gpp_solver._backend import load_order as _load_order  # noqa: F401

import importlib.util
import os
import pickle
import subprocess
import sys
import threading
from dataclasses import dataclass
from typing import Any, BinaryIO

import pulp

_LOCK = threading.Lock()
_WORKER: subprocess.Popen | None = None


def worker() -> subprocess.Popen | None:
    """The worker process now serving :func:`solve_highs` (``None`` before the first solve); a worker
    that dies is replaced at the next solve."""
    return _WORKER


@dataclass(frozen=True)
class HighsOutcome:
    """What HiGHS reported (the variable values are already in the caller's problem).  The figures
    are of the model as HiGHS saw it: PuLP hands it a maximisation negated, and ``dual_bound`` is a
    MIP's (for a pure LP HiGHS leaves it 0: use ``objective``)."""

    model_status: str  # HiGHS's model status name, e.g. "kOptimal", "kInfeasible", "kTimeLimit"
    model_status_text: str  # its readable form ("Optimal", "Time limit reached", ...)
    dual_bound: float  # HiGHS's mip_dual_bound
    objective: float  # objective_function_value of the best solution


def highs_available() -> bool:
    """Whether ``highspy`` is installed (found, not imported: importing it here is the problem)."""
    return importlib.util.find_spec("highspy") is not None


def solve_highs(prob: pulp.LpProblem, **options: Any) -> HighsOutcome:
    """Solve ``prob`` with ``pulp.HiGHS(**options)`` in the worker; its solution is written back
    into ``prob`` (``status``, ``sol_status``, every variable's ``varValue``).  Raises
    :class:`gpp_solver.errors.SolverError` when highspy is missing or the worker fails."""
    from gpp_solver.errors import SolverError

    if not highs_available():
        raise SolverError("HiGHS is not installed (the highspy package)")
    global _WORKER
    with _LOCK:
        for attempt in (1, 2):  # a worker that died (killed, crashed) is restarted once
            if _WORKER is None or _WORKER.poll() is not None:
                env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))  # this package too
                _WORKER = subprocess.Popen(
                    [sys.executable, "-m", "gpp_solver._backend.highs_worker"],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.DEVNULL,
                    env=env,
                )
            try:
                pickle.dump((prob.toDict(), options), _WORKER.stdin)
                _WORKER.stdin.flush()
                reply = pickle.load(_WORKER.stdout)
                break
            except (BrokenPipeError, EOFError, pickle.UnpicklingError) as exc:
                _WORKER.kill()
                _WORKER = None
                if attempt == 2:
                    raise SolverError(f"the HiGHS worker process failed: {exc!r}") from exc
    if reply[0] != "ok":
        raise SolverError(f"HiGHS failed: {reply[1]}")
    _, status, sol_status, values, outcome = reply
    prob.status, prob.sol_status = status, sol_status
    for v in prob.variables():
        v.varValue = values.get(v.name)
    return HighsOutcome(*outcome)


def _serve(inp: BinaryIO, out: BinaryIO) -> None:
    """The worker's loop: one pickled ``(problem dict, options)`` in, one reply out, until EOF."""
    while True:
        try:
            payload, options = pickle.load(inp)
        except EOFError:
            return
        try:
            _, prob = pulp.LpProblem.fromDict(payload)
            prob.solve(pulp.HiGHS(**options))
            h = prob.solverModel
            st = h.getModelStatus()
            info = h.getInfo()
            outcome = (
                str(st).rsplit(".", 1)[-1],
                h.modelStatusToString(st),
                float(info.mip_dual_bound),
                float(info.objective_function_value),
            )
            reply = ("ok", prob.status, prob.sol_status, {v.name: v.varValue for v in prob.variables()}, outcome)
        except Exception as exc:  # noqa: BLE001 - reported to the caller, which raises SolverError
            reply = ("error", f"{type(exc).__name__}: {exc}")
        pickle.dump(reply, out)
        out.flush()


if __name__ == "__main__":
    # the protocol owns the original stdout; anything HiGHS prints goes to stderr
    _out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    _serve(sys.stdin.buffer, _out)
