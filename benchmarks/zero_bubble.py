"""Split backward (zero bubble) vs 1F1B, simulated under the cost model (``docs/zero-bubble.md``).

    python benchmarks/zero_bubble.py                       # graphpipe and gpp, 4 workloads x 8/16/32 devices
    python benchmarks/zero_bubble.py --planners graphpipe --devices 8 16
    python benchmarks/zero_bubble.py --chain-only                    # table 2 alone

Table 1: per workload, device count and planner, the simulated iteration time of the plan with
``schedule="1f1b"`` and with ``schedule="zb"`` (each planner searches under its schedule, so the
partition may differ), their ratio and the peak memory ratio.  Workloads as in
``benchmarks/gpp_vs_spp.py`` (``v100_cluster``, GraphPipe A.2 mini-batches).

Table 2: on a chain model (the Transformer workload) and the partition of its 1F1B graphphipe
plan, three orders simulated in our model: 1F1B (kFkB), our W placement, and the handcrafted ZB-H1
order of the paper for a chain (stage ``i`` of ``p``: ``p - i`` warm-up forwards, then ``B j``,
``W j-i``, ``F``; the ``i`` deferred ``W`` at the end; every stage holds at most ``p`` micro-batches);
and, with torch installed, the order torch.distributed.pipelining's ``ScheduleInterleavedZeroBubble``
(ZB1P, one stage per rank) builds for ``p`` ranks and ``n`` micro-batches
(``benchmarks/torch_zb1p_order.py``), its idle slots dropped, checked by our C4 rules and simulated
the same way.
"""

from __future__ import annotations

import argparse
import statistics
import time

from gpp_solver.action import Action, Kind
from gpp_solver.cost.model import stage_costs
from gpp_solver.formats.cluster import v100_cluster
from gpp_solver.plan.build import StageSpec, build_plan
from gpp_solver.plan.simulate import simulate_orders
from gpp_solver.plan.validate import check_order
from gpp_solver.planners.registry import get_planner
from gpp_solver.workloads import build_model

PER_DEVICE = {"mmt": 16, "dlrm": 64, "candle-uno": 1024, "transformer": 16}


def zb_h1_chain_order(p: int, i: int, n: int) -> tuple[Action, ...]:
    """The paper's ZB-H1 order of stage ``i`` of a ``p``-stage chain with ``n`` micro-batches."""
    warm = min(n, p - i)
    out = [Action(Kind.F, j) for j in range(warm)]
    nf, nw = warm, 0
    for j in range(n):
        out.append(Action(Kind.B, j))
        if j >= i:
            out.append(Action(Kind.W, nw))
            nw += 1
        if nf < n:
            out.append(Action(Kind.F, nf))
            nf += 1
    out.extend(Action(Kind.W, j) for j in range(nw, n))
    return tuple(out)


def torch_zb1p_cell(p: int, n: int, ids: list[int], args: tuple, weight: dict) -> str:
    """The simulated iteration time of torch's ZB1P order on the chain ``ids``, or why there is none."""
    try:
        from torch_zb1p_order import torch_zb1p_orders
    except ModuleNotFoundError as exc:
        if (exc.name or "").split(".")[0] != "torch":
            raise
        return "(torch not installed)"
    try:
        orders = {ids[k]: o for k, o in torch_zb1p_orders(p, n).items()}
    except ValueError as exc:
        return f"(torch refuses: {exc})"
    for s, o in orders.items():
        check_order(s, o, n)  # C4, raises InvalidPlanError naming the step
    return f"{simulate_orders(orders, *args, record=False, weight=weight)[0]:.5g}"


def planner_rows(models, devices, planners, time_limit):
    rows = []
    for m in models:
        g = build_model(m)
        for D in devices:
            c = v100_cluster(D)
            B = PER_DEVICE[m] * D
            for name in planners:
                fn = get_planner(name)
                plans = {}
                for sched in ("1f1b", "zb"):
                    t0 = time.perf_counter()
                    plans[sched] = fn(g, c, B, time_limit=time_limit, schedule=sched)
                    plans[sched + "_s"] = time.perf_counter() - t0
                p1, pz = plans["1f1b"], plans["zb"]
                rows.append(
                    {
                        "model": m,
                        "devices": D,
                        "planner": name,
                        "stages_1f1b": len(p1.stages),
                        "stages_zb": len(pz.stages),
                        "t_1f1b": p1.predicted.iteration_time,
                        "t_zb": pz.predicted.iteration_time,
                        "mem": pz.predicted.peak_memory_bytes / p1.predicted.peak_memory_bytes,
                        "cap_ok": pz.predicted.peak_memory_bytes <= c.memory_bytes,
                    }
                )
                r = rows[-1]
                print(
                    f"| {m} | {D} | {name} | {r['stages_1f1b']} / {r['stages_zb']} | {r['t_1f1b']:.5g} | "
                    f"{r['t_zb']:.5g} | {r['t_zb'] / r['t_1f1b']:.3f} | {r['mem']:.3f} |",
                    flush=True,
                )
    return rows


def chain_rows(devices, time_limit):
    g = build_model("transformer")
    for D in devices:
        c = v100_cluster(D)
        B = PER_DEVICE["transformer"] * D
        plan = get_planner("graphpipe")(g, c, B, time_limit=time_limit, schedule="1f1b")
        p = len(plan.stages)
        if p < 2 or any(len({b for a, b in plan.edges if a == s.id}) > 1 for s in plan.stages):
            print(f"| transformer | {D} | {p} | (not a multi-stage chain) | | | | |")
            continue
        costs = stage_costs(g, c, plan.stages, B)
        ids = [s.id for s in plan.stages]
        mb = {s.id: s.micro_batch_size for s in plan.stages}
        n = B // plan.stages[0].micro_batch_size
        args = (
            mb,
            {i: x.forward for i, x in zip(ids, costs)},
            {i: x.backward for i, x in zip(ids, costs)},
            {i: x.allreduce for i, x in zip(ids, costs)},
            plan.edges,
            B,
        )
        w = {i: x.backward_weight for i, x in zip(ids, costs)}
        specs = [StageSpec(s.nodes, s.devices, s.micro_batch_size, k=s.schedule.k) for s in plan.stages]
        ours = build_plan(
            g, c, specs, B, planner="graphpipe", search=plan.search, schedule="zb"
        ).predicted.iteration_time
        h1 = {s: zb_h1_chain_order(p, k, n) for k, s in enumerate(ids)}
        t_h1 = simulate_orders(h1, *args, record=False, weight=w)[0]
        t_1 = plan.predicted.iteration_time
        t_torch = torch_zb1p_cell(p, n, ids, args, w)
        print(f"| transformer | {D} | {p} | {n} | {t_1:.5g} | {ours:.5g} | {t_h1:.5g} | {t_torch} |", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=list(PER_DEVICE))
    ap.add_argument("--devices", nargs="+", type=int, default=[8, 16, 32])
    ap.add_argument("--planners", nargs="+", default=["graphpipe", "gpp"])
    ap.add_argument("--time-limit", type=float, default=None)
    ap.add_argument("--no-chain", action="store_true", help="skip table 2")
    ap.add_argument("--chain-only", action="store_true", help="table 2 alone")
    a = ap.parse_args()
    if a.chain_only and a.no_chain:
        ap.error("--chain-only and --no-chain exclude each other")
    if a.chain_only:
        chain_table(a.devices, a.time_limit)
        return
    print(
        "| workload | devices | planner | stages 1f1b / zb | 1F1B iteration (s) | zb iteration (s) | zb / 1F1B |"
        " peak memory zb / 1F1B |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    rows = planner_rows(a.models, a.devices, a.planners, a.time_limit)
    for name in a.planners:
        mine = [r for r in rows if r["planner"] == name]
        multi = [r for r in mine if r["stages_1f1b"] > 1 and r["devices"] <= 16]
        print(
            f"\n{name}: zb/1F1B mean {statistics.mean(r['t_zb'] / r['t_1f1b'] for r in mine):.3f} over "
            f"{len(mine)} cells, worst {max(r['t_zb'] / r['t_1f1b'] for r in mine):.3f}; multi-stage at <= 16 "
            f"devices: mean {statistics.mean(r['t_zb'] / r['t_1f1b'] for r in multi) if multi else float('nan'):.3f} "
            f"({len(multi)} cells); every zb plan within the memory cap: {all(r['cap_ok'] for r in mine)}"
        )
    if not a.no_chain:
        print()
        chain_table(a.devices, a.time_limit)


def chain_table(devices, time_limit) -> None:
    print(
        "| chain | devices | stages | micro-batches | 1F1B (s) | our zb (s) | paper's ZB-H1 order (s) |"
        " torch ZB1P order (s) |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    chain_rows(devices, time_limit)


if __name__ == "__main__":
    main()
