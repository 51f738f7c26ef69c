"""Importers of published profiles into gpp-graph/1 graphs.

- :func:`import_pipedream` — PipeDream's profiler output ``graph.txt`` (see ``pipedream.py``);
- :func:`import_piper` — Piper's planner input JSON (see ``piper.py``).

Each module's docstring states what every imported quantity becomes and why; each also exposes the
plain-dict builder (``pipedream_dict``, ``piper_dict``).
"""

from __future__ import annotations

from gpp_solver.formats.pipedream import import_pipedream, pipedream_dict
from gpp_solver.formats.piper import import_piper, piper_dict

IMPORTERS = {"pipedream": import_pipedream, "piper": import_piper}

__all__ = ["IMPORTERS", "import_pipedream", "import_piper", "pipedream_dict", "piper_dict"]
