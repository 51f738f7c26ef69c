"""Plans with W actions (split backward) under torchrun (gloo, CPU): B j sends the input gradient,
W j accumulates the weight gradients later; every run is checked against one process (--verify)."""

from __future__ import annotations

import json

from runtime_plans import SEQ, TWO_BRANCH, one_f_one_b, plan, stage, torchrun, write

SEQ_MODEL = "examples.sequential:workload"


def _ok(res) -> None:
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "verify: OK" in res.stdout + res.stderr


def deferred_w(order: list[list], lag: int) -> list[list]:
    """``order`` with W j-lag after every B j and the rest at the end."""
    out, nw, nb = [], 0, 0
    for kind, j in order:
        out.append([kind, j])
        if kind == "B":
            nb += 1
            if nb > lag:
                out.append(["W", nw])
                nw += 1
    return out + [["W", j] for j in range(nw, nb)]


def test_chain_with_w_actions_equals_one_process(tmp_path):
    o0, o1 = deferred_w(one_f_one_b(1, 4), 2), deferred_w(one_f_one_b(0, 4), 0)
    assert sum(k == "W" for k, _ in o0) == 4 and o0[-2:] == [["W", 2], ["W", 3]]
    doc = plan(
        8, [stage(0, SEQ[:4], [0], 2, 8, depth=1, order=o0), stage(1, SEQ[4:], [1], 2, 8, depth=0, order=o1)], [[0, 1]]
    )
    assert [len(st["schedule"]["order"]) for st in doc["stages"]] == [12, 12]  # 4 micro-batches x F, B, W
    trace = tmp_path / "trace.json"
    res = torchrun(
        2,
        [
            "--plan",
            write(tmp_path, doc),
            "--model",
            SEQ_MODEL,
            "--steps",
            "3",
            "--verify",
            "--momentum",
            "0.9",
            "--trace",
            str(trace),
        ],
    )
    _ok(res)
    names = [e["name"] for e in json.loads(trace.read_text())["traceEvents"] if e.get("cat") == "compute"]
    assert sum(n.startswith("W") for n in names) == 3 * 8  # 3 steps x 2 stages x 4 micro-batches


def test_graph_with_w_actions_and_data_parallel_equals_one_process(tmp_path):
    """Two branches into a data-parallel merge stage (4 ranks): the all-reduce follows the last W."""
    doc = plan(
        8,
        [
            stage(0, TWO_BRANCH[0], [0], 2, 8, depth=1, order=deferred_w(one_f_one_b(1, 4), 1)),
            stage(1, TWO_BRANCH[1], [1], 2, 8, depth=1),  # no W: the whole backward at B
            stage(2, TWO_BRANCH["merge"], [2, 3], 4, 8, depth=0, order=deferred_w(one_f_one_b(0, 2), 1)),
        ],
        [[0, 2], [1, 2]],
    )
    assert [len(st["devices"]) for st in doc["stages"]] == [1, 1, 2]
    assert [any(k == "W" for k, _ in st["schedule"]["order"]) for st in doc["stages"]] == [True, False, True]
    _ok(
        torchrun(
            4, ["--plan", write(tmp_path, doc), "--model", "examples.two_branch:workload", "--steps", "2", "--verify"]
        )
    )


def test_w_before_its_b_is_refused(tmp_path):
    order = one_f_one_b(0, 4)
    order.insert(1, ["W", 0])
    doc = plan(8, [stage(0, SEQ, [0], 2, 8, depth=0, order=order + [["W", j] for j in range(1, 4)])], [])
    res = torchrun(1, ["--plan", write(tmp_path, doc), "--model", SEQ_MODEL, "--steps", "1"])
    assert res.returncode != 0 and "W0 before B0" in res.stdout + res.stderr
