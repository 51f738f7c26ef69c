"""notebooks/solver_comparison.ipynb runs top to bottom (nbclient, kernel ``python3``, cwd notebooks/).

* ``test_notebook_with_stub_planners`` (default run): a cell put in front replaces the planner
  registry by two small stand-ins (a graph-pipeline planner that cuts the graph into depth bands
  split by branch, and a chain planner), so every section of the notebook draws something and the
  time does not depend on which real planners are installed; ``alpa`` points at a module that does
  not exist, so the "missing planners" path runs too.
* ``test_notebook_as_is``: the notebook exactly as committed, with the real planners (5 s per planner run).

The notebook in git has no outputs; executing it here never writes it back.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")
pytest.importorskip("matplotlib")

NOTEBOOK = Path(__file__).resolve().parents[1] / "notebooks" / "solver_comparison.ipynb"

STUBS = r'''
import sys, time, types
import networkx as nx

_src = """
import time
import networkx as nx
from gpp_solver.plan.build import StageSpec, build_plan
from gpp_solver.types import SearchInfo
from gpp_solver.plan.validate import validate


def _micro_batch(B):
    return next(b for b in (4, 2, 1) if B % b == 0)


def stub_chain(graph, cluster, B, *, time_limit=None, progress=False, **options):
    t0 = time.perf_counter()
    order = list(graph.topo_order)
    k = min(cluster.devices, len(order))
    specs = [StageSpec(tuple(order[i * len(order) // k:(i + 1) * len(order) // k]), (i,), _micro_batch(B))
             for i in range(k)]
    plan = build_plan(graph, cluster, specs, B, planner="pipedream",
                      search=SearchInfo(time.perf_counter() - t0, "feasible"))
    validate(plan, graph, cluster)
    return plan


def stub_graph(graph, cluster, B, *, time_limit=None, progress=False, **options):
    t0 = time.perf_counter()
    g = graph.to_networkx()
    level = {}
    for v in nx.topological_sort(g):
        level[v] = max((level[u] + 1 for u in g.predecessors(v)), default=0)
    n_levels = max(level.values()) + 1
    for bands in range(min(n_levels, cluster.devices), 0, -1):
        parts = []
        for band in range(bands):
            members = [v for v in g if level[v] * bands // n_levels == band]
            parts += [tuple(c) for c in nx.weakly_connected_components(g.subgraph(members))]
        if len(parts) <= cluster.devices:
            break
    specs = [StageSpec(p, (i,), _micro_batch(B)) for i, p in enumerate(parts)]
    plan = build_plan(graph, cluster, specs, B, planner="graphpipe",
                      search=SearchInfo(time.perf_counter() - t0, "feasible"))
    validate(plan, graph, cluster)
    return plan
"""
_mod = types.ModuleType("gpp_notebook_stubs")
exec(_src, _mod.__dict__)
sys.modules["gpp_notebook_stubs"] = _mod

import gpp_solver.planners.registry as _planners
_planners.REGISTRY.clear()
_planners.REGISTRY.update({"graphpipe": "gpp_notebook_stubs:stub_graph",
                           "pipedream": "gpp_notebook_stubs:stub_chain",
                           "milp": "gpp_notebook_stubs:stub_graph",
                           "alpa": "gpp_solver._no_such_module:plan_alpa"})
'''


def _execute(nb, cwd: Path) -> None:
    client = nbclient.NotebookClient(nb, kernel_name="python3", timeout=300, allow_errors=False,
                                     resources={"metadata": {"path": str(cwd)}})
    client.execute()


def _outputs(nb) -> tuple[str, int]:
    """All text/markdown output of the notebook joined, and the number of PNG images it made."""
    texts, images = [], 0
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            data = out.get("data", {})
            images += "image/png" in data
            texts.append(data.get("text/markdown", "") + data.get("text/plain", "") + out.get("text", ""))
    return "\n".join(texts), images


def test_notebook_is_stored_without_outputs():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    nbformat.validate(nb)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code, "the notebook has no code cells"
    for c in code:
        assert c.outputs == [] and c.execution_count is None, "strip the outputs before committing"


def test_notebook_with_stub_planners():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    nb.cells.insert(0, nbformat.v4.new_code_cell(STUBS))
    t0 = time.perf_counter()
    _execute(nb, NOTEBOOK.parent)
    elapsed = time.perf_counter() - t0
    text, images = _outputs(nb)
    # the missing planner is named, the stubs ran in the table, every figure section drew
    assert "Missing planners (not run):** `alpa`" in text
    assert "| graphpipe |" in text and "| pipedream |" in text
    assert images >= 3, f"expected the sweep, stage-graph and Gantt figures, got {images} images"
    assert "| MMT (2 branches x 1 layer) | 2 | graphpipe (feasible) |" in text   # the gap table
    assert "Notebook executed in" in text
    print(f"notebook with stub planners executed in {elapsed:.1f} s")


def test_notebook_as_is(monkeypatch):
    """The committed notebook with the installed planners, top to bottom (5 s per planner run, so CI
    stays fast; run it by hand with the default 20 s for the full comparison)."""
    monkeypatch.setenv("GPP_NOTEBOOK_TIME_LIMIT", "5")
    nb = nbformat.read(NOTEBOOK, as_version=4)
    t0 = time.perf_counter()
    _execute(nb, NOTEBOOK.parent)
    text, _ = _outputs(nb)
    assert "Installed planners:" in text and "Notebook executed in" in text
    print(f"notebook executed in {time.perf_counter() - t0:.1f} s")
