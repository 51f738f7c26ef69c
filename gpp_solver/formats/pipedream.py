"""Import a PipeDream profile (``graph.txt`` written by PipeDream's profiler) as a gpp-graph/1 graph.

Format: one line per node ``nodeN -- description -- forward_compute_time=MS,
backward_compute_time=MS, activation_size=BYTES, parameter_size=BYTES`` (``activation_size`` may
be a list ``[a; b; ...]`` for nodes with several outputs), and one line per edge, indented with a
tab: ``\\tnodeA -- nodeB``.

What each quantity becomes (the profile is of ONE mini-batch of ``batch_size`` samples, which the
file does not record: it is required, as ``batch_size=`` / ``--batch-size``, or read from the sidecar
file ``FILE.json`` beside the profile, ``{"batch_size": N}``; with neither the import fails, since a
wrong guess scales every time and byte count by the same wrong factor.  256 for the shared AlexNet
profile and 128 for Inception-v3 follow from their input nodes' ``activation_size`` = batch x 3 x
224^2 (resp. 299^2) x 4 bytes; the error message suggests such a size when the input node shows one):

- ``forward_compute_time`` / ``backward_compute_time`` (milliseconds) -> ``fw_time`` /
  ``bw_time`` in seconds at ``micro_batch_sizes = [batch_size]`` (one measured size; the graph
  format then treats smaller micro-batches as no faster and larger ones as linear);
- ``activation_size`` (bytes for the batch; a list is summed) / ``batch_size`` -> both
  ``output_bytes`` and ``activation_bytes`` per sample.  PipeDream's ``activation_size`` is the
  size of the node's output tensor(s); PipeDream's planner uses it both as what crosses a stage
  boundary and as what a stage stashes per in-flight input, so both fields get it;
- ``parameter_size`` (bytes) -> ``weight_bytes``;
- the description -> node ``extra.op``; ids stay ``nodeN``; the graph's ``extra.source`` records the
  file, its format and the batch size assumed (and where it came from).

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
from gpp_solver.formats.jsonio import integer, read_json, read_text, require
from gpp_solver.limits import MAX_COUNT
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


# complexity: one check per field of PipeDream's profile format, each naming the field
def pipedream_dict(  # noqa: C901, PLR0912, PLR0915
    text: str, *, batch_size: int, name: str = "pipedream", source: str = "<text>", batch_size_from: str = "batch_size"
) -> dict:
    """The gpp-graph/1 dict of the PipeDream profile ``text`` (see the module docstring)."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or not 1 <= batch_size <= MAX_COUNT:
        raise InvalidGraphError(f"batch_size must be a positive integer (at most {MAX_COUNT}), got {batch_size!r}")
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
            raise InvalidGraphError(
                f"{where}: node line must be 'nodeN -- description -- metrics', got {line.strip()[:80]!r}"
            )
        nid, desc, metrics = parts[0].strip(), " -- ".join(parts[1:-1]).strip(), parts[-1]
        if not nid or any(c.isspace() for c in nid):
            raise InvalidGraphError(f"{where}: bad node id {nid!r}")
        if nid in nodes:
            raise InvalidGraphError(f"{where}: node '{nid}' is defined twice (first at line {nodes[nid]['line']})")
        m = _metrics(metrics, f"{where} (node '{nid}')")
        per_sample = m["activation_size"] / batch_size
        nodes[nid] = {
            "id": nid,
            "fw_time": [m["forward_compute_time"] / 1000.0],
            "bw_time": [m["backward_compute_time"] / 1000.0],
            "weight_bytes": m["parameter_size"],
            "activation_bytes": per_sample,
            "output_bytes": per_sample,
            "extra": {"op": desc},
            "line": lineno,
        }
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
    return {
        "format": GRAPH_FORMAT,
        "name": name,
        "micro_batch_sizes": [batch_size],
        "nodes": list(nodes.values()),
        "edges": edges,
        "extra": {
            "source": {
                "format": "pipedream-graph.txt",
                "file": source,
                "batch_size": batch_size,
                "batch_size_from": batch_size_from,
            }
        },
    }


def sidecar_path(path: str | Path) -> Path:
    """``FILE.json`` beside the profile ``FILE``: ``{"batch_size": N}``, the profiled mini-batch size."""
    p = Path(path)
    return p.with_name(p.name + ".json")


def _suggest(text: str) -> str:
    """A hint from the input node's activation_size (an image batch of 3x224^2, 3x299^2 or 3x32^2 fp32)."""
    m = re.search(r"^\S+ -- Input\w* -- .*activation_size=([0-9.]+)", text, re.MULTILINE)
    if not m:
        return ""
    size = float(m.group(1))
    fits = [
        f"{int(size / (12 * s * s))} samples of 3x{s}x{s}"
        for s in (224, 299, 32)
        if size / (12 * s * s) >= 1 and (size / (12 * s * s)).is_integer()
    ]
    return f"; its input node's activation_size fits {' or '.join(fits)} fp32" if fits else ""


def import_pipedream(path: str | Path, *, batch_size: int | None = None, name: str | None = None) -> Graph:
    """Read PipeDream's ``graph.txt`` at ``path`` as a validated :class:`Graph`.

    ``batch_size``: samples in the profiled mini-batch; ``None`` reads it from the sidecar
    :func:`sidecar_path` and fails (naming both ways to give it) when there is none.  The graph's
    ``extra["source"]`` says which size was assumed and where it came from."""
    p = Path(path)
    text = read_text(p, "PipeDream profile", InvalidGraphError)
    origin = "batch_size"
    if batch_size is None:
        side = sidecar_path(p)
        if not side.exists():
            raise InvalidGraphError(
                f"PipeDream profile {p}: the batch size it was profiled with is required (its times and "
                f"activation sizes are of one whole mini-batch, which graph.txt does not record): pass "
                f"--batch-size N, or write {{\"batch_size\": N}} to {side}{_suggest(text)}"
            )
        doc = read_json(side, "PipeDream sidecar", InvalidGraphError)
        batch_size = integer(
            require(doc, "batch_size", f"PipeDream sidecar {side}", InvalidGraphError),
            f"PipeDream sidecar {side}: batch_size",
            InvalidGraphError,
            minimum=1,
            maximum=MAX_COUNT,
        )
        origin = str(side)
    default = p.name.removesuffix(".txt").removesuffix(".graph")
    return graph_from_dict(
        pipedream_dict(text, batch_size=batch_size, name=name or default, source=p.name, batch_size_from=origin)
    )


def assumed_batch_size(g: Graph) -> str:
    """What an import from a PipeDream profile assumed (``g.extra["source"]``), as one sentence."""
    src = g.extra["source"]
    origin = "--batch-size" if src["batch_size_from"] == "batch_size" else src["batch_size_from"]
    return (
        f"assumed the profile is of one mini-batch of {src['batch_size']} samples (from {origin}): times are "
        f"per micro-batch of {src['batch_size']}, bytes per sample"
    )
