"""Series-parallel decomposition of an operator DAG (GraphPipe §5, "Series-parallel decomposition").

The tree is *vertex* series-parallel over the graph's reachability order, which is what operator
graphs need (a stage is a set of operators, not of edges):

* ``Leaf(node)`` — one operator;
* ``Series(children)`` — blocks where every node of block ``i`` precedes (is an ancestor of) every
  node of block ``i+1``; no child is itself a ``Series`` (they are flattened);
* ``Parallel(children)`` — blocks with no path between any two of them; no child is a ``Parallel``.

A graph with several sources or sinks needs no virtual terminal here: its first (last) series
block is simply a ``Parallel`` of the branches, so the tree, and every plan built from it, only
ever holds real operators (GraphPipe's two-terminal form adds a virtual source/sink for the same
purpose; vertex-SP makes it unnecessary).

**Algorithm** (``decompose``), for a node set ``S`` (always convex: a path between two of its
nodes stays inside it), on a boolean reachability matrix and, per member, its numbers of
descendants and ancestors inside ``S``:

1. ``|S| = 1`` → ``Leaf``.
2. Several comparability components (weakly connected pieces of ``S``'s reachability) →
   ``Parallel`` of them.
3. Otherwise scan one fixed topological order of ``S``: the cut after position ``i`` is a series
   cut iff every node of the prefix reaches every node of the suffix; every valid cut of ``S`` is
   such a prefix in *any* topological order, so all are found.  Series cuts found → ``Series`` of
   the blocks between them.
4. No cut and no parallel split: ``S`` is not series-parallel (it contains an "N").
   **SP-ization**: take the topological-prefix cut that is missing the fewest reachability pairs
   (ties: the most balanced, then the earliest) and *add* those pairs (every prefix node now
   precedes every suffix node).  Dependencies are only ever added, so reachability of the original
   graph ⊆ reachability of the SP-ized one; any stage partition that is convex with an acyclic
   stage graph for the SP-ized order is so for the original graph too (adding dependencies only
   restricts).  The added pairs are reported in :attr:`SPDecomposition.added_pairs`.

The missing pairs of every prefix cut come from one cumulative sum of the members' in-set
descendant and ancestor counts (a series cut is a cut missing none); the counts pass to the
blocks by subtraction (for a forced cut, of the prefix x suffix reachability block, which no
other cut of the recursion looks at again), and the components follow from the small table of
which sources reach which sinks.  Each set costs ``O(|S|)`` vector operations plus its forced
cut's block: ``O(n^2)`` in all (NASNet-A, 1,251 operators, in about half a second).
"""

from __future__ import annotations

import heapq
from collections.abc import Generator, Hashable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import networkx as nx
import numpy as np

from gpp_solver._backend import trampoline
from gpp_solver.errors import InvalidGraphError

__all__ = [
    "Leaf",
    "Series",
    "Parallel",
    "SPNode",
    "SPDecomposition",
    "decompose",
    "leaves",
    "order_pairs",
    "reachability_pairs",
    "describe",
]


@dataclass(frozen=True)
class Leaf:
    """One operator."""

    node: Hashable


@dataclass(frozen=True)
class Series:
    """Blocks in sequence: each node of ``children[i]`` precedes each node of ``children[i+1]``."""

    children: tuple[SPNode, ...]


@dataclass(frozen=True)
class Parallel:
    """Blocks with no dependency between any two of them."""

    children: tuple[SPNode, ...]


SPNode = Leaf | Series | Parallel


@dataclass(frozen=True)
class SPDecomposition:
    """The tree plus what SP-ization added.

    ``forced_cuts``: for each series cut that had to be forced, ``(prefix nodes, suffix nodes,
    missing pairs)``; ``added_pairs`` is the total number of reachability pairs added.
    """

    tree: SPNode
    order: tuple[Hashable, ...]
    forced_cuts: tuple[tuple[tuple[Hashable, ...], tuple[Hashable, ...], int], ...]

    @property
    def added_pairs(self) -> int:
        return sum(c[2] for c in self.forced_cuts)

    @property
    def is_series_parallel(self) -> bool:
        """True when the input needed no added dependency."""
        return not self.forced_cuts


def leaves(tree: SPNode) -> Iterator[Hashable]:
    """Operators of ``tree`` left to right."""
    stack = [tree]
    while stack:
        t = stack.pop()
        if isinstance(t, Leaf):
            yield t.node
        else:
            stack.extend(reversed(t.children))


def order_pairs(tree: SPNode) -> set[tuple[Hashable, Hashable]]:
    """All ``(u, v)`` with ``u`` before ``v`` in the order the tree describes (for tests)."""
    out: set[tuple[Hashable, Hashable]] = set()

    def walk(t: SPNode) -> Generator[tuple, list[Hashable], list[Hashable]]:
        if isinstance(t, Leaf):
            return [t.node]
        parts = []
        for c in t.children:
            parts.append((yield (c,)))
        if isinstance(t, Series):
            for i in range(len(parts)):
                later = [v for p in parts[i + 1 :] for v in p]
                out.update((u, v) for u in parts[i] for v in later)
        return [v for p in parts for v in p]

    trampoline.run(walk, tree)
    return out


def reachability_pairs(g: nx.DiGraph) -> set[tuple[Hashable, Hashable]]:
    """``(u, v)`` for every path ``u -> ... -> v`` of ``g`` (transitive closure)."""
    return {(u, v) for u in g for v in nx.descendants(g, u)}


def _adjacency(graph: Any) -> tuple[tuple[Hashable, ...], dict, dict]:
    """``(topological order, successors, predecessors)``; file order breaks ties."""
    if isinstance(graph, nx.DiGraph):
        ids = tuple(graph.nodes)
        succ = {v: tuple(graph.successors(v)) for v in ids}
        pred = {v: tuple(graph.predecessors(v)) for v in ids}
    elif hasattr(graph, "ids") and hasattr(graph, "succs") and hasattr(graph, "preds"):
        ids = tuple(graph.ids)
        succ = {v: graph.succs(v) for v in ids}
        pred = {v: graph.preds(v) for v in ids}
    else:
        raise InvalidGraphError(f"cannot decompose a {type(graph).__name__}; pass a Graph or a networkx.DiGraph")
    pos = {v: i for i, v in enumerate(ids)}
    indeg = {v: len(pred[v]) for v in ids}
    ready = [pos[v] for v in ids if indeg[v] == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        v = ids[heapq.heappop(ready)]
        order.append(v)
        for w in succ[v]:
            indeg[w] -= 1
            if indeg[w] == 0:
                heapq.heappush(ready, pos[w])
    if len(order) != len(ids):
        g = nx.DiGraph([(u, w) for u in ids for w in succ[u]])
        cyc = nx.find_cycle(g)
        raise InvalidGraphError("graph has a cycle: " + " -> ".join(str(u) for u, _ in cyc))
    return tuple(order), succ, pred


def _weak_labels(k: int, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Per node of ``0..k-1`` the lowest node of its connected component (undirected edges
    ``a[i] - b[i]``): min-label hooking, then pointer jumping to the roots, to a fixed point."""
    lab = np.arange(k)
    while True:
        np.minimum.at(lab, a, lab[b])
        np.minimum.at(lab, b, lab[a])
        while True:
            nxt = lab[lab]
            if (nxt == lab).all():
                break
            lab = nxt
        if (lab[a] == lab[b]).all():
            return lab


def decompose(graph: Any) -> SPDecomposition:
    """Series-parallel tree of ``graph`` (a :class:`~gpp_solver.types.Graph` or a DiGraph).

    >>> g = nx.DiGraph([("a", "b"), ("a", "c"), ("b", "d"), ("c", "d")])
    >>> decompose(g).tree == Series((Leaf("a"), Parallel((Leaf("b"), Leaf("c"))), Leaf("d")))
    True
    """
    order, succ, pred = _adjacency(graph)
    n = len(order)
    if n == 0:
        raise InvalidGraphError("cannot decompose an empty graph")
    d = _Decomposer(order, succ)
    tree = trampoline.run(d.build, np.arange(n, dtype=np.int64), d.reach.sum(axis=1), d.reach.sum(axis=0))
    return SPDecomposition(tree=tree, order=order, forced_cuts=tuple(d.forced))


class _Decomposer:
    """The reachability matrix of the operators (in topological order) and the recursion that
    splits a set of them into series or parallel parts (:meth:`build`), recording forced cuts."""

    def __init__(self, order: list, succ: dict) -> None:
        n = len(order)
        self.order = order
        idx = {v: i for i, v in enumerate(order)}
        # reach[u, v]: a path u -> ... -> v (u != v); rows filled in reverse topological order
        self.reach = reach = np.zeros((n, n), dtype=bool)
        for i in range(n - 1, -1, -1):
            row = reach[i]
            for s in succ[order[i]]:
                j = idx[s]
                np.logical_or(row, reach[j], out=row)
                row[j] = True
        self.forced: list[tuple[tuple[Hashable, ...], tuple[Hashable, ...], int]] = []
        self.names = np.empty(n, dtype=object)  # the operators by index, for fancy indexing
        for i, v in enumerate(order):
            self.names[i] = v

    def components(self, mem: np.ndarray, cd: np.ndarray, ca: np.ndarray) -> np.ndarray | None:
        """``None`` when the set is one comparability component, else per member the lowest
        position of its component.  Every member reaches one of the set's sinks and is reached
        by one of its sources, so two members are in one component iff the sinks below them
        are linked through sources reaching both: the components follow from the (small)
        source x sink reachability table."""
        k = len(mem)
        src, snk = np.flatnonzero(ca == 0), np.flatnonzero(cd == 0)
        reach = self.reach
        table = reach[np.ix_(mem[src], mem[snk])] | (src[:, None] == snk[None, :])
        a, b = np.nonzero(table)
        lab = _weak_labels(len(src) + len(snk), a, b + len(src))[len(src) :]
        if (lab == lab[0]).all():
            return None
        below = reach[np.ix_(mem, mem[snk])]
        below[snk, np.arange(len(snk))] = True
        lab = lab[below.argmax(axis=1)]  # the component of some sink each member reaches
        head = np.full(len(src) + len(snk), k, dtype=np.int64)
        np.minimum.at(head, lab, np.arange(k))
        return head[lab]

    def build(self, mem: np.ndarray, cd: np.ndarray, ca: np.ndarray) -> Generator[tuple, SPNode, SPNode]:
        """``mem``: the set's members ascending (== topological order); ``cd`` / ``ca``: per member
        its number of descendants / ancestors inside the set.  Each part's own tree is a recursive
        call, run by :func:`gpp_solver._backend.trampoline.run` (a forced cut can nest as deep as
        the graph is long)."""
        k = len(mem)
        if k == 1:
            return Leaf(self.order[mem[0]])
        pos = np.arange(k)
        # pairs (prefix member, suffix member) without a path, cut after position i (1..k-1):
        # moving member i into the prefix adds its non-descendants after it and drops its
        # non-ancestors before it
        missing = np.cumsum((k - 1 - pos - cd) - (pos - ca))[: k - 1]
        cuts = np.flatnonzero(missing == 0) + 1
        if not len(cuts):
            if not np.any(cd + ca == k - 1):  # no member comparable to all: maybe split
                lab = self.components(mem, cd, ca)
                if lab is not None:
                    heads = np.flatnonzero(lab == pos)
                    kids = []
                    for h in heads:
                        sel = lab == h
                        kids.append((yield (mem[sel], cd[sel], ca[sel])))
                    return Parallel(tuple(kids))
            blocks = self._forced_cut(mem, cd, ca, missing)
        else:
            bounds = [0, *cuts.tolist(), k]
            # a series cut: every member before it reaches every member after it
            blocks = [(mem[a:b], cd[a:b] - (k - b), ca[a:b] - a) for a, b in zip(bounds, bounds[1:])]
        out: list[SPNode] = []
        for bm, bd, ba in blocks:
            child = yield (bm, bd, ba)
            if isinstance(child, Series):
                out.extend(child.children)
            else:
                out.append(child)
        return Series(tuple(out))

    def _forced_cut(self, mem: np.ndarray, cd: np.ndarray, ca: np.ndarray, missing: np.ndarray) -> list:
        """No series cut and no parallel split: cut where the fewest pairs lack a path, then the most
        balanced, then the earliest; the missing pairs are recorded (``forced_cuts``)."""
        k = len(mem)
        best = int(missing.min())
        cand = np.flatnonzero(missing == best)
        at = int(cand[np.argmin(np.abs(cand + 1 - k / 2))]) + 1
        pre, suf = mem[:at], mem[at:]
        self.forced.append((tuple(self.names[pre].tolist()), tuple(self.names[suf].tolist()), best))
        across = self.reach[np.ix_(pre, suf)]
        return [(pre, cd[:at] - across.sum(axis=1), ca[:at]), (suf, cd[at:], ca[at:] - across.sum(axis=0))]


def describe(tree: SPNode, names: Sequence[str] | None = None) -> str:
    """Compact text form, e.g. ``S(a, P(b, c), d)``."""
    return trampoline.run(_describe, tree)


def _describe(tree: SPNode) -> Generator[tuple, str, str]:
    if isinstance(tree, Leaf):
        return str(tree.node)
    parts = []
    for c in tree.children:
        parts.append((yield (c,)))
    tag = "S" if isinstance(tree, Series) else "P"
    return f"{tag}(" + ", ".join(parts) + ")"
