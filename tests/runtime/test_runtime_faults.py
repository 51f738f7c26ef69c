"""A dead or stuck rank ends the whole run with a non-zero exit and a message, never a hang."""

from __future__ import annotations

import time

import pytest
from runtime_plans import SEQ, plan, stage, torchrun, write


def _chain(tmp_path) -> str:
    doc = plan(4, [stage(0, SEQ[:4], [0], 2, 4, depth=1), stage(1, SEQ[4:], [1], 2, 4, depth=0)], [[0, 1]])
    return write(tmp_path, doc)


def test_killed_rank_fails_the_run_within_the_timeout(tmp_path):
    t0 = time.monotonic()
    res = torchrun(
        2,
        ["--plan", _chain(tmp_path), "--model", "examples.sequential:workload", "--steps", "5", "--timeout", "10"],
        env={"GPP_RUNTIME_TEST_KILL_RANK": "1"},
        timeout=60,
    )
    elapsed = time.monotonic() - t0
    assert res.returncode != 0
    assert elapsed < 10 + 25, elapsed


@pytest.mark.slow
def test_stuck_rank_times_out_with_a_message(tmp_path):
    t0 = time.monotonic()
    res = torchrun(
        2,
        ["--plan", _chain(tmp_path), "--model", "examples.sequential:workload", "--steps", "5", "--timeout", "5"],
        env={"GPP_RUNTIME_TEST_HANG_RANK": "1"},
        timeout=90,
    )
    elapsed = time.monotonic() - t0
    assert res.returncode != 0
    assert "rank 0: error:" in res.stderr and "timed out" in res.stderr, res.stderr[-2000:]
    assert elapsed < 5 + 30, elapsed
