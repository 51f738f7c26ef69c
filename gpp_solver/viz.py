"""Pictures of a plan: the stage graph and the simulated schedule (Gantt chart), with matplotlib.

* :func:`draw_stage_graph` — the stage DAG laid out by topological depth (left to right; the layout is
  :mod:`gpp_solver.plan.stage_layout`), one box per stage: stage id, its nodes (count, first and last
  id), its devices and micro-batch size;
* :func:`draw_gantt` — the schedule the simulator runs (``simulate.simulate``): one row per stage,
  forwards and backwards as bars coloured by kind, the micro-batch index written inside a bar when
  it is wide enough, each stage's all-reduce tail hatched (GraphPipe Fig. 8 style);
* :func:`draw_plan` — both in one PNG, PDF or SVG (the Gantt only when a cluster is given); ``gpp show``
  calls it;
* :func:`draw_metric_vs_devices` — one comparison metric per planner against the device count
  (grouped bars, GraphPipe Fig. 6 style, or lines on a log scale for search times).

matplotlib is imported lazily, and only its object-oriented API is used (``Figure`` with the Agg
canvas), so importing this module never needs matplotlib and drawing never touches pyplot's state.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpp_solver.cost.model import stage_costs
from gpp_solver.errors import InvalidInputError, VizUnavailableError
from gpp_solver.formats.units import plural
from gpp_solver.plan.simulate import SimResult, simulate
from gpp_solver.plan.stage_layout import stage_label, stage_layout

if TYPE_CHECKING:  # pragma: no cover
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    from gpp_solver.compare import CompareRow
    from gpp_solver.types import Cluster, Graph, Plan

logger = logging.getLogger(__name__)

F_COLOR = "#4C72B0"  # forward passes
B_COLOR = "#DD8452"  # backward passes (the input gradient alone in an order with W actions)
W_COLOR = "#55A868"  # weight gradients (W actions, split backward)
A_COLOR = "#8C8C8C"  # all-reduce tail (hatched)


def _matplotlib() -> Any:
    try:
        import matplotlib
        from matplotlib.figure import Figure  # noqa: F401  (checks the submodules load)
    except ImportError as exc:
        raise VizUnavailableError(
            f"drawing needs matplotlib, which is not importable ({exc}); "
            "install gpp_solver[viz]: pip install 'gpp_solver[viz]'"
        ) from None
    return matplotlib


def _stage_colors(n: int) -> list[Any]:
    mpl = _matplotlib()
    cmap = mpl.colormaps["tab20" if n > 10 else "tab10"]
    return [cmap(i % cmap.N) for i in range(n)]


def draw_stage_graph(
    plan: Plan, graph: Graph | None, ax: Axes, *, title: str | None = None, fontsize: float | None = None
) -> dict[int, tuple[float, float]]:
    """Draw the stage DAG of ``plan`` on ``ax``; return the stage positions used.

    Each stage is a box in its own colour (the colour :func:`draw_gantt` uses for its row label)
    labelled by :func:`stage_label`; arrows are the plan's stage edges.
    """
    _matplotlib()
    pos = stage_layout(plan)
    colors = _stage_colors(len(plan.stages))
    color_of = {s.id: colors[k] for k, s in enumerate(plan.stages)}
    ncols = int(max(x for x, _ in pos.values())) + 1
    nrows = max(sum(1 for p in pos.values() if p[0] == x) for x in range(ncols))
    fs = fontsize or max(5.0, min(8.0, 9.0 - 0.25 * max(nrows, ncols)))
    boxes = {}
    for s in plan.stages:
        x, y = pos[s.id]
        r, g, b, _ = color_of[s.id]
        light = (0.55 + 0.45 * r, 0.55 + 0.45 * g, 0.55 + 0.45 * b)
        boxes[s.id] = ax.text(
            x,
            y,
            stage_label(plan, graph, s.id),
            ha="center",
            va="center",
            fontsize=fs,
            zorder=3,
            bbox=dict(boxstyle="round,pad=0.4", fc=light, ec=color_of[s.id], lw=1.5),
        )
    for a, b in plan.edges:
        # an edge over a column bends outwards (away from the middle row) to miss the boxes between
        skip = pos[b][0] - pos[a][0] > 1
        rad = (0.25 if pos[a][1] + pos[b][1] < 0 else -0.25) if skip else 0.0
        ax.annotate(
            "",
            xy=pos[b],
            xytext=pos[a],
            zorder=2,
            arrowprops=dict(
                arrowstyle="-|>",
                color="0.3",
                lw=1.0,
                shrinkA=0,
                shrinkB=0,
                patchA=boxes[a].get_bbox_patch(),
                patchB=boxes[b].get_bbox_patch(),
                connectionstyle=f"arc3,rad={rad}",
            ),
        )
    ax.set_xlim(-0.6, ncols - 0.4)
    ax.set_ylim(-nrows / 2.0 - 0.1, nrows / 2.0 + 0.1)
    ax.set_axis_off()
    if title is None:
        title = (
            f"{plan.planner}: {plural(len(plan.stages), 'stage')}, "
            f"depth {plan.depth}, {plural(plan.devices_used, 'device')}, B={plan.mini_batch_size}"
        )
    ax.set_title(title, fontsize=fs + 2)
    return pos


def time_unit(t: float) -> tuple[float, str]:
    """``(scale, unit)`` the Gantt chart's time axis uses for a span of ``t`` seconds (s, ms or µs)."""
    if t >= 10:
        return 1.0, "s"
    if t >= 10e-3:
        return 1e3, "ms"
    return 1e6, "µs"


def _task_bars(
    ax: Axes, plan: Plan, by_stage: Mapping[int, list[Any]], allreduce: Mapping[int, float], scale: float
) -> None:
    """Each stage's row (stage 0 on top): its forward, backward and weight-gradient bars, then its
    all-reduce tail, hatched, after its last action."""
    h = 0.8
    for row, sid in enumerate(s.id for s in plan.stages):
        y = row - h / 2
        tasks = sorted(by_stage[sid], key=lambda t: t.start)
        for kind, color in (("F", F_COLOR), ("B", B_COLOR), ("W", W_COLOR)):
            bars = [(t.start * scale, (t.end - t.start) * scale) for t in tasks if t.kind == kind]
            if bars:
                ax.broken_barh(bars, (y, h), facecolors=color, edgecolors="white", linewidth=0.4)
        a = allreduce.get(sid, 0.0)
        if a > 0:
            start = max((t.end for t in tasks), default=0.0)
            ax.broken_barh(
                [(start * scale, a * scale)],
                (y, h),
                facecolors="white",
                edgecolors=A_COLOR,
                hatch="////",
                linewidth=0.6,
            )


def _micro_batch_labels(
    ax: Axes, plan: Plan, by_stage: Mapping[int, list[Any]], scale: float, span: float, fontsize: float
) -> None:
    """The micro-batch index inside each bar wide enough for it (measured in pixels on the final
    axes size)."""
    fig = ax.figure
    ax_w_px = 0.85 * ax.get_position().width * fig.get_figwidth() * fig.dpi  # labels and legend take some
    px_per_unit = ax_w_px / (span * scale * 1.02) if span > 0 else 0.0
    char_px = fontsize * fig.dpi / 72.0 * 0.62
    for row, sid in enumerate(s.id for s in plan.stages):
        for t in by_stage[sid]:
            label = str(t.micro_batch)
            if (t.end - t.start) * scale * px_per_unit >= char_px * len(label) + 2:
                ax.text(
                    (t.start + t.end) / 2 * scale,
                    row,
                    label,
                    ha="center",
                    va="center",
                    fontsize=fontsize,
                    color="white",
                    clip_on=True,
                )


def _stage_rows_and_legend(ax: Axes, plan: Plan, sim: SimResult, unit: str, fontsize: float) -> None:
    """The rows' labels (each in its stage's colour), the time axis's label and the legend of the
    bar kinds (weight gradients only when the orders have ``W`` actions)."""
    mpl = _matplotlib()
    from matplotlib.patches import Patch

    st_colors = _stage_colors(len(plan.stages))
    ax.set_yticks(range(len(plan.stages)))
    ax.set_yticklabels(
        [f"S{s.id} ({len(s.devices)} dev, b={s.micro_batch_size})" for s in plan.stages], fontsize=fontsize + 1
    )
    for lab, c in zip(ax.get_yticklabels(), st_colors):
        lab.set_color(mpl.colors.to_hex(tuple(0.8 * v for v in c[:3])))
    ax.set_xlabel(f"time ({unit})")
    has_w = any(t.kind == "W" for t in sim.tasks)
    ax.legend(
        handles=[
            Patch(fc=F_COLOR, label="forward"),
            Patch(fc=B_COLOR, label="backward (input grad)" if has_w else "backward"),
        ]
        + ([Patch(fc=W_COLOR, label="weight grad")] if has_w else [])
        + [Patch(fc="white", ec=A_COLOR, hatch="////", label="all-reduce")],
        loc="upper left",
        bbox_to_anchor=(1.005, 1.0),
        fontsize=fontsize + 1,
        frameon=False,
    )


def draw_gantt(
    plan: Plan,
    graph: Graph,
    cluster: Cluster,
    ax: Axes,
    *,
    sim: SimResult | None = None,
    time_max: float | None = None,
    title: str | None = None,
    fontsize: float = 7.0,
) -> SimResult:
    """Draw the simulated schedule of ``plan`` on ``ax`` and return the simulation.

    One row per stage (stage 0 on top): forward bars in blue, backward in orange, the micro-batch
    index inside a bar when it fits, the stage's all-reduce after its last backward hatched.  The
    dashed line is the iteration time (the makespan).  ``time_max`` (seconds, default the makespan)
    fixes the time axis, so that charts of several plans drawn with one ``time_max`` compare by length.
    """
    _matplotlib()
    sim = sim if sim is not None else simulate(plan, graph, cluster)
    allreduce = {
        s.id: c.tail for s, c in zip(plan.stages, stage_costs(graph, cluster, plan.stages, plan.mini_batch_size))
    }
    T = sim.iteration_time
    span = max(T, time_max or 0.0)
    scale, unit = time_unit(span)
    by_stage: dict[int, list[Any]] = defaultdict(list)
    for t in sim.tasks:
        by_stage[t.stage].append(t)
    _task_bars(ax, plan, by_stage, allreduce, scale)
    ax.set_xlim(0, span * scale * 1.02 if span > 0 else 1)
    ax.set_ylim(len(plan.stages) - 0.5, -0.5)
    ax.axvline(T * scale, color="0.2", ls="--", lw=0.8)
    _micro_batch_labels(ax, plan, by_stage, scale, span, fontsize)
    _stage_rows_and_legend(ax, plan, sim, unit, fontsize)
    if title is None:
        title = (
            f"{plan.planner}: iteration {T * scale:.4g} {unit}, throughput {sim.throughput:.4g} samples/s, "
            f"{plural(len(plan.stages), 'stage')}, depth {plan.depth}"
        )
    ax.set_title(title, fontsize=fontsize + 2)
    return sim


def plan_figure(plan: Plan, graph: Graph, cluster: Cluster | None, *, dpi: int = 120) -> Figure:
    """A matplotlib ``Figure`` (not registered with pyplot) with the stage graph above the Gantt chart."""
    _matplotlib()
    from matplotlib.figure import Figure

    pos = stage_layout(plan)
    ncols = int(max(x for x, _ in pos.values())) + 1
    nrows = max(sum(1 for p in pos.values() if p[0] == x) for x in range(ncols))
    width = max(8.0, min(40.0, 1.9 * ncols))
    graph_h = max(2.0, min(30.0, 0.95 * nrows + 0.8))
    gantt_h = max(2.2, min(30.0, 0.32 * len(plan.stages) + 1.6)) if cluster is not None else 0.0
    fig = Figure(figsize=(width, graph_h + gantt_h), dpi=dpi, layout="constrained")
    if cluster is None:
        draw_stage_graph(plan, graph, fig.add_subplot(1, 1, 1))
        return fig
    ax_g, ax_t = fig.subplots(2, 1, height_ratios=[graph_h, gantt_h])
    draw_stage_graph(plan, graph, ax_g)
    draw_gantt(plan, graph, cluster, ax_t)
    return fig


PICTURE_FORMATS = ("png", "pdf", "svg")


def draw_plan(plan: Plan, graph: Graph, cluster: Cluster | None, path: str | Path, *, dpi: int = 120) -> Path:
    """Write the stage graph and, when ``cluster`` is given, the schedule's Gantt chart to ``path``,
    in the format its extension names (``.png``, ``.pdf`` or ``.svg``; another one is refused)."""
    path = Path(path)
    fmt = path.suffix.lower().lstrip(".")
    if fmt not in PICTURE_FORMATS:
        raise InvalidInputError(
            f"{path}: cannot tell the picture format from the extension {path.suffix or '(none)'!r}; "
            f"use one of: {', '.join('.' + f for f in PICTURE_FORMATS)}"
        )
    fig = plan_figure(plan, graph, cluster, dpi=dpi)
    fig.savefig(path, format=fmt)
    logger.info("wrote %s (%d stages)", path, len(plan.stages))
    return path


def draw_metric_vs_devices(
    results: Mapping[int, Sequence[CompareRow]],
    metric: str,
    ax: Axes,
    *,
    log: bool = False,
    bars: bool = True,
    ylabel: str | None = None,
    title: str | None = None,
    legend: bool = True,
) -> None:
    """Plot ``metric`` (a :class:`~gpp_solver.compare.CompareRow` field, e.g. ``throughput`` or
    ``search_seconds``) per planner against the device count.

    ``results`` maps a device count to that run's rows.  ``bars=True`` draws grouped bars (Fig. 6);
    otherwise lines with markers.  Rows without the figure are left out, so a missing bar means the
    planner found no plan; a figure of a run that gave no plan (infeasible, time limit, error: no
    throughput), such as its search time, is drawn as a black ``x``.  Each planner keeps one
    colour (``C0``, ``C1``... in order of first appearance), so panels drawn from one sweep agree.
    """
    _matplotlib()
    devices = sorted(results)
    planners: list[str] = []
    for d in devices:
        for r in results[d]:
            if r.planner not in planners:
                planners.append(r.planner)
    row = {(d, r.planner): r for d in devices for r in results[d]}
    width = 0.8 / max(1, len(planners))
    failed: list[tuple[float, float]] = []
    for k, name in enumerate(planners):
        pts = [(i, row[(d, name)]) for i, d in enumerate(devices) if (d, name) in row]
        pts = [(i, getattr(r, metric), r.throughput is None) for i, r in pts if getattr(r, metric) is not None]
        x = [i - 0.4 + width * (k + 0.5) if bars else i for i, _, _ in pts]
        failed += [(xi, v) for xi, (_, v, bad) in zip(x, pts) if bad]
        if not pts:
            continue
        if bars:
            ax.bar(x, [v for _, v, _ in pts], width, label=name, color=f"C{k % 10}")
        else:
            ax.plot(x, [v for _, v, _ in pts], marker="o", label=name, color=f"C{k % 10}")
    if failed:
        ax.scatter(
            [x for x, _ in failed],
            [v for _, v in failed],
            marker="x",
            color="black",
            s=40,
            zorder=4,
            label="no plan (infeasible, time limit or error)",
        )
    ax.set_xticks(range(len(devices)))
    ax.set_xticklabels([str(d) for d in devices])
    ax.set_xlabel("devices")
    ax.set_ylabel(ylabel or metric.replace("_", " "))
    if log:
        ax.set_yscale("log")
    if title:
        ax.set_title(title)
    if planners and legend:
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
