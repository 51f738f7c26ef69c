"""The runtime reads plan files through gpp_solver's own reader: the same refusals as `gpp validate`
(non-UTF-8, deep nesting, huge numbers, non-object `predicted`/`search`, unknown fields),
each one InvalidPlanError naming the problem, never a traceback of another kind."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("torch")

from gpp_runtime.lowering.plan_io import read_plan, world_size  # noqa: E402
from gpp_solver.errors import InvalidPlanError  # noqa: E402

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "plans" / "two_tower_3ranks.json"


def _doc() -> dict:
    return json.loads(EXAMPLE.read_text())


def _write(tmp_path, text: str | bytes) -> str:
    p = tmp_path / "plan.json"
    p.write_bytes(text if isinstance(text, bytes) else text.encode())
    return str(p)


def test_a_valid_hand_written_plan_reads():
    assert world_size(read_plan(str(EXAMPLE))) == 3


@pytest.mark.parametrize(
    "mutate, words",
    [
        (lambda d: d["stages"][0].__setitem__("gpus", 1), "unknown field 'gpus'"),
        (lambda d: d.__setitem__("predicted", 5), "predicted"),
        (lambda d: d.__setitem__("search", []), "search"),
        (lambda d: d.__setitem__("mini_batch_size", 10**400), "mini_batch_size"),
        (lambda d: d["stages"][0].__setitem__("micro_batch_size", 1.5), "micro_batch_size"),
    ],
)
def test_contract_violations_are_named(tmp_path, mutate, words):
    d = _doc()
    mutate(d)
    with pytest.raises(InvalidPlanError, match=words):
        read_plan(_write(tmp_path, json.dumps(d)))


@pytest.mark.parametrize(
    "text, words",
    [
        (b"\xff\xfe{", "not UTF-8"),
        ("[" * 5000 + "]" * 5000, "nest"),
        ('{"format": "gpp-plan/1", "mini_batch_size": 1' + "0" * 5000 + "}", "mini_batch_size|digits|number"),
    ],
)
def test_unreadable_files_are_named(tmp_path, text, words):
    with pytest.raises(InvalidPlanError, match=words):
        read_plan(_write(tmp_path, text))
