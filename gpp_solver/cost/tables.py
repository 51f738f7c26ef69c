"""Vectorised node times (:class:`CostTables`) for the planners that price many candidate stages."""

from __future__ import annotations

import numpy as np

from gpp_solver.cost.model import interpolate
from gpp_solver.types import Graph


class CostTables:
    """Vectorised node times for planners that evaluate many candidate stages.

    ``compute_prefix(x)`` gives prefix sums of ``f + g`` at ``x`` samples over ``order`` so a
    contiguous range of nodes costs O(1).
    """

    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        self.op_fw, self.op_bw = graph.op_overhead
        self.sizes = np.asarray(graph.micro_batch_sizes, dtype=float)
        self.fw = np.asarray([n.fw_time for n in graph.nodes], dtype=float)
        self.bw = np.asarray([n.bw_time for n in graph.nodes], dtype=float)
        self.weight = np.asarray([n.weight_bytes for n in graph.nodes], dtype=float)
        self.activation = np.asarray([n.activation_bytes for n in graph.nodes], dtype=float)
        self._at: dict[float, np.ndarray] = {}
        self._fg: dict[float, tuple[np.ndarray, np.ndarray]] = {}

    def fw_bw_at(self, x: float) -> tuple[np.ndarray, np.ndarray]:
        """``(f_v(x), g_v(x))`` for every node (graph order), by :func:`interpolate`, each with the
        graph's ``op_overhead``."""
        r = self._fg.get(x)
        if r is None:
            sizes = self.graph.micro_batch_sizes
            f = interpolate(lambda i: self.fw[:, i], sizes, x)
            g = interpolate(lambda i: self.bw[:, i], sizes, x)
            if self.op_fw or self.op_bw:  # the graph's per-node dispatch (TimeTerms)
                f, g = f + self.op_fw, g + self.op_bw
            r = self._fg[x] = (f, g)
        return r

    def compute_at(self, x: float) -> np.ndarray:
        """``f_v(x) + g_v(x)`` for every node (graph order)."""
        r = self._at.get(x)
        if r is None:
            f, g = self.fw_bw_at(x)
            r = self._at[x] = f + g
        return r
