"""The stage graph laid out for a picture, without a plotting library: each stage's position (its
topological depth left to right, its slot in that column) and the text of its box (stage id,
nodes, devices, micro-batch size).  :mod:`gpp_solver.viz` draws them."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

from gpp_solver.errors import InvalidInputError
from gpp_solver.formats.units import plural
from gpp_solver.types import Graph, Plan


def _short(text: str, width: int = 18) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def _device_text(devices: Sequence[int]) -> str:
    ds = sorted(devices)
    if ds and ds == list(range(ds[0], ds[-1] + 1)):
        return f"dev {ds[0]}" if len(ds) == 1 else f"dev {ds[0]}–{ds[-1]}"
    return "dev " + ",".join(map(str, ds))


def stage_label(plan: Plan, graph: Graph | None, stage_id: int) -> str:
    """Box text of one stage: ``S3 · 5 nodes`` / first and last node id / devices and micro-batch."""
    st = plan.stage(stage_id)
    nodes = list(st.nodes)
    if graph is not None:
        nodes.sort(key=lambda v: graph.index.get(v, 0))
    head = f"S{st.id} · {plural(len(nodes), 'node')}"
    span = _short(nodes[0]) if len(nodes) == 1 else f"{_short(nodes[0])} …\n{_short(nodes[-1])}"
    extra = f" t={st.tensor_parallel}" if st.tensor_parallel != 1 else ""
    extra += " recompute" if st.recompute else ""
    extra += " zero1" if st.zero else ""
    return f"{head}\n{span}\n{_device_text(st.devices)} · b={st.micro_batch_size}{extra}"


def stage_layout(plan: Plan) -> dict[int, tuple[float, float]]:
    """Positions ``{stage id: (x, y)}``: ``x`` the stage's topological depth (longest path from a
    source), ``y`` its slot in that column, ordered by the mean height of its predecessors and
    centred on 0 (stage graphs are small; no graphviz needed)."""
    ids = [s.id for s in plan.stages]
    preds: dict[int, list[int]] = {i: [] for i in ids}
    succs: dict[int, list[int]] = {i: [] for i in ids}
    for a, b in plan.edges:
        preds[b].append(a)
        succs[a].append(b)
    depth: dict[int, int] = {}
    indeg = {i: len(preds[i]) for i in ids}
    ready = sorted(i for i in ids if indeg[i] == 0)
    while ready:
        i = ready.pop(0)
        depth[i] = max((depth[p] + 1 for p in preds[i]), default=0)
        for j in succs[i]:
            indeg[j] -= 1
            if indeg[j] == 0:
                ready.append(j)
        ready.sort()
    if len(depth) != len(ids):
        raise InvalidInputError("stage graph has a cycle; cannot lay it out by depth")
    columns: dict[int, list[int]] = defaultdict(list)
    for i in ids:
        columns[depth[i]].append(i)
    pos: dict[int, tuple[float, float]] = {}
    for x in sorted(columns):
        col = columns[x]

        def key(i: int) -> tuple[float, int]:
            ys = [pos[p][1] for p in preds[i]]
            return (-(sum(ys) / len(ys)) if ys else 0.0, i)

        col.sort(key=key)
        for slot, i in enumerate(col):
            pos[i] = (float(x), (len(col) - 1) / 2.0 - slot)
    return pos
