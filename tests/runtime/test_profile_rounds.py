"""``gpp_runtime.profile --rounds``: every size and node swept R times, each node's median of its rounds' medians."""

from __future__ import annotations

import json

from gpp_runtime.capture.profiler import combine_rounds
from gpp_runtime.profile import main


def test_combine_rounds_takes_the_median_of_the_medians_and_the_extremes():
    sweeps = [
        {"a": {"fw": [(1.0, 0.9, 1.2), (2.0, 1.8, 2.5)]}},
        {"a": {"fw": [(5.0, 4.0, 9.0), (2.2, 2.1, 2.4)]}},  # a slow stretch in this round at size 0
        {"a": {"fw": [(1.1, 1.0, 1.3), (1.9, 1.7, 2.0)]}},
    ]
    got = combine_rounds(sweeps)["a"]["fw"]
    assert got[0] == (1.1, 0.9, 9.0)  # the slow round's median is not the node's
    assert got[1] == (2.0, 1.7, 2.5)


def test_the_profile_records_its_rounds(tmp_path):
    out = tmp_path / "g.json"
    argv = ["--model", "examples.two_branch:workload", "--micro-batch-sizes", "1,2", "--warmup", "0"]
    assert main([*argv, "--repeats", "1", "--rounds", "2", "-o", str(out)]) == 0
    g = json.loads(out.read_text())
    info = g["extra"]["profile"]
    assert info["rounds"] == 2 and info["statistic"] == "median over rounds of each round's median"
    for nd in g["nodes"]:
        for kind in ("fw", "bw"):
            for t, (lo, hi) in zip(nd[f"{kind}_time"], nd["extra"]["time_spread"][kind]):
                assert lo <= t <= hi or t == 0.0  # the median lies within the fastest and slowest run


def test_rounds_below_one_are_refused(tmp_path, capsys):
    argv = ["--model", "examples.two_branch:workload", "--micro-batch-sizes", "1", "--rounds", "0"]
    assert main([*argv, "-o", str(tmp_path / "g.json")]) == 2
    assert "--rounds" in capsys.readouterr().err
