"""The runtime's command-line entry points name themselves by their import name, `gpp_runtime.X`."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest


@pytest.mark.parametrize("name", ["train", "profile", "probe", "cores"])
def test_help_names_gpp_runtime(name, tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    r = subprocess.run(
        [sys.executable, "-m", f"gpp_runtime.{name}", "--help"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    usage = r.stdout.splitlines()[0]
    assert usage.startswith("usage: ") and f"-m gpp_runtime.{name} " in usage, usage
    # the help never names a module of the bare `runtime` directory (not an importable package)
    assert not re.search(r"(?<![\w.])runtime\.\w", r.stdout), r.stdout
