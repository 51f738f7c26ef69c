"""Property-based: mutated graph / cluster / plan / importer inputs through every command and the
library entry points keep the contract (exit 0/1/2, no traceback, exit 0 only with finite figures
and a plan that validates).  See ``fuzz_harness.py``; ``benchmarks/fuzz_inputs.py`` runs more."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import fuzz_harness as F
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

N = int(os.environ.get("GPP_FUZZ_EXAMPLES", "12"))
SETTINGS = settings(
    max_examples=N,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

ops = st.lists(
    st.tuples(st.integers(0, 10**4), st.sampled_from(F.OPS), st.integers(0, len(F.WEIRD) - 1)), min_size=1, max_size=3
)
raw = st.sampled_from(F.RAW)


def _run(command: str, which: str, o, r) -> None:
    with tempfile.TemporaryDirectory() as d:
        out = F.run_case(command, which, o, r, Path(d))
    assert out.problem is None, (command, which, o, r, out.problem, out.stderr[-500:])


@pytest.mark.parametrize("command,which", [(c, w) for c in ("validate", "plan", "simulate") for w in F.COMMANDS[c][0]])
@SETTINGS
@given(o=ops, r=raw)
def test_commands_keep_the_contract(command, which, o, r):
    _run(command, which, o, r)


@pytest.mark.parametrize(
    "command,which",
    [
        ("show", "plan"),
        ("show", "cluster"),
        ("compare", "graph"),
        ("compare", "cluster"),
        ("plan-gpp", "cluster"),
        ("plan-gpp", "graph"),
    ],
)
@settings(SETTINGS, max_examples=max(3, N // 3))
@given(o=ops, r=raw)
def test_slower_commands_keep_the_contract(command, which, o, r):
    _run(command, which, o, r)


@pytest.mark.parametrize("command,which", [("import-piper", "piper"), ("import-pipedream", "pipedream")])
@SETTINGS
@given(o=ops, r=raw)
def test_importers_keep_the_contract(command, which, o, r):
    _run(command, which, o, r)


@pytest.mark.parametrize("which", F.KINDS)
@SETTINGS
@given(o=ops)
def test_library_raises_only_gpp_errors(which, o):
    assert F.run_library(which, o) is None


weird = st.sampled_from([v for v in F.WEIRD if not isinstance(v, (list, dict))] + [["gpp"], 8])


@SETTINGS
@given(
    values=st.tuples(
        st.one_of(st.none(), weird),
        st.one_of(st.just("pipedream"), weird),
        st.one_of(st.none(), weird),
        st.one_of(st.none(), weird),
        st.one_of(st.none(), weird),
    )
)
def test_solve_arguments_are_checked(values):
    mini_batch_size, planner = values[0], values[1]
    if isinstance(mini_batch_size, int) and not isinstance(mini_batch_size, bool) and mini_batch_size > 64:
        mini_batch_size = None  # an in-range huge mini-batch only makes planning slow
    assert F.run_arguments((mini_batch_size, planner, *values[2:])) is None


scaled = st.lists(
    st.tuples(st.integers(0, 10**4), st.just("scale"), st.integers(0, len(F.SCALES) - 1)), min_size=1, max_size=3
)


@pytest.mark.parametrize("command", ["plan", "plan-gpp", "simulate", "compare"])
@settings(SETTINGS, max_examples=max(3, N // 2))
@given(o=scaled, which=st.sampled_from(["graph", "cluster"]))
def test_scaled_numbers_reach_the_planners_and_keep_the_contract(command, which, o):
    """Numbers scaled up or down (still JSON numbers): planned, refused by name, or infeasible."""
    _run(command, which, o, "none")
