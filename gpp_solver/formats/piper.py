"""Import a Piper planner input (JSON, Tarnawski et al. NeurIPS 2021) as a gpp-graph/1 graph.

Piper's input: ``maxDevices``, ``maxMemoryPerDevice`` (bytes), ``bandwidth`` (bytes/s),
``mbsInBatch`` (micro-batches per batch), ``nodes[]`` = ``{id, name, TMPCs: {t: [TMPC...]}}``
with each TMPC ``{id, timePerSample, parameterSize, memoryUsageA, memoryUsageB, syncTimeFw,
syncTimeBw}``, and ``edges[] = {sourceId, destId, communicationCost}``.  In Piper a "sample" is
one micro-batch of the underlying profile; TPS = timePerSample / d + bytes / d / bandwidth.

Units, as the shared files show: ``piper/gnmt.json`` is PipeDream's ``gnmt_large.graph.txt``
re-encoded (same node names): the "vanilla" TMPC's ``timePerSample`` is forward + backward in
**milliseconds**, the "activation recomp" TMPC's is 2 x forward + backward, ``memoryUsageA`` is
PipeDream's ``activation_size`` (x 0.09 with recomputation), ``memoryUsageB`` is 2 x parameters
(PipeDream-2BW's two weight versions; + 0.91 x activations with recomputation).  The published
planner nevertheless divides bytes by ``bandwidth`` in bytes/s and adds the result to these
milliseconds; the raw figures are kept (below) so a faithful Piper planner can do the same.

What each quantity becomes (one Piper sample = one graph sample, ``micro_batch_sizes = [1]``):

- node id: the Piper ``name`` when names are unique (``nodeN``), else ``n<id>``; ``extra.op`` = name,
  ``extra.piper_id`` = the Piper id;
- the node's base configuration is its t=1 "vanilla" (non-recompute) TMPC:
  ``fw_time``/``bw_time`` = its ``timePerSample`` x ``time_unit`` (1e-3 s) split into forward and
  backward as Piper's inputs encode it: forward = recompute timePerSample - vanilla timePerSample
  (the recomputed forward) when that lies in [0, vanilla], else 1/3 forward, 2/3 backward;
  ``weight_bytes`` = ``parameterSize``; ``activation_bytes`` = ``memoryUsageA`` (per sample,
  what is stashed per in-flight micro-batch); ``output_bytes`` = the largest ``communicationCost``
  of its out-edges (0 for a sink); ``memoryUsageB`` has no base field (kept in ``tmpc``);
- every edge -> ``{"src", "dst", "bytes": communicationCost}``;
- every TMPC (all t, all variants) -> one entry of the node's ``tmpc`` list, ``{"t", "recompute"
  (its id names recomputation), "fw_time", "bw_time" (split as above, the same forward time for
  all variants of one t), "weight_bytes", "activation_bytes", and under "extra": "name" (the TMPC id), "memory_b",
  "time_per_sample" (raw, milliseconds), "sync_time_fw" / "sync_time_bw" (bytes, keyed by our id
  of the predecessor / successor: the published code keys ``syncTimeFw`` by the node's
  predecessors and ``syncTimeBw`` by its successors; edges a TMPC omits get 0)}``;
- the graph gets ``"extra": {"piper": {maxDevices, maxMemoryPerDevice, bandwidth, mbsInBatch, time_unit}``.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from gpp_solver.errors import InvalidGraphError
from gpp_solver.formats.graph import graph_from_dict
from gpp_solver.formats.jsonio import integer, number, read_json, require
from gpp_solver.limits import MAX_BYTES
from gpp_solver.types import GRAPH_FORMAT, Graph

logger = logging.getLogger(__name__)
E = InvalidGraphError
TMPC_FIELDS = ("id", "timePerSample", "parameterSize", "memoryUsageA", "memoryUsageB", "syncTimeFw", "syncTimeBw")


def _is_recompute(tmpc_id: str) -> bool:
    return "recomp" in tmpc_id.lower()


def _forward_share(group: list[dict]) -> tuple[float | None, float | None]:
    """(forward ms, forward fraction) from a vanilla/recompute pair of one t, or (None, None)."""
    van = next((x for x in group if not _is_recompute(x["id"])), None)
    rec = next((x for x in group if _is_recompute(x["id"])), None)
    if van is None or rec is None:
        return None, None
    fw = round(rec["timePerSample"] - van["timePerSample"], 9)  # drop float noise of the difference
    if 0.0 <= fw <= van["timePerSample"]:
        return fw, (fw / van["timePerSample"] if van["timePerSample"] > 0 else 1.0 / 3.0)
    return None, None


def _read_tmpc(x: Any, where: str) -> dict:
    for f in TMPC_FIELDS:
        require(x, f, where, E)
    if not isinstance(x["id"], str) or not x["id"]:
        raise E(f"{where}.id must be a non-empty string, got {x['id']!r}")
    out = {"id": x["id"]}
    for f in ("timePerSample", "parameterSize", "memoryUsageA", "memoryUsageB"):
        out[f] = number(x[f], f"{where}.{f}", E, maximum=MAX_BYTES)
    for f in ("syncTimeFw", "syncTimeBw"):
        if not isinstance(x[f], dict):
            raise E(f"{where}.{f} must be an object keyed by node id, got {x[f]!r}")
        out[f] = {str(k): number(v, f"{where}.{f}[{k}]", E, maximum=MAX_BYTES) for k, v in x[f].items()}
    return out


def piper_dict(doc: Any, *, name: str = "piper", time_unit: float = 1e-3) -> dict:
    """The gpp-graph/1 dict of the Piper input ``doc`` (see the module docstring)."""
    if not isinstance(doc, dict):
        raise E(f"Piper input must be a JSON object, got {type(doc).__name__}")
    top = {
        "maxDevices": integer(require(doc, "maxDevices", "Piper input", E), "maxDevices", E, minimum=1),
        "maxMemoryPerDevice": number(
            require(doc, "maxMemoryPerDevice", "Piper input", E), "maxMemoryPerDevice", E, positive=True
        ),
        "bandwidth": number(require(doc, "bandwidth", "Piper input", E), "bandwidth", E, positive=True),
        "mbsInBatch": integer(require(doc, "mbsInBatch", "Piper input", E), "mbsInBatch", E, minimum=1),
        "time_unit": time_unit,
    }
    raw_nodes, raw_edges = require(doc, "nodes", "Piper input", E), require(doc, "edges", "Piper input", E)
    if not isinstance(raw_nodes, list) or not raw_nodes:
        raise E("Piper input: nodes must be a non-empty list")
    if not isinstance(raw_edges, list):
        raise E("Piper input: edges must be a list")
    pids, our = _node_ids(raw_nodes)
    links = _Links(pids, our, raw_edges)
    nodes = [_node(nd, pids[i], our, links, time_unit) for i, nd in enumerate(raw_nodes)]
    return {
        "format": GRAPH_FORMAT,
        "name": name,
        "micro_batch_sizes": [1],
        "nodes": nodes,
        "edges": links.edges,
        "extra": {"piper": top},
    }


def _node_ids(raw_nodes: list) -> tuple[list[int], dict[int, str]]:
    """The Piper ids in order and our node id of each: the Piper name when unique, else ``n<id>``."""
    pids: list[int] = []
    for i, nd in enumerate(raw_nodes):
        pid = integer(require(nd, "id", f"Piper node #{i}", E), f"Piper node #{i}.id", E)
        if pid in pids:
            raise E(f"Piper node #{i}: duplicate id {pid}")
        pids.append(pid)
    names = [nd.get("name") for nd in raw_nodes]
    use_names = all(isinstance(n, str) and n for n in names) and len(set(names)) == len(names)
    return pids, {pid: (names[i] if use_names else f"n{pid}") for i, pid in enumerate(pids)}


class _Links:
    """The Piper edges read: predecessors and successors by Piper id, our edge dicts, and each
    node's largest outgoing transfer (its ``output_bytes``)."""

    def __init__(self, pids: list[int], our: dict[int, str], raw_edges: list) -> None:
        self.preds: dict[int, set[int]] = {p: set() for p in pids}
        self.succs: dict[int, set[int]] = {p: set() for p in pids}
        self.edges: list[dict] = []
        self.out_bytes: dict[int, float] = {p: 0.0 for p in pids}
        for i, ed in enumerate(raw_edges):
            where = f"Piper edge #{i}"
            s = integer(require(ed, "sourceId", where, E), f"{where}.sourceId", E)
            t = integer(require(ed, "destId", where, E), f"{where}.destId", E)
            c = number(require(ed, "communicationCost", where, E), f"{where}.communicationCost", E, maximum=MAX_BYTES)
            for end in (s, t):
                if end not in self.preds:
                    raise E(f"{where} ({s} -> {t}) refers to unknown node id {end}")
            if t in self.succs[s]:
                raise E(f"{where} ({s} -> {t}) is a duplicate edge")
            self.succs[s].add(t)
            self.preds[t].add(s)
            self.out_bytes[s] = max(self.out_bytes[s], c)
            self.edges.append({"src": our[s], "dst": our[t], "bytes": c})


def _tmpc_groups(tm: Any, where: str) -> dict[int, list[dict]]:
    """A node's ``TMPCs`` object read: its TMPCs per tensor-parallel degree."""
    if not isinstance(tm, dict):
        raise E(f"{where}.TMPCs must be an object keyed by tensor-parallel degree")
    groups: dict[int, list[dict]] = {}
    for key, lst in tm.items():
        try:
            t = int(key)
        except (TypeError, ValueError):
            raise E(f"{where}.TMPCs key {key!r} is not a tensor-parallel degree") from None
        if t < 1 or not isinstance(lst, list):
            raise E(f"{where}.TMPCs[{key!r}] must be a list under a degree >= 1")
        groups[t] = [_read_tmpc(x, f"{where}.TMPCs[{key!r}][{j}]") for j, x in enumerate(lst)]
    return groups


def _node(nd: dict, pid: int, our: dict[int, str], links: _Links, time_unit: float) -> dict:
    """Our node dict of Piper node ``nd``: its TMPCs, and the base figures of its t=1 TMPC without
    recomputation."""
    where = f"Piper node {our[pid]!r} (id {pid})"
    groups = _tmpc_groups(require(nd, "TMPCs", where, E), where)
    base_group = groups.get(1, [])
    base = next((x for x in base_group if not _is_recompute(x["id"])), None)
    if base is None:
        raise E(f"{where} has no t=1 TMPC without recomputation (needed for its base times)")
    _, base_frac = _forward_share(base_group)
    frac = 1.0 / 3.0 if base_frac is None else base_frac
    preds, succs = links.preds[pid], links.succs[pid]
    tmpcs = []
    for t in sorted(groups):
        fw_ms, _ = _forward_share(groups[t])
        van = next((x for x in groups[t] if not _is_recompute(x["id"])), groups[t][0] if groups[t] else None)
        if fw_ms is None and van is not None:
            fw_ms = frac * van["timePerSample"]
        for j, x in enumerate(groups[t]):
            for key, allowed, kind in (("syncTimeFw", preds, "predecessor"), ("syncTimeBw", succs, "successor")):
                for k in x[key]:
                    if not k.lstrip("-").isdigit() or int(k) not in allowed:
                        raise E(f"{where}.TMPCs['{t}'][{j}].{key} has key {k!r}, not a {kind} of this node")
            f = min(fw_ms, x["timePerSample"])
            tmpcs.append(
                {
                    "t": t,
                    "recompute": _is_recompute(x["id"]),
                    "fw_time": [f * time_unit],
                    "bw_time": [(x["timePerSample"] - f) * time_unit],
                    "weight_bytes": x["parameterSize"],
                    "activation_bytes": x["memoryUsageA"],
                    "extra": {
                        "name": x["id"],
                        "memory_b": x["memoryUsageB"],
                        "time_per_sample": x["timePerSample"],
                        "sync_time_fw": {our[p]: x["syncTimeFw"].get(str(p), 0.0) for p in sorted(preds)},
                        "sync_time_bw": {our[s]: x["syncTimeBw"].get(str(s), 0.0) for s in sorted(succs)},
                    },
                }
            )
    b = next(x for x in tmpcs if x["t"] == 1 and x["extra"]["name"] == base["id"])
    return {
        "id": our[pid],
        "fw_time": list(b["fw_time"]),
        "bw_time": list(b["bw_time"]),
        "weight_bytes": b["weight_bytes"],
        "activation_bytes": b["activation_bytes"],
        "output_bytes": links.out_bytes[pid],
        "tmpc": tmpcs,
        "extra": {"op": nd.get("name", ""), "piper_id": pid},
    }


def import_piper(path: str | Path, *, name: str | None = None, time_unit: float = 1e-3) -> Graph:
    """Read a Piper input JSON at ``path`` as a validated :class:`Graph` (``time_unit``: seconds
    per unit of ``timePerSample``; the published inputs use milliseconds)."""
    number(time_unit, "time_unit", E, positive=True, maximum=1.0)
    p = Path(path)
    doc = read_json(p, "Piper input", E)
    return graph_from_dict(piper_dict(doc, name=name or p.stem, time_unit=time_unit))
