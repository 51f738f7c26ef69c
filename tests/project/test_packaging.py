"""Packaging: every package directory is installed, and the runtime/ directory installs as
``gpp_runtime`` (never as a top-level ``runtime``, a name many projects use), the one name it is
imported and run by (``python -m gpp_runtime.train``)."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _config() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]


def test_every_package_directory_is_listed():
    listed = set(_config()["packages"])
    found = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "gpp_solver").rglob("__init__.py")}
    assert found - listed == set(), f"not installed: {sorted(found - listed)}"
    assert "runtime" not in listed and "gpp_runtime" in listed
    assert _config()["package-dir"] == {"gpp_runtime": "runtime"}
    # runtime/ sub-packages install under gpp_runtime (the package-dir above maps the whole tree)
    runtime = {
        ".".join(("gpp_runtime",) + p.parent.relative_to(ROOT / "runtime").parts)
        for p in (ROOT / "runtime").rglob("__init__.py")
    }
    assert runtime - listed == set(), f"not installed: {sorted(runtime - listed)}"
    assert not any(n.startswith("runtime") for n in listed)


def test_runtime_modules_import_each_other_relatively():
    """The package's modules import each other relatively (an absolute ``runtime`` import fails once installed)."""
    bad = [
        f"{p.relative_to(ROOT)}:{i}"
        for p in (ROOT / "runtime").rglob("*.py")
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if line.lstrip().startswith(("from runtime", "import runtime"))
    ]
    assert not bad, bad


def test_installed_name_is_gpp_runtime(tmp_path):
    """Outside the checkout only ``gpp_runtime`` exists (the editable install maps it to runtime/)."""
    code = (
        "import importlib.util as u, pathlib; s = u.find_spec('gpp_runtime');"
        "print(s is not None and pathlib.Path(s.origin).parent.name == 'runtime');"
        "print(u.find_spec('runtime') is None)"
    )
    r = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin"},
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["True", "True"], r.stdout
