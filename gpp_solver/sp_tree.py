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

**Algorithm** (``decompose``), on bitsets of descendants (Python ints), for a node set ``S``:

1. ``|S| = 1`` → ``Leaf``.
2. Several comparability components (weakly connected pieces of ``S``'s reachability) →
   ``Parallel`` of them.
3. Otherwise scan one fixed topological order of ``S``: the cut after position ``i`` is a series
   cut iff every node of the prefix reaches every node of the suffix (a running AND of descendant
   sets); every valid cut of ``S`` is such a prefix in *any* topological order, so all are found.
   Series cuts found → ``Series`` of the blocks between them.
4. No cut and no parallel split: ``S`` is not series-parallel (it contains an "N").
   **SP-ization**: take the topological-prefix cut that is missing the fewest reachability pairs
   (ties: the most balanced, then the earliest) and *add* those pairs (every prefix node now
   precedes every suffix node).  Dependencies are only ever added, so reachability of the original
   graph ⊆ reachability of the SP-ized one; any stage partition that is convex with an acyclic
   stage graph for the SP-ized order is so for the original graph too (adding dependencies only
   restricts).  Cost: ``O(|S|^2)`` popcounts for that set, and the added pairs are reported in
   :attr:`SPDecomposition.added_pairs`.

Every step costs ``O(|S|)`` operations on ``n``-bit integers; the whole decomposition is
``O(n^2)`` big-int operations (a few milliseconds for a few hundred operators).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Any, Hashable, Iterator, Sequence, Union

import networkx as nx

from gpp_solver.errors import InvalidGraphError

__all__ = ["Leaf", "Series", "Parallel", "SPNode", "SPDecomposition", "decompose", "leaves",
           "order_pairs", "reachability_pairs", "describe"]


@dataclass(frozen=True)
class Leaf:
    """One operator."""

    node: Hashable


@dataclass(frozen=True)
class Series:
    """Blocks in sequence: each node of ``children[i]`` precedes each node of ``children[i+1]``."""

    children: tuple["SPNode", ...]


@dataclass(frozen=True)
class Parallel:
    """Blocks with no dependency between any two of them."""

    children: tuple["SPNode", ...]


SPNode = Union[Leaf, Series, Parallel]


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

    def walk(t: SPNode) -> list[Hashable]:
        if isinstance(t, Leaf):
            return [t.node]
        parts = [walk(c) for c in t.children]
        if isinstance(t, Series):
            for i in range(len(parts)):
                later = [v for p in parts[i + 1:] for v in p]
                out.update((u, v) for u in parts[i] for v in later)
        return [v for p in parts for v in p]

    walk(tree)
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
    idx = {v: i for i, v in enumerate(order)}
    desc = [0] * n
    anc = [0] * n
    for i in range(n - 1, -1, -1):
        m = 0
        for s in succ[order[i]]:
            j = idx[s]
            m |= desc[j] | (1 << j)
        desc[i] = m
    for i in range(n):
        m = 0
        for p in pred[order[i]]:
            j = idx[p]
            m |= anc[j] | (1 << j)
        anc[i] = m
    forced: list[tuple[tuple[Hashable, ...], tuple[Hashable, ...], int]] = []

    def members(mask: int) -> list[int]:
        out = []
        while mask:
            low = mask & -mask
            out.append(low.bit_length() - 1)
            mask ^= low
        return out

    def components(mask: int, mem: list[int]) -> list[int]:
        comps = []
        rest = mask
        while rest:
            seed = rest & -rest
            comp = seed
            frontier = seed
            while frontier:
                grow = 0
                for i in members(frontier):
                    grow |= (desc[i] | anc[i])
                grow &= mask & ~comp
                comp |= grow
                frontier = grow
            comps.append(comp)
            rest &= ~comp
        return comps

    def series_cuts(mem: list[int], mask: int) -> list[int]:
        """Positions ``i`` (1..len-1) such that mem[:i] all reach mem[i:]."""
        cuts = []
        acc = -1
        suffix = mask
        for i in range(len(mem) - 1):
            v = mem[i]
            acc &= desc[v]
            suffix &= ~(1 << v)
            if acc & suffix == suffix:
                cuts.append(i + 1)
        return cuts

    def forced_cut(mem: list[int], mask: int) -> tuple[int, int]:
        """The series cut adding the fewest reachability pairs (ties: the most balanced, then the
        earliest) and that count.  ``missing`` is kept incrementally: moving ``v`` from the suffix
        to the prefix drops the prefix members that do not reach ``v`` and adds the suffix
        members ``v`` does not reach (linear in the members, not quadratic per cut)."""
        best = None
        suffix = mask
        pmask = 0
        missing = 0
        half = len(mem) / 2
        for i in range(len(mem) - 1):
            v = mem[i]
            suffix &= ~(1 << v)
            missing += (suffix & ~desc[v]).bit_count() - (i - (anc[v] & pmask).bit_count())
            pmask |= 1 << v
            key = (missing, abs(i + 1 - half), i + 1)
            if best is None or key < best[0]:
                best = (key, i + 1)
        assert best is not None
        return best[1], best[0][0]

    def build(mask: int) -> SPNode:
        mem = members(mask)  # ascending index == topological order
        if len(mem) == 1:
            return Leaf(order[mem[0]])
        comps = components(mask, mem)
        if len(comps) > 1:
            comps.sort(key=lambda c: (c & -c).bit_length())
            return Parallel(tuple(build(c) for c in comps))
        cuts = series_cuts(mem, mask)
        if not cuts:
            at, missing = forced_cut(mem, mask)
            pre, suf = mem[:at], mem[at:]
            forced.append((tuple(order[v] for v in pre), tuple(order[v] for v in suf), missing))
            cuts = [at]
        bounds = [0, *cuts, len(mem)]
        kids: list[SPNode] = []
        for a, b in zip(bounds, bounds[1:]):
            child = build(sum(1 << v for v in mem[a:b]))
            if isinstance(child, Series):
                kids.extend(child.children)
            else:
                kids.append(child)
        return Series(tuple(kids))

    import sys
    limit = sys.getrecursionlimit()
    if limit < 4 * n + 100:
        sys.setrecursionlimit(4 * n + 100)
    try:
        tree = build((1 << n) - 1)
    finally:
        sys.setrecursionlimit(limit)
    return SPDecomposition(tree=tree, order=order, forced_cuts=tuple(forced))


def describe(tree: SPNode, names: Sequence[str] | None = None) -> str:
    """Compact text form, e.g. ``S(a, P(b, c), d)``."""
    if isinstance(tree, Leaf):
        return str(tree.node)
    tag = "S" if isinstance(tree, Series) else "P"
    return f"{tag}(" + ", ".join(describe(c) for c in tree.children) + ")"
