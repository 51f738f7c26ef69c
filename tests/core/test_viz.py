"""gpp_solver.viz: the stage graph, the Gantt chart, ``gpp show`` and a missing matplotlib."""

from __future__ import annotations

import json
import sys

import pytest

import gpp_solver as gs
from gpp_solver.cli import main
from gpp_solver.compare import CompareRow
from gpp_solver.plan.build import StageSpec

pytest.importorskip("matplotlib")
from matplotlib.colors import to_rgba  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from gpp_solver import viz  # noqa: E402

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@pytest.fixture
def setup(diamond, cluster_dict):
    """The diamond a -> {b, c} -> d with b and c as parallel stages; stage d data-parallel on 2 devices."""
    graph = gs.graph_from_dict(diamond)
    cluster = gs.cluster_from_dict({**cluster_dict, "devices": 6})
    plan = gs.build_plan(
        graph,
        cluster,
        [
            StageSpec(("a",), (0,), 2),
            StageSpec(("b",), (1,), 2),
            StageSpec(("c",), (2,), 2),
            StageSpec(("d",), (4, 5), 2),
        ],
        8,
        planner="manual",
        search=gs.SearchInfo(0.0, "feasible"),
    )
    gs.validate(plan, graph, cluster)
    return graph, cluster, plan


def test_layout_is_by_depth_with_parallel_stages_apart(setup):
    _, _, plan = setup
    pos = viz.stage_layout(plan)
    depth = {sid: x for sid, (x, _) in pos.items()}
    for a, b in plan.edges:
        assert depth[b] > depth[a], f"edge {a}->{b} does not go left to right"
    middle = [sid for sid, x in depth.items() if x == 1]
    assert len(middle) == 2 and pos[middle[0]][1] != pos[middle[1]][1]
    assert sorted(depth.values()) == [0, 1, 1, 2]


def test_stage_label_names_nodes_devices_and_micro_batch(setup, cluster_dict):
    graph, cluster, _ = setup
    plan = gs.build_plan(
        graph,
        cluster,
        [StageSpec(("a", "b", "c"), (0, 1), 2), StageSpec(("d",), (2,), 4)],
        8,
        planner="manual",
        search=gs.SearchInfo(0.0, "feasible"),
    )
    label = viz.stage_label(plan, graph, 0)
    assert label.startswith("S0 · 3 nodes") and "a …" in label and "\nc" in label
    assert "dev 0–1" in label and "b=2" in label
    assert viz.stage_label(plan, graph, 1).splitlines() == ["S1 · 1 node", "d", "dev 2 · b=4"]


def test_stage_graph_draws_one_box_per_stage_and_one_arrow_per_edge(setup):
    graph, _, plan = setup
    ax = Figure().add_subplot()
    viz.draw_stage_graph(plan, graph, ax)
    boxes = [t for t in ax.texts if t.get_text().startswith("S")]
    assert len(boxes) == len(plan.stages)
    assert len(ax.patches) + len([c for c in ax.get_children() if type(c).__name__ == "Annotation"]) >= len(plan.edges)
    assert "4 stages, depth 3" in ax.get_title()


def test_gantt_draws_every_simulated_task_and_the_allreduce_tail(setup):
    graph, cluster, plan = setup
    ax = Figure(figsize=(12, 4), dpi=100).add_subplot()
    sim = viz.draw_gantt(plan, graph, cluster, ax)
    assert sim.iteration_time == pytest.approx(plan.predicted.iteration_time)
    bars = sum(len(c.get_paths()) for c in ax.collections)
    n_tasks = len(sim.tasks)
    assert n_tasks == sum(len(s.schedule.order) for s in plan.stages)
    assert bars == n_tasks + 1  # one all-reduce tail: stage d, the only one on more than one device
    hatched = [c for c in ax.collections if c.get_hatch()]
    assert hatched, "the all-reduce tail is not hatched"
    scale, unit = viz.time_unit(sim.iteration_time)
    assert ax.get_xlim()[1] >= sim.iteration_time * scale and unit in ax.get_xlabel()  # covers the makespan
    assert [t.get_text() for t in ax.get_yticklabels()][0].startswith("S0")
    assert any(t.get_text() == "0" for t in ax.texts), "no micro-batch index inside any bar"


def test_gantt_time_max_fixes_the_axis(setup):
    graph, cluster, plan = setup
    ax = Figure().add_subplot()
    sim = viz.draw_gantt(plan, graph, cluster, ax, time_max=10 * plan.predicted.iteration_time)
    assert ax.get_xlim()[1] == pytest.approx(10 * sim.iteration_time * 1.02 * viz.time_unit(10 * sim.iteration_time)[0])


def _check_png(path):
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE
    assert len(data) > 1024


def test_gpp_show_writes_png_with_and_without_cluster(setup, tmp_path, diamond, cluster_dict, capsys):
    _, _, plan = setup
    g, c, p = tmp_path / "g.json", tmp_path / "c.json", tmp_path / "p.json"
    g.write_text(json.dumps(diamond))
    c.write_text(json.dumps({**cluster_dict, "devices": 6}))
    gs.save_plan(plan, p)
    both, graph_only = tmp_path / "both.png", tmp_path / "graph.png"
    assert main(["show", str(p), "--graph", str(g), "--cluster", str(c), "-o", str(both)]) == 0
    assert main(["show", str(p), "--graph", str(g), "-o", str(graph_only)]) == 0
    _check_png(both)
    _check_png(graph_only)
    assert "wrote" in capsys.readouterr().out

    # the picture with the Gantt chart is taller than the stage graph alone
    def h(path):
        return int.from_bytes(path.read_bytes()[20:24], "big")

    assert h(both) > h(graph_only)


def test_missing_matplotlib_gives_a_clear_error(setup, tmp_path, monkeypatch):
    graph, cluster, plan = setup
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    with pytest.raises(viz.VizUnavailableError, match=r"gpp_solver\[viz\]"):
        viz.draw_plan(plan, graph, cluster, tmp_path / "x.png")
    assert isinstance(viz.VizUnavailableError("x"), gs.GppError)
    assert not (tmp_path / "x.png").exists()


def test_metric_vs_devices_skips_missing_figures():
    rows = {
        4: [CompareRow("a", "optimal-time-per-sample", 0.1, throughput=10.0), CompareRow("b", "infeasible", 0.2)],
        8: [
            CompareRow("a", "optimal-time-per-sample", 0.3, throughput=20.0),
            CompareRow("b", "feasible", 0.4, throughput=15.0),
        ],
    }
    ax = Figure().add_subplot()
    viz.draw_metric_vs_devices(rows, "throughput", ax)
    heights = sorted(p.get_height() for p in ax.patches)
    assert heights == [10.0, 15.0, 20.0]
    ax3 = Figure().add_subplot()  # a planner with no figure at all is absent from the legend too
    viz.draw_metric_vs_devices(
        {
            4: [CompareRow("p", "error", 20.0)],
            8: [CompareRow("p", "error", 20.0), CompareRow("q", "optimal-time-per-sample", 1.0, throughput=5.0)],
        },
        "throughput",
        ax3,
    )
    assert [t.get_text() for t in ax3.get_legend().get_texts()] == ["q"]
    ax2 = Figure().add_subplot()
    viz.draw_metric_vs_devices(rows, "search_seconds", ax2, log=True, bars=False)
    assert ax2.get_yscale() == "log" and len(ax2.lines) == 2
    # the infeasible run's search time is marked with an x, and "b" keeps its colour across panels
    (marks,) = ax2.collections
    assert marks.get_offsets().tolist() == [[0.0, 0.2]]
    line_b = next(ln for ln in ax2.lines if ln.get_label() == "b")
    bars_b = [p for p in ax.patches if p.get_height() == 15.0][0]
    assert line_b.get_color() == "C1" and tuple(bars_b.get_facecolor()) == pytest.approx(to_rgba("C1"))


def test_viz_unavailable_error_is_in_the_one_exception_tree():
    from gpp_solver import errors

    assert viz.VizUnavailableError is errors.VizUnavailableError is gs.VizUnavailableError
