"""Piper (Tarnawski et al., NeurIPS 2021) as a baseline planner: DP over downsets with data-parallel
degree ``d``, tensor-parallel degree ``t`` from the nodes' TMPCs, the knapsack heuristic for TMPCs
(activation recomputation is a TMPC) and the memory model ``a * ceil(s/d) + b``
(``piper_dp.py``, ``piper_cost.py``, ``piper_knapsack.py``).

Two modes:

* ``mode="piper"`` — Piper's own objective and costs, to reproduce its published figures: ``K`` =
  ``cluster.devices`` (at most ``N * max t``: no plan uses more, ``search.extra["devices_considered"]``), ``M`` = ``cluster.memory_bytes``, bandwidth = ``cluster.inter_node_bandwidth``
  (Piper assumes a flat network), ``N`` = micro-batches per batch = ``mini_batch_size / b'``.
  Graphs imported with ``gpp_solver.formats.importers.import_piper`` keep Piper's raw TMPC figures
  (``time_per_sample`` in the profile's unit, ``memory_b``, ``sync_time_fw`` keyed by the node's
  predecessors, ``sync_time_bw`` by its successors) and they are used as is; other nodes get
  ``p = f(b') + g(b')``, ``a = activation_bytes * b'``, ``b = optimizer_state_factor * weight_bytes``.
  Resync: ``4 (d-1) w / d`` bytes per ``N`` micro-batches.  The objective value is kept in
  ``plan.search.extra["piper_tps"]`` (Piper's units; in the default mode it is the DP's proxy, time
  per micro-batch of ``b'`` samples).
* default (``mode="shared"``) — the same search with the shared cost model's constants (seconds,
  ``c = bytes * b' + latency * bandwidth`` per boundary edge, ring all-reduce ``2 (d-1) w / d``,
  ``a = activation_bytes * b'``, ``b = optimizer_state_factor * weight_bytes``, no TMPC sync costs);
  the plan is priced by ``build_plan``.  If the shared model's memory (Algorithm 2 in-flight counts)
  exceeds the limit, the DP is rerun with a proportionally smaller limit (a few times).  ``b'`` (per
  replica) is the option ``micro_batch_size``, else every profiled size dividing ``B`` is tried and
  the plan with the least TPS (then iteration time) wins.

A Piper stage with ``d`` replicas runs ``d`` micro-batches of ``b'`` samples at once; in a plan that
is a stage with micro-batch ``d * b'`` split over ``d`` replicas (``N % d == 0`` keeps ``B % b == 0``).
Stages get contiguous device ranges in pipeline order.  Status is ``feasible``: the knapsack step is
a heuristic (and in the default mode the DP optimises a proxy of the shared model).  Every returned
plan passes ``validate``; in ``mode="piper"`` a plan that fits Piper's memory model but not the
shared one raises ``InfeasibleError`` naming the shared model's need.  The downsets are counted first
(``max_downsets``, default 20,000: ``SearchSpaceTooLargeError`` past it); ``time_limit`` is checked
between downsets: ``TimeLimitError`` when no per-replica micro-batch size finished, else the best
plan of those that did, with status ``time-limit``.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import replace
from typing import Any

import numpy as np

from gpp_solver.cost.model import node_compute
from gpp_solver.cost.time_terms import TimeTerms
from gpp_solver.errors import GppError, InfeasibleError, InvalidInputError, TimeLimitError
from gpp_solver.plan.build import StageSpec, build_plan
from gpp_solver.plan.validate import validate
from gpp_solver.planners.piper.cost import DegreeOptions, PiperInstance
from gpp_solver.planners.piper.dp import DPResult, enumerate_downsets, run_dp
from gpp_solver.planners.piper.options import DEFAULT_MAX_DOWNSETS, MODES, PiperOptions
from gpp_solver.planners.registry import parse_options
from gpp_solver.types import Cluster, Graph, Plan, SearchInfo, Status

logger = logging.getLogger(__name__)
_RAW = ("time_per_sample", "memory_b", "sync_time_fw", "sync_time_bw")


def _is_native(graph: Graph) -> bool:
    """Every node carries Piper's raw TMPC figures (an ``import_piper`` graph)."""
    return all(n.tmpc and all(all(k in t.extra for k in _RAW) for t in n.tmpc) for n in graph.nodes)


def _options(graph: Graph, cluster: Cluster, v: int, b1: int, mode: str, native: bool) -> dict[int, list[tuple]]:
    """``{t: [(label, p, w, a, b, sync_fw {pred: bytes}, sync_bw {succ: bytes}), ...]}`` of node ``v``."""
    node = graph.nodes[v]
    sizes = graph.micro_batch_sizes
    osf = cluster.optimizer_state_factor
    out: dict[int, list[tuple]] = {}
    if native and mode == "piper":
        for idx, t in enumerate(node.tmpc):
            x = t.extra
            out.setdefault(t.t, []).append(
                (
                    idx,
                    float(x["time_per_sample"]),
                    t.weight_bytes,
                    t.activation_bytes,
                    float(x["memory_b"]),
                    dict(x["sync_time_fw"]),
                    dict(x["sync_time_bw"]),
                )
            )
        return out

    overhead = TimeTerms.of(graph).node_overhead
    # the resync term is priced at the instance's bandwidth: weights scaled so that it runs at the
    # cluster's all-reduce bandwidth when it has one (a factor of exactly 1 otherwise)
    p2p = cluster.inter_node_bandwidth
    ar_scale = p2p / cluster.collective_bandwidth(p2p)

    def derived(label, fw, bw, wb, ab):
        p = node_compute(fw, bw, sizes, b1, overhead)
        return (label, p, wb * ar_scale if ar_scale != 1.0 else wb, ab * b1, osf * wb, {}, {})

    seen: dict[int, set] = {1: {(node.fw_time, node.bw_time, node.weight_bytes, node.activation_bytes)}}
    out[1] = [derived(-1, node.fw_time, node.bw_time, node.weight_bytes, node.activation_bytes)]
    for idx, t in enumerate(node.tmpc):
        key = (t.fw_time, t.bw_time, t.weight_bytes, t.activation_bytes)
        if key in seen.setdefault(t.t, set()):
            continue
        seen[t.t].add(key)
        out.setdefault(t.t, []).append(derived(idx, t.fw_time, t.bw_time, t.weight_bytes, t.activation_bytes))
    return out


def build_instance(
    graph: Graph,
    cluster: Cluster,
    mini_batch_size: int,
    *,
    mode: str = "shared",
    micro_batch_size: int = 1,
    memory: float | None = None,
) -> PiperInstance:
    """Piper's input (``PiperInstance``) for ``graph`` on ``cluster`` (see the module docstring)."""
    if mode not in MODES:
        raise InvalidInputError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
    b1 = micro_batch_size
    if b1 < 1 or mini_batch_size % b1:
        raise InvalidInputError(f"`B % b' == 0` must hold, but got (B={mini_batch_size}, b'={b1})")
    native = _is_native(graph)
    n, idx = len(graph.nodes), graph.index
    edges = list(graph.edge_bytes_map.items())
    src = np.array([idx[u] for (u, _), _ in edges], dtype=int)
    dst = np.array([idx[v] for (_, v), _ in edges], dtype=int)
    nbytes = np.array([x for _, x in edges], dtype=float)
    bw = cluster.inter_node_bandwidth
    if mode == "piper" and native:
        c = nbytes
    else:
        c = nbytes * b1 + (cluster.latency * bw if mode == "shared" else 0.0)
    opts = [_options(graph, cluster, v, b1, mode, native) for v in range(n)]
    in_edges: list[list[int]] = [[] for _ in range(n)]
    out_edges: list[list[int]] = [[] for _ in range(n)]
    for j in range(len(edges)):
        in_edges[dst[j]].append(j)
        out_edges[src[j]].append(j)
    degrees = []
    for t in sorted({t for o in opts for t in o}):
        if t > cluster.devices:
            continue
        L = max(len(o.get(t, [])) for o in opts)
        arr = {k: np.zeros((n, L)) for k in ("p", "w", "a", "b")}
        avail = np.zeros((n, L), dtype=bool)
        label = np.full((n, L), -2, dtype=int)
        sfw, sbw = np.zeros((len(edges), L)), np.zeros((len(edges), L))
        for v, o in enumerate(opts):
            for l, (lab, p, w, a, b, sf, sb) in enumerate(o.get(t, [])):
                arr["p"][v, l], arr["w"][v, l], arr["a"][v, l], arr["b"][v, l] = p, w, a, b
                avail[v, l], label[v, l] = True, lab
                for j in in_edges[v]:
                    sfw[j, l] = sf.get(edges[j][0][0], 0.0)
                for j in out_edges[v]:
                    sbw[j, l] = sb.get(edges[j][0][1], 0.0)
        degrees.append(DegreeOptions(t, arr["p"], arr["w"], arr["a"], arr["b"], avail, label, sfw, sbw))
    # the data-parallel degrees sum to at most N and each stage has d * t devices: no plan uses more
    # than N * max t devices, so a larger cluster gives the same tables on that many (same bound_s)
    N = mini_batch_size // b1
    usable = min(cluster.devices, N * max((o.t for o in degrees), default=1))
    return PiperInstance(
        n=n,
        src=src,
        dst=dst,
        c=c,
        degrees=tuple(degrees),
        devices=usable,
        memory=cluster.memory_bytes if memory is None else memory,
        bandwidth=bw,
        micro_batches=N,
        resync_factor=4.0 if mode == "piper" else 2.0,
    )


def count_downsets(graph: Graph, max_downsets: int = DEFAULT_MAX_DOWNSETS) -> list[int]:
    """Downsets of ``graph`` as bit masks over ``graph.nodes`` (refuses past ``max_downsets``)."""
    idx = graph.index
    succ = [0] * len(graph.nodes)
    for e in graph.edges:
        succ[idx[e.src]] |= 1 << idx[e.dst]
    return enumerate_downsets(len(graph.nodes), succ, max_downsets)


def _specs(graph: Graph, res: DPResult, b1: int) -> list[StageSpec]:
    specs, off = [], 0
    for st in res.stages:
        ndev = st.d * st.t
        tm = {graph.nodes[v].id: lab for v, lab in zip(st.nodes, st.slots) if lab >= 0}
        specs.append(
            StageSpec(
                nodes=tuple(graph.nodes[v].id for v in st.nodes),
                devices=tuple(range(off, off + ndev)),
                micro_batch_size=st.d * b1,
                tensor_parallel=st.t,
                tmpc=tm or None,
            )
        )
        off += ndev
    return specs


def plan_piper(
    graph: Graph,
    cluster: Cluster,
    mini_batch_size: int,
    *,
    time_limit: float | None = None,
    progress: bool = False,
    **options: Any,
) -> Plan:
    """Plan with Piper's DP (see the module docstring); raises ``SearchSpaceTooLargeError`` past
    ``max_downsets`` downsets and ``InfeasibleError`` when nothing fits, with a memory that was checked
    by re-planning with it (Piper's own memory model can understate the shared one's); ``options``
    are the fields of :class:`PiperOptions`."""
    o = parse_options("piper", PiperOptions, options)
    start = time.monotonic()
    try:
        return _plan_piper(graph, cluster, mini_batch_size, o, time_limit=time_limit, progress=progress)
    except InfeasibleError as exc:
        need, mem = exc.required_memory_bytes, None
        for _ in range(4):  # re-plan with the memory named until a plan fits (or time runs out)
            left = None if time_limit is None else time_limit - (time.monotonic() - start)
            if need is None or not math.isfinite(need) or (left is not None and left <= 0):
                break
            try:
                _plan_piper(
                    graph, cluster.with_(memory_bytes=float(math.ceil(need))), mini_batch_size, o, time_limit=left
                )
                mem = float(math.ceil(need))
                break
            except InfeasibleError as again:
                if again.required_memory_bytes is None or again.required_memory_bytes <= need:
                    break
                need = again.required_memory_bytes
            except GppError:
                break
        note = (
            f"; re-planned with {mem:.0f} bytes per device, Piper finds a plan that fits"
            if mem is not None
            else "; that memory was not confirmed by re-planning (time limit or no convergence)"
        )
        raise InfeasibleError(f"{exc}{note}", required_memory_bytes=need) from None


def _plan_piper(
    graph: Graph,
    cluster: Cluster,
    mini_batch_size: int,
    o: PiperOptions,
    *,
    time_limit: float | None = None,
    progress: bool = False,
) -> Plan:
    max_downsets, mode, micro_batch_size = o.max_downsets, o.mode, o.micro_batch_size
    start = time.monotonic()
    deadline = None if time_limit is None else start + time_limit
    downsets = count_downsets(graph, max_downsets)
    if micro_batch_size is not None:
        candidates = [micro_batch_size]
    elif mode == "piper":
        candidates = [1]
    else:
        candidates = [b for b in graph.micro_batch_sizes if mini_batch_size % b == 0] or [1]
    best: tuple[tuple[float, float], Plan] | None = None
    overshoot = math.inf  # least shared-model memory of a plan Piper's model accepted
    for b1 in candidates:
        try:
            plan, peak = _plan_for(graph, cluster, mini_batch_size, b1, mode, downsets, deadline, progress, start)
        except TimeLimitError:
            if best is None:
                raise
            p = best[1]  # the sizes searched so far: their best plan, not proven the best of all
            return replace(
                p,
                search=replace(
                    p.search,
                    status=Status.TIME_LIMIT,
                    seconds=time.monotonic() - start,
                    extra={**p.search.extra, "micro_batch_sizes_unfinished": candidates[candidates.index(b1) :]},
                ),
            )
        overshoot = min(overshoot, peak)
        if plan is None:
            continue
        key = (plan.predicted.time_per_sample, plan.predicted.iteration_time)
        if best is None or key < best[0]:
            best = (key, plan)
    if best is None and math.isfinite(overshoot):
        raise InfeasibleError(
            f"Piper's plans for graph '{graph.name}' fit its own memory model but the shared cost model needs "
            f"{overshoot:.6g} bytes per device (limit {cluster.memory_bytes:.6g})",
            required_memory_bytes=overshoot,
        )
    if best is None:
        b1 = min(candidates)
        inst = build_instance(graph, cluster, mini_batch_size, mode=mode, micro_batch_size=b1)
        need = run_dp(inst, downsets, objective="memory", deadline=deadline).value
        if not np.isfinite(need):
            raise InfeasibleError(
                f"Piper finds no plan for graph '{graph.name}' on {cluster.devices} devices "
                f"(some node has no TMPC usable on them)"
            )
        raise InfeasibleError(
            f"Piper finds no plan for graph '{graph.name}' within {cluster.memory_bytes:.6g} bytes "
            f"per device; its memory model needs at least {need:.6g} bytes (b'={b1})",
            required_memory_bytes=float(need),
        )
    return best[1]


def _plan_for(graph, cluster, B, b1, mode, downsets, deadline, progress, start) -> tuple[Plan | None, float]:
    """The plan for per-replica micro-batch ``b1`` (or None) and the least shared-model peak memory
    of a DP answer that did not fit (inf if none).  The default mode reruns the DP with a smaller
    limit (up to 5 times) when the shared model's memory exceeds the cluster's."""
    memory, peak_seen = cluster.memory_bytes, math.inf
    for attempt in range(1 if mode == "piper" else 5):
        inst = build_instance(graph, cluster, B, mode=mode, micro_batch_size=b1, memory=memory)
        res = run_dp(inst, downsets, deadline=deadline, progress=progress)
        if not np.isfinite(res.value):
            return None, peak_seen
        extra = {
            "mode": mode,
            "piper_tps": res.value,
            "micro_batch_size_per_replica": b1,
            "downsets": res.downsets,
            "downset_pairs": res.pairs,
            "devices_used": res.devices,
            "devices_considered": inst.devices,
            "sum_data_parallel": res.s,
            "dp_memory_limit": memory,
            "dp_runs": attempt + 1,
        }
        plan = build_plan(
            graph,
            cluster,
            _specs(graph, res, b1),
            B,
            planner="piper",
            search=SearchInfo(time.monotonic() - start, Status.FEASIBLE, None, extra),
        )
        peak = plan.predicted.peak_memory_bytes
        if peak <= cluster.memory_bytes * (1 + 1e-9):
            validate(plan, graph, cluster)
            return plan, peak_seen
        peak_seen = min(peak_seen, peak)
        logger.info("piper: shared-model memory %.4g > %.4g (b'=%d)", peak, cluster.memory_bytes, b1)
        memory *= cluster.memory_bytes / peak * (1 - 1e-6)
    return None, peak_seen
