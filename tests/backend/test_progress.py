"""Progress bars show on a terminal only, and never with progress=False (`--quiet`)."""

from __future__ import annotations

import io
import sys

import pytest

from gpp_solver._backend.progress import ProgressBar


class FakeTTY(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize(
    "tty, enabled, shown", [(True, True, True), (True, None, True), (True, False, False), (False, True, False)]
)
def test_bar_only_on_a_terminal(monkeypatch, tty, enabled, shown):
    pytest.importorskip("tqdm")
    err = FakeTTY() if tty else io.StringIO()
    monkeypatch.setattr(sys, "stderr", err)
    with ProgressBar(3, "test search", "step", enabled, delay=0.0) as bar:
        bar.set_postfix_str("b=4")
        bar.update(2)
    assert ("test search" in err.getvalue()) is shown


def test_cli_quiet_when_piped(tmp_path):
    import json
    import subprocess

    from gpp_solver.formats.graph import save_graph
    from gpp_solver.workloads import build_model

    save_graph(build_model("mmt", branches=2, layers=1), tmp_path / "g.json")
    argv = [
        sys.executable,
        "-m",
        "gpp_solver",
        "plan",
        str(tmp_path / "g.json"),
        "--cluster",
        "v100:4",
        "--batch",
        "32",
        "--planner",
        "graphpipe",
        "--tighten",
    ]
    r = subprocess.run(argv + ["--quiet"], capture_output=True, text=True)
    assert r.returncode == 0 and r.stderr == ""
    assert json.loads(r.stdout)["search"]["cp_tighten"]["status"]
    # without --quiet: the plan alone on stdout; on stderr progress lines and the summary, no bar (not a terminal)
    r = subprocess.run(argv, capture_output=True, text=True)
    assert r.returncode == 0 and json.loads(r.stdout)["planner"] == "graphpipe"
    assert "\r" not in r.stderr and "graphpipe: 4 stages" in r.stderr and "cluster: 4 devices" in r.stderr
