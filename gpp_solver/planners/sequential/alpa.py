"""Alpa's inter-operator stage construction (Zheng et al., OSDI'22, §5.2), data parallel inside a stage.

- Layers: the graph's nodes in topological order (PipeDream's pre-processing of inputs and
  dangling sinks, :mod:`.sequential`); a stage is a contiguous range of that order.
- Device groups ("submeshes", :mod:`.alpa_submeshes`): powers of two up to a node's size, then
  whole nodes (``1, 2, 4, ..., devices_per_node, 2*devices_per_node, ...``); on a flat network
  powers of two.
  A stage on ``s`` devices runs ``s``-way data parallel (``b % s == 0``); Alpa's intra-operator
  sharding is not modelled.  Groups are packed into nodes largest first, so a group no larger
  than a node sits inside one node when the sizes allow it.
- Stage latency ``t = C(b/s) + comm`` per micro-batch (the shared cost model; the transfers are
  those leaving the stage's first and last prefix, one per producer node; intra-node bandwidth
  when the whole cluster is one node, else inter-node).  Objective, Alpa's pipeline latency::

      T* = sum_i t_i + (n_micro - 1) * max_i t_i

  minimised exactly by enumerating the candidate ``t_max`` among the sorted distinct stage
  latencies from the min-max bottleneck upwards: for each, a DP minimises ``sum t_i`` over chains
  with every ``t_i <= t_max`` on at most ``K`` devices; stop once ``(n_micro - 1) * t_max`` reaches
  the best ``T*`` found (no later candidate can beat it).  The gradient all-reduce is not in
  Alpa's latency (the simulator adds it).  Memory: each stage must fit with an upper bound on its
  in-flight samples (1F1B: ``min(n, devices after + 1) * b``).
- The micro-batch size is chosen among the powers of two dividing ``B`` by simulated iteration
  time.  Status ``feasible`` (the DP is exact for its objective, the plan is then re-priced by the
  shared model and ``b`` chosen by simulation); ``time-limit`` when the enumeration was cut short
  (the min-max DP checks the clock at every step; nothing finished: :class:`TimeLimitError`).
  Devices beyond what a chain can use (``core nodes * max b``, :func:`.common.usable_cluster`) are
  not considered (``search.extra["devices_considered"]``).
"""

from __future__ import annotations

import logging
import math
import time as _time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any, NoReturn

import numpy as np

from gpp_solver.cost.model import comm_time, memory_per_device, node_compute
from gpp_solver.cost.time_terms import TimeTerms
from gpp_solver.errors import InfeasibleError, SearchSpaceTooLargeError, TimeLimitError
from gpp_solver.plan.build import build_plan
from gpp_solver.plan.validate import validate
from gpp_solver.planners.registry import parse_options
from gpp_solver.planners.sequential.alpa_submeshes import group_sizes, place_groups
from gpp_solver.planners.sequential.common import (
    attach_detached,
    candidate_micro_batches,
    pipedream_core,
    usable_cluster,
)
from gpp_solver.planners.sequential.linearize import Linearization, topological_states
from gpp_solver.planners.sequential.options import AlpaOptions
from gpp_solver.planners.sequential.pipedream import plan_pipedream
from gpp_solver.planners.sequential.pipedream_dp import INF, DeadlineReached, minmax_dp
from gpp_solver.planners.sequential.seq_eval import SequentialPricer, select_by_simulation
from gpp_solver.types import Cluster, Graph, Plan, SearchInfo, Status

logger = logging.getLogger(__name__)


def _latency_tables(
    graph: Graph, cluster: Cluster, lin: Linearization, B: int, b: int, sizes: list[int]
) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """Per group size: (stage latency ``t[k, j]``, memory without activations / activations)."""
    nodes = [graph.node(v) for v in lin.order]
    W = lin.state_sums([n.weight_bytes for n in nodes])
    A = lin.state_sums([n.activation_bytes for n in nodes])
    cut, cnt = lin.cut_bytes(graph)
    last = lin.n_states - 1
    bw = cluster.bandwidth(range(cluster.devices))
    out = {}
    for s in sizes:
        if b % s:
            continue
        x = b / s
        oh = TimeTerms.of(graph).node_overhead
        per = lin.state_sums([node_compute(n.fw_time, n.bw_time, graph.micro_batch_sizes, x, oh) for n in nodes])
        half = comm_time(cut, x, bw, cluster.latency, cnt)
        h_in, h_out = half.copy(), half.copy()
        h_in[0] = 0.0
        h_out[last] = 0.0
        t = (per[None, :] - per[:, None]) + 2.0 * (h_in[:, None] + h_out[None, :])
        t = np.where(lin.subset, t, INF)
        out[s] = (t, (W[None, :] - W[:, None]), (A[None, :] - A[:, None]))
    return out


def _fits(cluster: Cluster, W: np.ndarray, act: np.ndarray, s: int, b: int, n: int, m: int) -> np.ndarray:
    f = min(n, max(1, cluster.devices - m + 1)) * b
    return memory_per_device(cluster.optimizer_state_factor, W, f, s, act) <= cluster.memory_bytes


def _fit_tables(
    tabs, cluster: Cluster, b: int, n: int, deadline: float | None = None
) -> dict[tuple[int, int], np.ndarray]:
    """``t`` with ``inf`` where the stage does not fit, per (group size, devices through it)."""
    out = {}
    for s, (t, W, act) in tabs.items():
        if deadline is not None and _time.perf_counter() > deadline:
            raise DeadlineReached
        for m in range(s, cluster.devices + 1):
            out[s, m] = np.where(_fits(cluster, W, act, s, b, n, m), t, INF)
    return out


def _sum_dp(
    fit: dict[tuple[int, int], np.ndarray],
    K: int,
    t_max: float,
    S: int,
    by_m: dict[int, tuple[np.ndarray, np.ndarray]] | None = None,
    deadline: float | None = None,
):
    """min sum of latencies over chains (every t <= t_max) per (state, devices); with arg tables.

    ``by_m`` is ``fit`` grouped by devices (:func:`_by_devices`), built when absent.  For each
    ``m`` every group size is tried at once; ties go to the smaller size, then the earlier state."""
    if by_m is None:
        by_m = _by_devices(fit)
    F = np.full((S, K + 1), INF)
    F[0, 0] = 0.0
    ak = np.full((S, K + 1), -1, dtype=np.int64)
    asz = np.zeros((S, K + 1), dtype=np.int64)
    cols = np.arange(S)
    for m in range(1, K + 1):
        if m not in by_m:
            continue
        if deadline is not None and m % 16 == 0 and _time.perf_counter() > deadline:
            raise DeadlineReached
        ss, T = by_m[m]  # (g,), (g, S, S)
        P = F[:, m - ss].T  # (g, S): chains ending at k on m - s devices
        X = np.where(T <= t_max, P[:, :, None] + T, INF).reshape(-1, S)
        idx = X.argmin(axis=0)
        v = X[idx, cols]
        better = v < F[:, m]
        F[better, m] = v[better]
        ak[better, m] = idx[better] % S
        asz[better, m] = ss[idx[better] // S]
    return F, ak, asz


def _by_devices(fit: dict[tuple[int, int], np.ndarray]) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """``{m: (group sizes ascending, stacked tables)}``."""
    groups: dict[int, list[tuple[int, np.ndarray]]] = {}
    for (s, m), t in fit.items():
        groups.setdefault(m, []).append((s, t))
    return {
        m: (
            np.asarray([s for s, _ in sorted(g, key=lambda st: st[0])], dtype=np.int64),
            np.stack([t for _, t in sorted(g, key=lambda st: st[0])]),
        )
        for m, g in groups.items()
    }


def _thin(cands: np.ndarray, limit: int) -> tuple[np.ndarray, float]:
    """At most about ``limit`` candidates: the largest of each geometric bucket (ratio ``1 + eps``)."""
    if cands.size <= limit:
        return cands, 0.0
    eps = (cands[-1] / cands[0]) ** (1.0 / limit) - 1.0 if cands[0] > 0 else 1e-3
    keys = np.floor(np.log(np.maximum(cands, 1e-300) / cands[0]) / np.log1p(eps)).astype(np.int64)
    last_of_bucket = np.r_[keys[1:] != keys[:-1], True]
    return cands[last_of_bucket], float(eps)


def table_bytes(cluster: Cluster, n_states: int) -> int:
    """Bytes of the per-(group size, devices) stage tables of one micro-batch size (two copies)."""
    K = cluster.devices
    return 2 * 8 * n_states * n_states * sum(K - s + 1 for s in group_sizes(cluster))


def _solve(
    graph: Graph, cluster: Cluster, lin: Linearization, B: int, b: int, deadline: float | None, max_candidates: int
):
    """Alpa's enumeration for one micro-batch size: (objective, chain, complete?, eps) or None."""
    n = B // b
    S, last, K = lin.n_states, lin.n_states - 1, cluster.devices
    tabs = _latency_tables(graph, cluster, lin, B, b, group_sizes(cluster))
    if not tabs:
        return None
    fit = _fit_tables(tabs, cluster, b, n, deadline)
    none = np.full((S, S), INF)
    lower_tab = minmax_dp(
        lin.subset, lambda m, r: fit.get((r, m), none), K, allow_fewer=True, replicas=sorted(tabs), deadline=deadline
    )
    by_m = _by_devices(fit)
    lower = float(lower_tab.value[0, last, K])
    if not math.isfinite(lower):
        return None
    cands = np.unique(np.concatenate([t[np.isfinite(t)] for t in fit.values()]))
    cands = cands[cands >= lower * (1 - 1e-12)]
    best: tuple[float, tuple | None] = (INF, None)

    def run(t_max: float) -> None:
        nonlocal best
        F, ak, asz = _sum_dp(fit, K, t_max, S, by_m, deadline)
        m = int(np.argmin(F[last]))
        total = float(F[last, m] + (n - 1) * t_max)
        if total < best[0]:
            best = (total, (F, ak, asz, m))

    eps = 0.0
    complete = True
    if n == 1:
        run(float(cands[-1]))  # one micro-batch: the objective is the plain sum
    else:
        run(float(cands[0]))  # the min-max bottleneck bounds the window of useful t_max
        cands = cands[(n - 1) * cands < best[0]]
        cands, eps = _thin(cands, max_candidates)
        for t_max in cands[1:] if cands.size and cands[0] == lower else cands:
            if (n - 1) * t_max >= best[0]:
                break
            try:
                if deadline is not None and _time.perf_counter() > deadline:
                    raise DeadlineReached
                run(float(t_max))
            except DeadlineReached:  # keep this size's best so far
                complete = False
                break
    if best[1] is None:
        return None
    F, ak, asz, m = best[1]
    chain, j = [], last
    while j != 0:
        k, s = int(ak[j, m]), int(asz[j, m])
        chain.append((k, j, s))
        j, m = k, m - s
    chain.reverse()
    return best[0], chain, complete, eps


def plan_alpa(
    graph: Graph,
    cluster: Cluster,
    mini_batch_size: int,
    *,
    time_limit: float | None = None,
    progress: bool = False,
    **options: Any,
) -> Plan:
    """Alpa-style stage DP (module docstring); ``options`` are the fields of :class:`AlpaOptions`."""
    o = parse_options("alpa", AlpaOptions, options)
    t0 = _time.perf_counter()
    deadline = None if time_limit is None else t0 + time_limit
    B = mini_batch_size
    core, inputs, sinks = pipedream_core(graph)
    lin = topological_states(graph, nodes=core)
    sizes = candidate_micro_batches(B, o.micro_batch_sizes)
    full, (cluster, considered) = cluster, usable_cluster(cluster, len(core), max(sizes))  # devices a chain can use
    limit = int(o.max_table_bytes)
    if table_bytes(cluster, lin.n_states) > limit:
        raise SearchSpaceTooLargeError(
            f"alpa: the stage tables of graph '{graph.name}' ({lin.n_states} prefixes) on {cluster.devices} devices "
            f"({len(group_sizes(cluster))} group sizes) need {table_bytes(cluster, lin.n_states):.3g} bytes, more than "
            f"max_table_bytes={limit:.3g}; the (prefix, devices, group size) DP is quadratic in the devices"
        )
    tried: dict[int, Any] = {}
    pricer = SequentialPricer(graph, full, B, lin.order, inputs, sinks)
    cands, lower, complete, max_eps = _stage_chains(
        graph, cluster, lin, B, sizes, deadline, int(o.max_candidates), pricer, tried
    )

    def build(i: int) -> Plan:
        b, objective, stages = cands[i]
        rows = [(nodes, d, b) for nodes, d in stages]
        plan = build_plan(
            graph,
            full,
            attach_detached(graph, rows, inputs, sinks),
            B,
            planner="alpa",
            search=SearchInfo(0.0, Status.FEASIBLE, extra={"alpa_latency": objective}),
        )
        tried[b] = plan.predicted.iteration_time
        return plan

    # the micro-batch size with the smallest simulated iteration time (first on ties), simulating
    # only the chains whose lower bound does not exceed the best simulated time
    built, done = select_by_simulation(lower, build, deadline)
    complete &= done
    best: Plan | None = None
    for i in sorted(built):
        plan = built[i]
        if best is None or plan.predicted.iteration_time < best.predicted.iteration_time:
            best = plan
    if best is None and not complete:
        raise TimeLimitError(f"alpa: the time limit ({time_limit} s) was reached before any micro-batch size finished")
    if best is None:
        _raise_no_plan(graph, full, cluster, B, o.micro_batch_sizes)
    status = Status.FEASIBLE if complete else Status.TIME_LIMIT
    plan = replace(
        best,
        search=replace(
            best.search,
            seconds=_time.perf_counter() - t0,
            status=status,
            extra={
                **dict(best.search.extra),
                "tried": tried,
                "group_sizes": group_sizes(cluster),
                "devices_considered": considered,
                "pruned_lower_bounds": {c[0]: lb for c, lb in zip(cands, lower) if c[0] not in tried},
                "t_max_epsilon": max_eps,
            },
        ),
    )
    validate(plan, graph, full)
    return plan


def _stage_chains(
    graph: Graph,
    cluster: Cluster,
    lin: Linearization,
    B: int,
    sizes: Sequence[int],
    deadline: float | None,
    max_candidates: int,
    pricer: SequentialPricer,
    tried: dict[int, Any],
) -> tuple[list[tuple[int, float, list[tuple[list[str], tuple[int, ...]]]]], list[float], bool, float]:
    """Per micro-batch size the DP's chain with its placement and the lower bound of its simulated
    iteration time (``tried[b] = None``: no chain fits); whether every size finished, and the
    largest ``t_max`` epsilon."""
    complete = True
    max_eps = 0.0
    cands: list[tuple[int, float, list[tuple[list[str], tuple[int, ...]]]]] = []
    lower: list[float] = []
    for b in sizes:
        if deadline is not None and _time.perf_counter() > deadline:
            complete = False
            break
        try:
            res = _solve(graph, cluster, lin, B, b, deadline, max_candidates)
        except DeadlineReached:
            complete = False
            break
        if res is None:
            tried[b] = None
            continue
        objective, chain, done, eps = res
        complete &= done
        max_eps = max(max_eps, eps)
        devs = place_groups(cluster, [s for _, _, s in chain])
        core_stage = np.empty(len(lin.order), dtype=np.int64)
        for i, (k, j, _) in enumerate(chain):  # topological prefixes: positions k..j-1
            core_stage[k:j] = i
        cands.append((b, objective, [(lin.stage_nodes(k, j), d) for (k, j, _), d in zip(chain, devs)]))
        lower.append(pricer.price(core_stage, devs, b).lower_bound)
    return cands, lower, complete, max_eps


def _raise_no_plan(graph: Graph, full: Cluster, cluster: Cluster, B: int, micro_batch_sizes: Any) -> NoReturn:
    """No chain fits: when PipeDream's planner finds no plan either, its message (with the memory
    it would need) under Alpa's name; else Alpa's own message."""
    try:
        plan_pipedream(graph, full, B, micro_batch_sizes=micro_batch_sizes)
    except InfeasibleError as exc:
        raise InfeasibleError(
            str(exc).replace("pipedream", "alpa", 1), required_memory_bytes=exc.required_memory_bytes
        ) from None
    raise InfeasibleError(
        f"alpa: no plan of graph '{graph.name}' with group sizes {group_sizes(cluster)} "
        f"fits {cluster.memory_bytes:.4g} bytes per device (B={B})"
    )
