"""Pictures of a simulated schedule without a plotting library.

* :func:`to_chrome_trace` / :func:`write_trace` — a Chrome / Perfetto trace (``chrome://tracing``,
  https://ui.perfetto.dev): one process per stage, one complete event (``"ph": "X"``) per action,
  named ``F3`` / ``B3`` / ``allreduce``, times in microseconds.
* :func:`grid_text` — the plan's stage x step text grid (:func:`gpp_solver.plan.grid.order_grid`,
  re-exported here), and with a simulation a time-bucketed text Gantt chart below it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gpp_solver.plan.grid import order_grid
from gpp_solver.plan.simulate import SimResult
from gpp_solver.types import Plan

__all__ = ["to_chrome_trace", "write_trace", "order_grid", "gantt_text", "grid_text"]

US = 1e6  # seconds -> microseconds


#: trace-event category of each action kind
CATEGORY = {"F": "forward", "B": "backward", "W": "weight-gradient"}


def to_chrome_trace(sim: SimResult, plan: Plan) -> dict[str, Any]:
    """The simulation as a Chrome trace-event document (``{"traceEvents": [...]}``).

    ``pid`` is the stage id (named ``stage S (d devices, b=...)`` by a metadata event), ``tid`` 0;
    every forward, backward and the all-reduce tail is one ``"X"`` event with ``ts``/``dur`` in
    microseconds and ``args`` giving the stage, kind and micro-batch.
    """
    events: list[dict[str, Any]] = []
    for st in plan.stages:
        label = (
            f"stage {st.id} ({len(st.devices)} device{'s' if len(st.devices) != 1 else ''}, "
            f"b={st.micro_batch_size}, {len(st.nodes)} node{'s' if len(st.nodes) != 1 else ''})"
        )
        events.append({"name": "process_name", "ph": "M", "pid": st.id, "tid": 0, "args": {"name": label}})
        events.append({"name": "process_sort_index", "ph": "M", "pid": st.id, "tid": 0, "args": {"sort_index": st.id}})
    for t in sorted(sim.tasks, key=lambda t: (t.stage, t.start)):
        events.append(
            {
                "name": f"{t.kind}{t.micro_batch}",
                "cat": CATEGORY.get(t.kind, "backward"),
                "ph": "X",
                "pid": t.stage,
                "tid": 0,
                "ts": t.start * US,
                "dur": (t.end - t.start) * US,
                "args": {"stage": t.stage, "kind": t.kind, "micro_batch": t.micro_batch},
            }
        )
    for s in sim.stages:
        if s.allreduce > 0:
            start, end = sim.allreduce_span(s.stage)
            events.append(
                {
                    "name": "allreduce",
                    "cat": "allreduce",
                    "ph": "X",
                    "pid": s.stage,
                    "tid": 0,
                    "ts": start * US,
                    "dur": (end - start) * US,
                    "args": {"stage": s.stage},
                }
            )
    return {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {
            "graph": plan.graph,
            "planner": plan.planner,
            "mini_batch_size": plan.mini_batch_size,
            "iteration_time_s": sim.iteration_time,
            "throughput": sim.throughput,
        },
    }


def write_trace(sim: SimResult, plan: Plan, path: str | Path) -> Path:
    """Write :func:`to_chrome_trace` as JSON to ``path`` and return the path."""
    path = Path(path)
    path.write_text(json.dumps(to_chrome_trace(sim, plan)))
    return path


GRID_LEGEND = (
    "legend: Fj / Bj = forward / backward pass of micro-batch j, in the order each stage runs them; "
    "Wj = its weight gradient (in an order with W, Bj is the input gradient alone)"
)
GANTT_LEGEND = (
    "legend: F forward, B backward, W weight gradient, A gradient all-reduce, . idle (each character: "
    "what fills most of its time slice)"
)


def gantt_text(sim: SimResult, width: int = 80) -> str:
    """A time-bucketed Gantt chart: per stage ``width`` characters, each bucket shown as ``F``, ``B``
    or ``A`` (all-reduce) by what occupies most of it, ``.`` when the stage is mostly idle."""
    T = sim.iteration_time
    if T <= 0:
        return ""
    dt = T / width
    lines = []
    for st in sim.stages:
        spans = [(t.start, t.end, t.kind) for t in sim.tasks if t.stage == st.stage]
        if st.allreduce > 0:
            a0, a1 = sim.allreduce_span(st.stage)
            spans.append((a0, a1, "A"))
        row = []
        for i in range(width):
            b0, b1 = i * dt, (i + 1) * dt
            occ = {"F": 0.0, "B": 0.0, "W": 0.0, "A": 0.0}
            for s0, s1, k in spans:
                occ[k] += max(0.0, min(b1, s1) - max(b0, s0))
            k, v = max(occ.items(), key=lambda kv: kv[1])
            row.append(k if v >= dt / 2 else ".")
        lines.append(f"stage {st.stage}".ljust(10) + "|" + "".join(row) + f"| idle {st.idle_fraction:5.1%}")
    lines.append(" " * 10 + f"0{'':{width - 1}}{T:.4g} s")
    lines.append(GANTT_LEGEND)
    return "\n".join(lines)


def grid_text(plan: Plan, sim: SimResult | None = None, *, width: int = 80, max_steps: int = 64) -> str:
    """The plan's orders as a stage x step grid; with ``sim``, a text Gantt chart below it."""
    text = order_grid({s.id: s.schedule.order for s in plan.stages}, max_steps=max_steps) + "\n" + GRID_LEGEND
    if sim is not None:
        text += (
            f"\n\niteration time {sim.iteration_time:.6g} s, throughput {sim.throughput:.6g} samples/s\n"
            + gantt_text(sim, width)
        )
    return text
