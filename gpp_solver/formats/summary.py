"""One-line human summaries of a cluster and of a plan (what ``gpp`` prints after planning)."""

from __future__ import annotations

from collections.abc import Sequence

from gpp_solver.formats.units import format_bandwidth, format_bytes, format_seconds, plural
from gpp_solver.types import Cluster, Graph, Plan


def describe_cluster(c: Cluster) -> str:
    """``16 devices in 2 nodes of 8, 80 GiB each, 450 GB/s inside a node, 50 GB/s between nodes,
    latency 10 µs``; a flat network (no ``devices_per_node``) names its one bandwidth."""
    head = plural(c.devices, "device")
    per = c.devices_per_node
    if per is None:
        net = f"flat network {format_bandwidth(c.inter_node_bandwidth)}"
    else:
        nodes = -(-c.devices // per)
        full = c.devices % per == 0
        head += (
            f" in {plural(nodes, 'node')} of {per}" if full else f" in {plural(nodes, 'node')} (up to {per} per node)"
        )
        net = f"{format_bandwidth(c.intra_node_bandwidth)} inside a node"
        if nodes > 1:
            net += f", {format_bandwidth(c.inter_node_bandwidth)} between nodes"
    return (
        f"{head}, {format_bytes(c.memory_bytes)} each, {net}, latency {format_seconds(c.latency)}, "
        f"optimizer state factor {c.optimizer_state_factor:g}"
    )


def status_text(plan: Plan) -> str:
    """The status, and for an ``optimal-*`` one the objective it was proven for when the plan names it."""
    search = plan.search
    if search.status.startswith("optimal") and search.objective:
        return f"{search.status} ({search.objective})"
    return str(search.status)


def describe_plan(plan: Plan, cluster_devices: int | None = None) -> str:
    """Planner, shape, predicted figures, status and search time of ``plan`` on one line; with
    ``cluster_devices`` a plan on fewer devices says of how many (``8 of 16,384 devices``)."""
    p = plan.predicted
    used = plural(plan.devices_used, "device")
    if cluster_devices is not None and plan.devices_used < cluster_devices:
        used = f"{plan.devices_used} of {plural(cluster_devices, 'device')} (the others idle)"
    return (
        f"{plan.planner}: {plural(len(plan.stages), 'stage')}, depth {plan.depth}, "
        f"{used}, TPS {p.time_per_sample:.6g} s, iteration "
        f"{p.iteration_time:.6g} s, throughput {p.throughput:.6g} samples/s, peak memory "
        f"{format_bytes(p.peak_memory_bytes)} per device, status {status_text(plan)}, search {plan.search.seconds:.3f} s"
        + schedule_text(plan)
        + recompute_text(plan)
        + zero_text(plan)
    )


def zero_text(plan: Plan) -> str:
    """``, optimizer state sharded (ZeRO-1) on stage 2`` for a plan whose stages shard it; else nothing."""
    ids = [str(s.id) for s in plan.stages if s.zero]
    if not ids:
        return ""
    return f", optimizer state sharded (ZeRO-1) on {'stage' if len(ids) == 1 else 'stages'} {', '.join(ids)}"


def recompute_text(plan: Plan) -> str:
    """``, recompute stages 1, 2`` for a plan whose stages recompute; else nothing."""
    ids = [str(s.id) for s in plan.stages if s.recompute]
    if not ids:
        return ""
    return f", recompute {'stage' if len(ids) == 1 else 'stages'} {', '.join(ids)}"


def schedule_text(plan: Plan) -> str:
    """``, schedule zb (asked auto; 1F1B 0.25 s, zb 0.236 s)`` for a plan whose search records a
    ``schedule`` choice; orders with ``W`` actions without a record say ``, schedule zb``; else nothing."""
    rec = plan.search.extra.get("schedule")
    has_w = any(a[0] == "W" for s in plan.stages for a in s.schedule.order)
    if not isinstance(rec, dict):
        return ", schedule zb" if has_w else ""
    times = [
        f"{name} {rec[key]:.6g} s"
        for name, key in (("1F1B", "iteration_time_1f1b"), ("zb", "iteration_time_zb"))
        if isinstance(rec.get(key), (int, float))
    ]
    return (
        f", schedule {'zb' if has_w else '1f1b'} (asked {rec.get('requested')}"
        + (f"; this partition: {', '.join(times)}" if times else "")
        + ")"
    )


def time_limit_note(planners: Sequence[str], time_limit: float | None, default: float) -> str:
    """What ``gpp`` says when ``planners`` stopped at their time limit (``time_limit=None``: the
    ``default`` one): that it happened, what it means, and how to raise it."""
    limit = time_limit if time_limit is not None else default
    said = f"{limit:g} s" + (" (the default)" if time_limit is None else "")
    return (
        f"gpp: note: {', '.join(planners)} stopped at the time limit of {said} before the search finished "
        f"(status time-limit): the plan is valid, but a longer search may find a better one and the result "
        f"may change with the machine's load; raise it with --time-limit, e.g. --time-limit {4 * limit:g}"
    )


def describe_profile(graph: Graph) -> str | None:
    """One line on how sure a profiled graph's figures are (its ``extra.profile.quality``, written by
    ``gpp_runtime.profile``), None for a graph without it."""
    quality = (graph.extra.get("profile") or {}).get("quality")
    if not quality:
        return None
    head = f"profile: its rounds within {quality.get('round_spread', 0.0):.0%} of each other"
    bad = quality.get("suspect_sizes") or []
    if not bad:
        return head + ", no size looks measured under interference"
    why = "; ".join(quality.get("reasons", [])[:3])
    return (
        head
        + f"; sizes {', '.join(map(str, bad))} look measured under interference ({why}): re-profile on a quiet machine"
    )
