"""A profile's signs of interference (``gpp_runtime.calibration.quality``): rounds that disagree,
per-sample time rising with the size, in-situ factors far from the others; recorded, warned of
(measured once more with ``--again``), and shown under a plan's summary."""

from __future__ import annotations

import copy
import json
import subprocess
import sys

from gpp_runtime.calibration.quality import assess
from gpp_runtime.profile import _assessed

SIZES = [1, 2, 4, 8]


def _doc(per_sample=(1.0, 0.8, 0.7, 0.65), rounds=None, scale=None) -> dict:
    """Two nodes whose summed time per sample at each size is ``per_sample`` (ms)."""
    nodes = [
        {
            "id": v,
            "fw_time": [p * b * 1e-3 / 4 for p, b in zip(per_sample, SIZES)],
            "bw_time": [p * b * 1e-3 / 4 for p, b in zip(per_sample, SIZES)],
        }
        for v in ("a", "b")
    ]
    profile = {"round_totals": rounds or [[p * b * 1e-3] * 3 for p, b in zip(per_sample, SIZES)]}
    if scale:
        profile["in_situ"] = {"workers": [{"scale": scale}]}
    return {"micro_batch_sizes": SIZES, "nodes": nodes, "extra": {"profile": profile}}


def test_a_clean_profile_has_no_suspect_size():
    q = assess(_doc(scale={"fw": [1.3, 1.35, 1.25, 1.3], "bw": [1.1, 1.0, 1.05, 1.1]}))
    assert q == {"round_spread": 0.0, "suspect_sizes": [], "reasons": []}


def test_rounds_that_disagree_name_their_size():
    rounds = [[1e-3] * 3, [1.6e-3, 1.6e-3, 2.2e-3], [2.8e-3] * 3, [5.2e-3] * 3]
    q = assess(_doc(rounds=rounds))
    assert q["suspect_sizes"] == [2] and "rounds at 2 differ by 38%" in q["reasons"][0]
    assert q["round_spread"] > 0.3


def test_per_sample_time_rising_with_the_size():
    """3.7 ms a sample at 2, 5.5 at 4 (a profile taken beside a test run)."""
    q = assess(_doc(per_sample=(4.0, 3.7, 5.5, 3.5)))
    assert q["suspect_sizes"] == [4] and "per sample at 4 is 1.49x that at 2" in q["reasons"][0]


def test_in_situ_factors_far_from_the_others():
    q = assess(_doc(scale={"fw": [5.15, 2.6, 2.4, 0.35], "bw": [1.0, 1.0, 1.0, 1.0]}))
    assert q["suspect_sizes"] == [1, 8]
    assert all("one-stage fw step" in r for r in q["reasons"])


def test_warned_and_with_again_measured_once_more(caplog):
    bad = _doc(per_sample=(4.0, 3.7, 5.5, 3.5))
    good = _doc()
    calls = []
    doc = _assessed(lambda: calls.append(1) or copy.deepcopy(bad), again=False)
    assert calls == [1] and doc["extra"]["profile"]["quality"]["suspect_sizes"] == [4]
    assert "sizes 4 look measured under interference" in caplog.text and "--again" in caplog.text
    caplog.clear()
    runs = iter([copy.deepcopy(bad), copy.deepcopy(good)])
    doc = _assessed(lambda: next(runs), again=True)
    assert doc["extra"]["profile"]["quality"]["suspect_sizes"] == []  # the better one kept
    assert "measuring again" in caplog.text and "still" not in caplog.text
    runs = iter([copy.deepcopy(bad), copy.deepcopy(bad)])
    doc = _assessed(lambda: next(runs), again=True)
    assert doc["extra"]["profile"]["quality"]["suspect_sizes"] == [4]
    assert "sizes 4 still look measured under interference" in caplog.text


def test_profile_records_its_quality_and_the_plan_shows_it(tmp_path):
    out = tmp_path / "g.json"
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "gpp_runtime.profile",
            "--model",
            "examples.two_branch:workload",
            "--micro-batch-sizes",
            "1,2",
            "--rounds",
            "2",
            "--repeats",
            "2",
            "-o",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr[-2000:]
    q = json.loads(out.read_text())["extra"]["profile"]["quality"]
    assert set(q) == {"round_spread", "suspect_sizes", "reasons"}
    assert len(json.loads(out.read_text())["extra"]["profile"]["round_totals"]) == 2
    plan = subprocess.run(
        ["gpp", "plan", str(out), "--cluster", "v100:2", "--batch", "4", "-o", str(tmp_path / "p.json"), "--quiet"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert plan.returncode == 0, plan.stderr
    assert "profile: its rounds within" in plan.stdout
