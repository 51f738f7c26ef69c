"""Linearise a DAG into a chain of *states* for sequential-pipeline planners (PipeDream, Alpa, 2BW).

A state is a *downset* of the graph (a set of nodes closed under predecessors); a stage of a
sequential pipeline is the difference of two nested states, so a chain of nested states is a
sequential pipeline whose every stage is convex.

Two linearisations:

- **antichain** — PipeDream's ``Graph.antichain_dag()`` (msr-fiddle/pipedream, ``graph/graph.py``):
  a state is identified by its antichain of maximal nodes (PipeDream stores the "augmented"
  antichain, whose downset is the same).  From a state ``D`` PipeDream moves to ``D ∪ down(y)``
  for every successor ``y`` of a node of ``D`` that is not yet in ``D`` (its ``next_antichains``
  replaces one node of the augmented antichain by a successor whose own successors are not in
  it, then keeps the maximal nodes: that is exactly ``D ∪ down(y)``).  PipeDream starts from the
  antichain ``[first source]``; :func:`antichain_states` can do the same (``first_source=True``)
  or start from the empty set with every source addable (a virtual source), which enumerates every
  downset of the graph.  The number of states grows with the graph's width (product of branch
  lengths inside a parallel block); ``max_states`` bounds it.
- **topological** — the prefixes of one topological order (``Graph.topo_order``): ``n + 1`` states,
  always small, but only cuts that respect that one order.

States are Python ``int`` bit masks over :attr:`Linearization.order`; ``states[0]`` is the empty
set and ``states[-1]`` the full node set; every state comes after all its subsets.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from gpp_solver.types import Graph

logger = logging.getLogger(__name__)

DEFAULT_MAX_STATES = 2048


@dataclass(frozen=True)
class Linearization:
    """A chain-able family of downsets of (part of) a graph."""

    order: tuple[str, ...]  # node ids in topological order; bit i of a state = order[i]
    states: tuple[int, ...]  # downset bit masks; states[0] == 0, states[-1] == all bits
    kind: str  # "antichain" or "topological"

    @property
    def n_states(self) -> int:
        return len(self.states)

    def members(self, state: int) -> list[str]:
        """Node ids of a state's mask, in topological order."""
        return [v for i, v in enumerate(self.order) if state >> i & 1]

    def stage_nodes(self, k: int, j: int) -> list[str]:
        """Nodes of the stage between state indices ``k`` (exclusive) and ``j`` (inclusive)."""
        return self.members(self.states[j] & ~self.states[k])

    @cached_property
    def incidence(self) -> np.ndarray:
        """``S x n`` float matrix: 1 where node ``i`` is in state ``s``."""
        m = np.zeros((len(self.states), len(self.order)), dtype=np.float64)
        for s, mask in enumerate(self.states):
            bits = [i for i in range(len(self.order)) if mask >> i & 1]
            m[s, bits] = 1.0
        return m

    def state_sums(self, values: Sequence[float] | np.ndarray) -> np.ndarray:
        """For every state, the sum of a per-node quantity (``values`` in :attr:`order`)."""
        return self.incidence @ np.asarray(values, dtype=np.float64)

    @cached_property
    def subset(self) -> np.ndarray:
        """``S x S`` bool: ``subset[k, j]`` when state ``k`` is a strict subset of state ``j``."""
        inc = self.incidence
        outside = inc @ (1.0 - inc).T  # |k \ j|
        sizes = inc.sum(axis=1)
        return (outside < 0.5) & (sizes[:, None] < sizes[None, :])

    def cut_bytes(self, graph: Graph) -> tuple[np.ndarray, np.ndarray]:
        """For every state ``D``: (bytes per sample, number of producers) of the transfers that
        leave ``D`` — one per producer ``u`` in ``D`` with a consumer outside, of the largest bytes
        among those edges (PipeDream's ``output_activation_size`` of a state, per producer)."""
        pos = {v: i for i, v in enumerate(self.order)}
        out_edges: dict[int, list[tuple[int, float]]] = {}
        for (u, v), nbytes in graph.edge_bytes_map.items():
            if u in pos and v in pos:
                out_edges.setdefault(pos[u], []).append((pos[v], nbytes))
        nbytes_arr = np.zeros(len(self.states))
        count_arr = np.zeros(len(self.states))
        for s, mask in enumerate(self.states):
            tot = cnt = 0.0
            for u, outs in out_edges.items():
                if mask >> u & 1:
                    leaving = [b for v, b in outs if not mask >> v & 1]
                    if leaving:
                        tot += max(leaving)
                        cnt += 1
            nbytes_arr[s], count_arr[s] = tot, cnt
        return nbytes_arr, count_arr

    def range_transfers(self, graph: Graph) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """For every range ``(k, j]`` (states ``k`` ⊂ ``j``) the shared model's transfers of the stage
        ``j \\ k``, as ``S x S`` arrays ``(in_bytes, in_count, out_bytes, out_count)`` (bytes per sample):

        - *in*: one transfer per producer ``u`` in ``k`` with a consumer in ``j \\ k``, of the
          largest bytes among those edges — exact, whatever the other stages are;
        - *out*: one transfer per producer ``u`` in ``j \\ k`` with a consumer outside ``j``, of the
          largest bytes among those edges — exact when ``u``'s consumers outside ``j`` lie in one
          later stage, else a lower bound (the shared model then counts one transfer per
          consumer stage).  Entries for ranges that are not ``k`` ⊂ ``j`` are meaningless.

        Computed once per graph (the DP asks again for every micro-batch size: 0.5 s each at 1,400
        states); the arrays returned are shared, so read-only."""
        memo = self.__dict__.get("_range_transfers")
        if memo is not None and memo[0] is graph:
            return memo[1]
        out = self._range_transfers(graph)
        for a in out:
            a.flags.writeable = False
        self.__dict__["_range_transfers"] = (graph, out)  # a cache beside the frozen fields
        return out

    def _range_transfers(self, graph: Graph) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        pos = {v: i for i, v in enumerate(self.order)}
        inc = self.incidence.astype(bool)  # S x n
        S, n = inc.shape
        cons: dict[int, list[tuple[float, int]]] = {}
        for (u, v), nbytes in graph.edge_bytes_map.items():
            if u in pos and v in pos:
                cons.setdefault(pos[u], []).append((float(nbytes), pos[v]))
        in_b, in_c = np.zeros((S, S)), np.zeros((S, S))
        P_b, P_c = np.zeros((n, S)), np.zeros((n, S))  # producer u's largest edge leaving state j
        prefixes = all(m == (1 << s) - 1 for s, m in enumerate(self.states))
        for u, outs in cons.items():
            outs.sort(key=lambda t: -t[0])
            u_in = inc[:, u]
            left = np.zeros(S, dtype=bool)
            for nbytes, v in outs:  # largest edge first: it sets the max
                gone = u_in & ~inc[:, v] & ~left  # u in j, v outside j
                P_b[u] += nbytes * gone
                P_c[u] += gone
                left |= gone
            block, most, entered = (_prefix_block if prefixes else _state_block)(inc, u, outs)
            if entered.size:
                in_b[block] += most
                in_c[block] += entered
        notk = 1.0 - inc.astype(np.float64)  # u not in k
        out_b = notk @ P_b
        out_c = notk @ P_c
        return in_b, in_c, out_b, out_c


def _state_block(inc: np.ndarray, u: int, outs: list[tuple[float, int]]) -> tuple:
    """The ranges ``(k, j]`` producer ``u``'s edges ``outs`` (largest first) enter, as a block of the
    ``S x S`` arrays (``k`` holds ``u`` and misses one of its consumers, ``j`` holds one): its index,
    the largest bytes of an edge into each range and where one enters."""
    ks = np.flatnonzero(inc[:, u] & ~np.logical_and.reduce([inc[:, v] for _, v in outs]))
    js = np.flatnonzero(np.logical_or.reduce([inc[:, v] for _, v in outs]))
    entered = np.zeros((len(ks), len(js)), dtype=bool)
    most = np.zeros(entered.shape)
    for nbytes, v in outs:  # largest edge first: it sets the max
        new = ~inc[ks, v][:, None] & inc[js, v][None, :] & ~entered  # u in k, v in j \ k
        most += nbytes * new
        entered |= new
    return np.ix_(ks, js), most, entered


def _prefix_block(inc: np.ndarray, u: int, outs: list[tuple[float, int]]) -> tuple:
    """:func:`_state_block` where state ``s`` is the first ``s`` nodes of the order: consumer ``v``
    is in ``j \\ k`` for ``k <= v < j``, so each row's largest edge is a running max along ``j``
    (an edge's span of rows, not a pass over the block per edge)."""
    S = inc.shape[0]
    last = max(v for _, v in outs)
    first = min(v for _, v in outs)
    most = np.full((last - u, S - first - 1), -np.inf)  # rows k = u+1..last, columns j = first+1..S-1
    for nbytes, v in outs:
        col = most[: v - u, v - first]
        np.maximum(col, nbytes, out=col)
    np.maximum.accumulate(most, axis=1, out=most)
    entered = most > -np.inf
    most[~entered] = 0.0
    return (slice(u + 1, last + 1), slice(first + 1, S)), most, entered


def _order(graph: Graph, nodes: Iterable[str] | None) -> tuple[str, ...]:
    keep = set(graph.ids if nodes is None else nodes)
    return tuple(v for v in graph.topo_order if v in keep)


def _masks(graph: Graph, order: Sequence[str]) -> tuple[list[int], list[int]]:
    """Ancestor (incl. self) and direct-successor masks within the induced subgraph on ``order``."""
    pos = {v: i for i, v in enumerate(order)}
    anc = [0] * len(order)
    succ = [0] * len(order)
    for i, v in enumerate(order):
        m = 1 << i
        for p in graph.preds(v):
            if p in pos:
                m |= anc[pos[p]]
        anc[i] = m
        for s in graph.succs(v):
            if s in pos:
                succ[i] |= 1 << pos[s]
    return anc, succ


def antichain_states(
    graph: Graph,
    *,
    nodes: Iterable[str] | None = None,
    first_source: bool = False,
    max_states: int | None = DEFAULT_MAX_STATES,
) -> Linearization | None:
    """PipeDream's antichain DAG as downsets, or ``None`` when more than ``max_states`` exist.

    ``nodes`` restricts to an induced subgraph (PipeDream drops ``Input`` sources first).
    ``first_source=True`` starts, as PipeDream does, from the first source in the graph's node
    order; otherwise from the empty set with every source addable.
    """
    order = _order(graph, nodes)
    pos = {v: i for i, v in enumerate(order)}
    anc, succ = _masks(graph, order)
    sources = [i for i in range(len(order)) if anc[i] == 1 << i]
    full = (1 << len(order)) - 1
    if first_source:
        first = next(pos[v] for v in graph.ids if v in pos and anc[pos[v]] == 1 << pos[v])
        start = anc[first]
        extra = 0
    else:
        start = 0
        extra = 0
        for i in sources:
            extra |= 1 << i
    seen = {0, start}
    queue = [start]
    head = 0
    while head < len(queue):
        d = queue[head]
        head += 1
        frontier = extra
        m, i = d, 0
        while m:
            if m & 1:
                frontier |= succ[i]
            m >>= 1
            i += 1
        frontier &= ~d
        i = 0
        while frontier:
            if frontier & 1:
                nd = d | anc[i]
                if nd not in seen:
                    seen.add(nd)
                    queue.append(nd)
                    if max_states is not None and len(seen) > max_states:
                        return None
            frontier >>= 1
            i += 1
    if full not in seen:  # cannot happen for a connected graph; keep the chain well formed
        seen.add(full)
    states = sorted(seen, key=lambda s: (bin(s).count("1"), s))
    return Linearization(order=order, states=tuple(states), kind="antichain")


def topological_states(graph: Graph, *, nodes: Iterable[str] | None = None) -> Linearization:
    """The ``n + 1`` prefixes of the graph's deterministic topological order."""
    order = _order(graph, nodes)
    return Linearization(order=order, states=tuple((1 << i) - 1 for i in range(len(order) + 1)), kind="topological")


def linearize(
    graph: Graph,
    *,
    method: str = "antichain",
    nodes: Iterable[str] | None = None,
    first_source: bool = False,
    max_states: int | None = DEFAULT_MAX_STATES,
) -> Linearization:
    """Antichain states when there are at most ``max_states`` of them, else (with a logged
    warning) the topological-order prefixes.  ``method="topological"`` skips the enumeration."""
    if method not in ("antichain", "topological"):
        raise ValueError(f"method must be 'antichain' or 'topological', got {method!r}")
    if method == "antichain":
        lin = antichain_states(graph, nodes=nodes, first_source=first_source, max_states=max_states)
        if lin is not None:
            return lin
        logger.info(
            "graph '%s': more than %d antichain states; falling back to the prefixes of one "
            "topological order (fewer candidate cuts)",
            graph.name,
            max_states,
        )
    return topological_states(graph, nodes=nodes)
