"""Import a PipeDream profile (``graph.txt`` written by PipeDream's profiler) as a gpp-graph/1 graph.

Format: one line per node ``nodeN -- description -- forward_compute_time=MS,
backward_compute_time=MS, activation_size=BYTES, parameter_size=BYTES`` (``activation_size`` may
be a list ``[a; b; ...]`` for nodes with several outputs), and one line per edge, indented with a
tab: ``\\tnodeA -- nodeB``.

What each quantity becomes (the profile is of ONE mini-batch of ``batch_size`` samples, which the
file does not record: pass it; 256 for the shared AlexNet profile and 128 for Inception-v3 follow
from their input nodes' ``activation_size`` = batch x 3 x 224^2 (resp. 299^2) x 4 bytes):

- ``forward_compute_time`` / ``backward_compute_time`` (milliseconds) -> ``fw_time`` /
  ``bw_time`` in seconds at ``micro_batch_sizes = [batch_size]`` (one measured size; the graph
  format then treats smaller micro-batches as no faster and larger ones as linear);
- ``activation_size`` (bytes for the batch; a list is summed) / ``batch_size`` -> both
  ``output_bytes`` and ``activation_bytes`` per sample.  PipeDream's ``activation_size`` is the
  size of the node's output tensor(s); PipeDream's planner uses it both as what crosses a stage
  boundary and as what a stage stashes per in-flight input, so both fields get it;
- ``parameter_size`` (bytes) -> ``weight_bytes``;
- the description -> node field ``op``; ids stay ``nodeN``.

Quirks of the published files that this importer keeps as they are: input nodes (``Input``,
``Input0``...) have zero times in GNMT but the AlexNet input node carries 636 ms of forward time
(data loading), Inception-v3 21.7 ms; ``Size``/``View``/``__getitem__`` nodes have zero time.
Duplicate edge lines are merged; a node defined twice, a malformed line, a bad number or an edge
to an unknown node raises :class:`InvalidGraphError` naming the line number.
"""

from __future__ import annotations

import logging
import math
import re
from pathlib import Path

from gpp_solver.errors import InvalidGraphError
from gpp_solver.formats.graph import graph_from_dict
from gpp_solver.types import GRAPH_FORMAT, Graph

logger = logging.getLogger(__name__)

FIELDS = ("forward_compute_time", "backward_compute_time", "activation_size", "parameter_size")
_KV = re.compile(r"\s*(\w+)\s*=\s*(\[[^\]]*\]|[^,]*)\s*(?:,|$)")


def _number(text: str, where: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise InvalidGraphError(f"{where}: {text.strip()!r} is not a number") from None
    if not math.isfinite(v) or v < 0:
        raise InvalidGraphError(f"{where}: must be a finite non-negative number, got {text.strip()!r}")
    return v


def _metrics(text: str, where: str) -> dict[str, float]:
    values: dict[str, float] = {}
    pos = 0
    while pos < len(text.rstrip()):
        m = _KV.match(text, pos)
        if not m or m.end() == pos:
            raise InvalidGraphError(f"{where}: cannot parse {text[pos:].strip()!r} as key=value")
        key, raw = m.group(1), m.group(2).strip()
        if raw.startswith("["):
            parts = [p for p in raw[1:-1].split(";") if p.strip()]
            values[key] = sum(_number(p, f"{where}: {key}") for p in parts)
        else:
            values[key] = _number(raw, f"{where}: {key}")
        pos = m.end()
    for f in FIELDS:
        if f not in values:
            raise InvalidGraphError(f"{where}: missing field '{f}'")
    return values


def pipedream_dict(text: str, *, batch_size: int = 1, name: str = "pipedream",
                   source: str = "<text>") -> dict:
    """The gpp-graph/1 dict of the PipeDream profile ``text`` (see the module docstring)."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise InvalidGraphError(f"batch_size must be a positive integer, got {batch_size!r}")
    nodes: dict[str, dict] = {}
    edge_lines: list[tuple[int, str, str]] = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        where = f"{source} line {lineno}"
        if not line.strip():
            continue
        if line[0].isspace():  # edge line
            parts = [p.strip() for p in line.strip().split(" -- ")]
            if len(parts) != 2 or not all(parts):
                raise InvalidGraphError(f"{where}: edge line must be '<tab>nodeA -- nodeB', got {line.strip()!r}")
            edge_lines.append((lineno, parts[0], parts[1]))
            continue
        parts = line.split(" -- ")
        if len(parts) < 3:
            raise InvalidGraphError(f"{where}: node line must be 'nodeN -- description -- metrics', "
                                    f"got {line.strip()[:80]!r}")
        nid, desc, metrics = parts[0].strip(), " -- ".join(parts[1:-1]).strip(), parts[-1]
        if not nid or any(c.isspace() for c in nid):
            raise InvalidGraphError(f"{where}: bad node id {nid!r}")
        if nid in nodes:
            raise InvalidGraphError(f"{where}: node '{nid}' is defined twice "
                                    f"(first at line {nodes[nid]['line']})")
        m = _metrics(metrics, f"{where} (node '{nid}')")
        per_sample = m["activation_size"] / batch_size
        nodes[nid] = {"id": nid, "fw_time": [m["forward_compute_time"] / 1000.0],
                      "bw_time": [m["backward_compute_time"] / 1000.0],
                      "weight_bytes": m["parameter_size"], "activation_bytes": per_sample,
                      "output_bytes": per_sample, "op": desc, "line": lineno}
    edges: list[dict] = []
    seen: set[tuple[str, str]] = set()
    for lineno, src, dst in edge_lines:
        for end in (src, dst):
            if end not in nodes:
                raise InvalidGraphError(f"{source} line {lineno}: edge {src} -> {dst} refers to unknown node '{end}'")
        if src == dst:
            raise InvalidGraphError(f"{source} line {lineno}: edge {src} -> {dst} is a self-loop")
        if (src, dst) in seen:
            logger.debug("%s line %d: duplicate edge %s -> %s merged", source, lineno, src, dst)
            continue
        seen.add((src, dst))
        edges.append({"src": src, "dst": dst})
    if not nodes:
        raise InvalidGraphError(f"{source}: no node lines found")
    for nd in nodes.values():
        del nd["line"]
    return {"format": GRAPH_FORMAT, "name": name, "micro_batch_sizes": [batch_size],
            "nodes": list(nodes.values()), "edges": edges,
            "source": {"format": "pipedream-graph.txt", "file": source, "batch_size": batch_size}}


def import_pipedream(path: str | Path, *, batch_size: int = 1, name: str | None = None) -> Graph:
    """Read PipeDream's ``graph.txt`` at ``path`` as a validated :class:`Graph`."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise InvalidGraphError(f"cannot read PipeDream profile {p}: {exc.strerror or exc}") from None
    default = p.name.removesuffix(".txt").removesuffix(".graph")
    return graph_from_dict(pipedream_dict(text, batch_size=batch_size, name=name or default, source=p.name))
