"""Recognise what kind of file a user handed in, so a wrong one gets the command that reads it.

:func:`sniff` reads the start of a file and names its kind: ``gpp-graph/1``, ``gpp-cluster/1``,
``gpp-plan/1`` (from the ``format`` field), ``pipedream`` (a PipeDream ``graph.txt`` profile: lines
``nodeN -- DESCRIPTION -- forward_compute_time=...``), ``piper`` (a Piper input JSON: ``nodes`` with
``TMPCs``, or Piper's ``maxDevices`` / ``mbsInBatch`` fields), or ``None`` when it cannot tell.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from gpp_solver.errors import InvalidInputError

T = TypeVar("T")

_PIPEDREAM_LINE = re.compile(rb"\s*node\d+ -- .* -- forward_compute_time=")
_HINT = {
    "pipedream": "this looks like a PipeDream profile (graph.txt): convert it first with "
    "`gpp import pipedream {path} --batch-size N -o graph.json` (N: the samples in the profiled "
    "mini-batch)",
    "piper": "this looks like a Piper input JSON: convert it first with `gpp import piper {path} -o graph.json`",
}


def sniff(path: str | Path) -> str | None:
    """The kind of the file at ``path`` (module docstring), or ``None``; never raises on bad content."""
    try:
        with open(path, "rb") as f:
            head = f.read(4096)
    except OSError:
        return None
    if _PIPEDREAM_LINE.match(head.split(b"\n", 1)[0]):
        return "pipedream"
    if not head.lstrip().startswith(b"{"):
        return None
    try:
        d = json.loads(Path(path).read_bytes())
    except (ValueError, OSError, RecursionError):
        return None
    if not isinstance(d, dict):
        return None
    fmt = d.get("format")
    if isinstance(fmt, str) and fmt.startswith("gpp-"):
        return fmt
    nodes = d.get("nodes")
    if (
        "maxDevices" in d
        or "mbsInBatch" in d
        or (isinstance(nodes, list) and nodes and isinstance(nodes[0], dict) and "TMPCs" in nodes[0])
    ):
        return "piper"
    return None


def wrong_kind_hint(path: str | Path, expected: str) -> str | None:
    """A sentence saying what ``path`` is and what to run instead, when it is not an ``expected``
    document (``gpp-graph/1``, ``gpp-cluster/1``, ``gpp-plan/1``) but a kind we recognise."""
    kind = sniff(path)
    if kind is None or kind == expected:
        return None
    if kind in _HINT:
        return _HINT[kind].format(path=path)
    return f"this is a {kind} document, not a {expected} one"


def load_expecting(path: str | Path, expected: str, loader: Callable[[str | Path], T]) -> T:
    """``loader(path)``; when it fails on a file of another kind we recognise, the error says what
    the file is and what to run instead (:func:`wrong_kind_hint`)."""
    try:
        return loader(path)
    except InvalidInputError as exc:
        hint = wrong_kind_hint(path, expected)
        if hint is None:
            raise
        raise type(exc)(f"{path}: {hint}") from None
