"""The repository stands alone: its documents link only to files it holds, and nothing in it reads
or cites a folder beside the checkout."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", ROOT / "data" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SOURCES = [
    p
    for pattern in ("*.py", "*.md", "*.ipynb", "*.toml")
    for p in ROOT.rglob(pattern)
    if ".git" not in p.parts and ".venv" not in p.parts and not any(part.endswith(".egg-info") for part in p.parts)
]


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_links_and_named_files_exist(doc):
    """Markdown links, and backquoted repository paths (``docs/x.md``, ``data/...``), resolve."""
    text = doc.read_text()
    targets = [
        (doc.parent / t.split("#")[0])
        for t in re.findall(r"\]\(([^)#][^)]*)\)", text)
        if not t.startswith(("http://", "https://"))
    ]
    targets += [
        ROOT / t
        for t in re.findall(r"`((?:docs|data|benchmarks|examples|tests|runtime|gpp_solver)/[\w./-]+)`", text)
        if "*" not in t
    ]
    missing = sorted({str(t) for t in targets if not t.resolve().exists()})
    assert not missing, missing


def _slug(heading: str) -> str:
    """GitHub's anchor for a markdown heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_link_anchors_are_headings(doc):
    """A link to ``page.md#anchor`` names a heading of that page."""
    bad = []
    for page, anchor in re.findall(r"\]\(([^)#:]+\.md)#([^)]+)\)", doc.read_text()):
        headings = re.findall(r"(?m)^#+ (.+)$", (doc.parent / page).read_text())
        if anchor not in {_slug(h) for h in headings}:
            bad.append(f"{page}#{anchor}")
    assert not bad, bad


def test_documents_exist():
    for name in ("formats.md", "cost-model.md", "planners.md", "runtime.md", "results.md", "fidelity.md"):
        assert (ROOT / "docs" / name).is_file(), name


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_nothing_points_outside_the_repository(path):
    text = path.read_text(errors="replace")
    if path == Path(__file__):
        return
    assert "../shared" not in text and "/work/shared" not in text and '"shared" / "data"' not in text, path


def test_published_profiles_carry_their_licences():
    for folder in ("pipedream", "piper"):
        licence = (ROOT / "data" / folder / "LICENSE.txt").read_text()
        assert "MIT License" in licence and "Microsoft Corporation" in licence
    readme = (ROOT / "data" / "README.md").read_text()
    for f in sorted((ROOT / "data").glob("*/*")):
        if f.name != "LICENSE.txt":
            assert f"`{f.parent.name}/{f.name}`" in readme, f"data/README.md does not list {f.name}"


HISTORY = re.compile(r"\b[Ii]ssue \d+|\bthis turn\b|\bsession \d+\b|\buntil this\b|\bbefore this (change|turn|work)\b")


@pytest.mark.parametrize(
    "path",
    [p for p in SOURCES if p.suffix in (".py", ".ipynb")] + [ROOT / "README.md"],
    ids=lambda p: str(p.relative_to(ROOT)),
)
def test_no_history_in_code_or_readme(path):
    """History lives in git: no issue numbers or 'until this turn' in the code, its comments or README."""
    if path == Path(__file__):
        return
    found = [m.group(0) for m in HISTORY.finditer(path.read_text(errors="replace"))]
    assert not found, f"{path.relative_to(ROOT)}: {found}"


def _resolve(dotted: str) -> object:
    """Import the longest module prefix of ``dotted`` and get the rest as attributes."""
    import importlib

    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ModuleNotFoundError:
            continue
        for name in parts[i:]:
            obj = getattr(obj, name)
        return obj
    raise ModuleNotFoundError(dotted)


NAMES = sorted(
    {n for doc in DOCS for n in re.findall(r"`((?:gpp_solver|gpp_runtime)(?:\.[A-Za-z_]\w*)+)", doc.read_text())}
)


@pytest.mark.parametrize("name", NAMES)
def test_named_python_objects_exist(name):
    """Every ``gpp_solver.x.y`` / ``gpp_runtime.x.y`` a document names can be imported."""
    if name.startswith("gpp_runtime"):
        pytest.importorskip("torch")
    assert _resolve(name) is not None


SPECS = [
    ROOT / "docs" / f"{name}.md"
    for name in ("formats", "cost-model", "time-terms", "zero-bubble", "planners", "runtime", "fidelity")
]
RUN_LOG = re.compile(r"\b20\d\d-\d\d-\d\d\b|\b\d\d:\d\d(?:-\d\d:\d\d)? UTC\b|\bUTC\b|\blease\b")


@pytest.mark.parametrize("spec", SPECS, ids=lambda p: p.name)
def test_specs_hold_no_run_logs(spec):
    """Specs state rules and worked examples; dated runs belong in docs/results.md."""
    found = [m.group(0) for m in RUN_LOG.finditer(spec.read_text())]
    assert not found, f"{spec.name}: {found} (measurements go to docs/results.md)"


def test_module_docstrings_hold_no_run_logs():
    """No module docstring of the solver or the runtime carries a dated run."""
    import ast

    bad = []
    for path in sorted([*(ROOT / "gpp_solver").rglob("*.py"), *(ROOT / "runtime").rglob("*.py")]):
        doc = ast.get_docstring(ast.parse(path.read_text())) or ""
        found = [m.group(0) for m in RUN_LOG.finditer(doc)]
        if found:
            bad.append(f"{path.relative_to(ROOT)}: {found}")
    assert not bad, bad


def test_readme_is_a_guide():
    """README stays a guide (at most 400 lines); its results summary links to the results page."""
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 400
    assert not RUN_LOG.search(text), RUN_LOG.search(text)
    assert "](docs/results.md)" in text
