"""docs/results.md's machine-independent figures hold (benchmarks/check_results.py), and README's
one results table is the results page's."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "docs" / "results.md"
README = ROOT / "README.md"


def _check_results():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import check_results
    finally:
        sys.path.pop(0)
    return check_results


def test_results_figures_hold_on_two_cells(capsys):
    """The cheap, machine-independent figures of two cells (benchmarks/check_results.py)."""
    assert _check_results().main(["--only", "mmt:4", "candle-uno:4"]) == 0, capsys.readouterr().out


def test_check_results_finds_a_changed_figure(tmp_path, capsys):
    text = RESULTS.read_text()
    row = next(line for line in text.splitlines() if line.startswith("| mmt | 4 | 64 |"))
    cells = row.split(" | ")
    cells[-2] = "0.004"  # the TPS column of the search-time table
    bad = tmp_path / "results.md"
    bad.write_text(text.replace(row, " | ".join(cells)))
    assert _check_results().main(["--only", "mmt:4", "--results", str(bad)]) == 1
    assert "DIFFERS: search_time mmt 4: TPS (s) results 0.004" in capsys.readouterr().out


@pytest.mark.slow
def test_results_figures_hold():
    """Every cheap cell (about 40 s on a loaded 2-core machine); `--full` is a benchmark."""
    assert _check_results().main([]) == 0


def _table(text: str, header_start: str) -> list[list[str]]:
    lines = text.splitlines()
    i = next(k for k, line in enumerate(lines) if line.startswith(header_start))
    rows = []
    for line in lines[i:]:
        if not line.startswith("|"):
            break
        rows.append([c.strip() for c in line.strip().strip("|").split("|")])
    return [rows[0]] + rows[2:]


def test_readme_results_table_is_the_results_page():
    """Each throughput of README's table is the 8-device cell of the results page's comparison."""
    readme = _table(README.read_text(), "| workload | gpp | graphpipe |")
    page = _table(RESULTS.read_text(), "| workload | devices | gpp tput (s) |")
    head = page[0]
    at8 = {r[0]: dict(zip(head, r)) for r in page[1:] if r[1] == "8"}
    planners = readme[0][1:]
    assert planners == ["gpp", "graphpipe", "pipedream", "pipedream-2bw", "alpa", "piper"]
    assert [r[0] for r in readme[1:]] == ["mmt", "dlrm", "candle-uno", "transformer"]
    for row in readme[1:]:
        for planner, cell in zip(planners, row[1:]):
            listed = at8[row[0]][f"{planner} tput (s)"].split(" (")[0]
            expected = "too large" if listed == "search-space-too-large" else listed
            assert cell == expected, (row[0], planner, cell, listed)


def test_readme_summary_ratios_are_the_results_page():
    """README's '1.21x PipeDream-2BW' and 'gpp 1.00x-1.20x' are the results page's figures."""
    text = RESULTS.read_text()
    m = re.search(r"graphpipe / pipedream-2bw simulated throughput on multi-branch workloads: mean (\d\.\d+)x", text)
    assert m and f"{float(m.group(1)):.2f}x PipeDream-2BW" in README.read_text()
    page = _table(text, "| workload | devices | gpp tput (s) |")
    ratios = [float(r[page[0].index("gpp / best other")].rstrip("x")) for r in page[1:]]
    assert f"`gpp` {min(ratios):.2f}x–{max(ratios):.2f}x the best other" in README.read_text()
