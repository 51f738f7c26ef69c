"""Benchmark: our runtime vs torch.distributed.pipelining, and a graph pipeline vs a chain.

    python benchmarks/runtime_vs_torch.py [--steps 20] [--warmup 3] [--stages 2]

1. Sequential model (``examples.sequential:bench``: 8 Linear(512)+ReLU blocks and a head), split
   into ``--stages`` equal stages, 1F1B, mini-batch 128 in micro-batches of 16: our runtime
   (``gpp_runtime.train``) vs ``torch.distributed.pipelining.Schedule1F1B`` with manually split
   ``PipelineStage``s - same partition, same micro-batches, same data, SGD, gloo on CPU, one
   thread per rank. Time per iteration = wall span of the timed steps over all ranks / steps.
2. Two-branch model (``examples.two_branch:bench``) on 3 ranks with our runtime: the graph
   pipeline (branch 0 | branch 1 | cat+head) vs the best 3-stage chain (contiguous split of the
   topological order chosen by the cost model's iteration estimate from a quick profile).

Launches torchrun itself and prints markdown tables.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def one_f_one_b(depth: int, n: int) -> list[list]:
    warm = min(depth, n)
    order = [["F", j] for j in range(warm)]
    f = b = 0
    f = warm
    while f < n:
        order += [["F", f], ["B", b]]
        f, b = f + 1, b + 1
    return order + [["B", j] for j in range(b, n)]


def plan_doc(mini_batch_size: int, mb: int, parts: list[list[str]], edges: list[list[int]], depths: list[int]) -> dict:
    stages = [
        {
            "id": i,
            "nodes": nodes,
            "devices": [i],
            "micro_batch_size": mb,
            "schedule": {"kind": "kFkB", "k": 1, "order": one_f_one_b(depths[i], mini_batch_size // mb)},
        }
        for i, nodes in enumerate(parts)
    ]
    return {
        "format": "gpp-plan/1",
        "planner": "bench",
        "mini_batch_size": mini_batch_size,
        "stages": stages,
        "edges": edges,
    }


def launch(nproc: int, args: list[str], timeout: float = 600) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]),
    }
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}", *args]
    res = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
    if res.returncode != 0:
        sys.stderr.write(res.stdout[-3000:] + res.stderr[-3000:])
        raise SystemExit(f"launch failed: {' '.join(cmd)}")
    return res


def ours(tmp: Path, name: str, doc: dict, model: str, steps: int, warmup: int) -> float:
    """Seconds per iteration of gpp_runtime.train with plan ``doc``."""
    plan = tmp / f"{name}.json"
    plan.write_text(json.dumps(doc))
    met = tmp / f"{name}-metrics.json"
    launch(
        len(doc["stages"]),
        [
            "-m",
            "gpp_runtime.train",
            "--plan",
            str(plan),
            "--model",
            model,
            "--steps",
            str(steps + warmup),
            "--warmup-steps",
            str(warmup),
            "--threads",
            "1",
            "--quiet",
            "--metrics",
            str(met),
        ],
    )
    return json.loads(met.read_text())["seconds_per_step"]


def torch_pipelining(tmp: Path, nstages: int, mini_batch_size: int, mb: int, steps: int, warmup: int) -> float:
    out = tmp / f"torch-{nstages}.json"
    launch(
        nstages,
        [
            str(Path(__file__).resolve()),
            "--worker",
            "--out",
            str(out),
            "--mb",
            str(mb),
            "--batch",
            str(mini_batch_size),
            "--steps",
            str(steps),
            "--warmup",
            str(warmup),
        ],
    )
    return json.loads(out.read_text())["seconds_per_step"]


def worker(args) -> None:
    """One rank of the torch.distributed.pipelining run (launched by torchrun)."""
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B

    from examples.sequential import bench

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    wl = bench()
    mods = list(wl.model.layers) + [wl.model.head]
    per = len(wl.model.layers) // world
    part = mods[rank * per : (rank + 1) * per] + ([wl.model.head] if rank == world - 1 else [])
    sub = nn.Sequential(*part)
    stage = PipelineStage(sub, rank, world, torch.device("cpu"))
    sched = Schedule1F1B(stage, args.batch // args.mb, loss_fn=lambda o, t: wl.loss(o, t) / args.batch)
    opt = torch.optim.SGD(sub.parameters(), lr=0.01)
    t0 = 0.0
    for step in range(args.warmup + args.steps):
        if step == args.warmup:
            dist.barrier()
            t0 = time.time()
        opt.zero_grad(set_to_none=True)
        (x,), y = wl.sample(args.batch, step)
        if rank == 0:
            sched.step(x)
        elif rank == world - 1:
            sched.step(target=y, losses=[])
        else:
            sched.step()
        opt.step()
    dist.barrier()
    if rank == 0:
        Path(args.out).write_text(json.dumps({"seconds_per_step": (time.time() - t0) / args.steps}))
    dist.destroy_process_group()


def best_chain(model_spec: str, mb: int, mini_batch_size: int, nstages: int) -> tuple[list[list[str]], float, dict]:
    """Best contiguous split of the topological order whose stage graph is a path, by the
    cost model's iteration estimate ``L + (n-1) * max`` (L = sum of the stage times)."""
    import itertools

    import torch

    from gpp_runtime.capture.fx_graph import load_workload
    from gpp_runtime.capture.profiler import profile

    torch.set_num_threads(1)
    torch.manual_seed(0)
    g = profile(load_workload(model_spec), [mb], warmup=3, repeats=15)
    ids = [n["id"] for n in g["nodes"]]
    pos = {v: i for i, v in enumerate(ids)}
    edges = [(pos[e["src"]], pos[e["dst"]]) for e in g["edges"]]
    cost = {n["id"]: n["fw_time"][0] + n["bw_time"][0] for n in g["nodes"]}
    n = mini_batch_size // mb
    best = None
    for cuts in itertools.combinations(range(1, len(ids)), nstages - 1):
        bounds = [0, *cuts, len(ids)]
        parts = [ids[a:b] for a, b in zip(bounds, bounds[1:])]
        stage_of = [k for k, (a, b) in enumerate(zip(bounds, bounds[1:])) for _ in range(a, b)]
        if any(stage_of[v] - stage_of[u] > 1 for u, v in edges):
            continue  # not a path of stages: some value would skip a stage
        times = [sum(cost[v] for v in p) for p in parts]
        est = sum(times) + (n - 1) * max(times)
        if best is None or est < best[1]:
            best = (parts, est)
    return best[0], best[1], cost


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--out", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--stages", default="2", help="comma-separated stage counts for part 1 (empty: skip it)")
    ap.add_argument("--mb", type=int, default=16)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=2, help="alternating repetitions; the best is shown")
    ap.add_argument("--skip-branch", action="store_true")
    args = ap.parse_args()
    if args.worker:
        worker(args)
        return 0
    from examples.sequential import bench

    ids = [f"layers.{i}" for i in range(len(bench().model.layers))] + ["head"]
    print(
        f"CPU ({os.cpu_count()} cores), gloo, 1 thread per rank; mini-batch {args.batch}, "
        f"micro-batch {args.mb}, {args.steps} timed steps after {args.warmup} warm-up, "
        f"best of {args.rounds} alternating rounds\n"
    )
    print("| model | stages | ours s/iter | torch Schedule1F1B s/iter | ratio |")
    print("| --- | --- | --- | --- | --- |")
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        for k in [int(s) for s in args.stages.split(",") if s.strip()]:
            per = (len(ids) - 1) // k
            parts = [ids[i * per : (i + 1) * per] for i in range(k)]
            parts[-1] += ids[k * per :]
            doc = plan_doc(
                args.batch, args.mb, parts, [[i, i + 1] for i in range(k - 1)], [k - 1 - i for i in range(k)]
            )
            t_o, t_t = [], []
            for _ in range(args.rounds):  # alternate, keep the best of each (shared machines are noisy)
                t_o.append(ours(tmp, f"seq{k}", doc, "examples.sequential:bench", args.steps, args.warmup))
                t_t.append(torch_pipelining(tmp, k, args.batch, args.mb, args.steps, args.warmup))
            t_ours, t_torch = min(t_o), min(t_t)
            print(f"| sequential 8x512 | {k} | {t_ours:.4f} | {t_torch:.4f} | {t_ours / t_torch:.2f} |", flush=True)
        if args.skip_branch:
            return 0
        spec = "examples.two_branch:bench"
        chain, est_chain, cost = best_chain(spec, args.mb, args.batch, 3)
        b0 = [v for v in cost if v.startswith("branch0.")]
        b1 = [v for v in cost if v.startswith("branch1.")]
        merge = ["cat", "head"]
        n = args.batch // args.mb
        tb = [sum(cost[v] for v in p) for p in (b0, b1, merge)]
        est_graph = max(tb[0], tb[1]) + tb[2] + (n - 1) * max(tb)
        graph = plan_doc(args.batch, args.mb, [b0, b1, merge], [[0, 2], [1, 2]], [1, 1, 0])
        chain_doc = plan_doc(args.batch, args.mb, chain, [[0, 1], [1, 2]], [2, 1, 0])
        t_g, t_c = [], []
        for _ in range(args.rounds):
            t_g.append(ours(tmp, "graph", graph, spec, args.steps, args.warmup))
            t_c.append(ours(tmp, "chain", chain_doc, spec, args.steps, args.warmup))
        t_graph, t_chain = min(t_g), min(t_c)
        print("\n| two-branch 2x(4x512)+head, 3 ranks | stage graph | estimated s/iter | measured s/iter |")
        print("| --- | --- | --- | --- |")
        print(f"| graph pipeline | b0 \\| b1 -> cat+head (depth 2) | {est_graph:.4f} | {t_graph:.4f} |")
        sizes = "/".join(str(len(p)) for p in chain)
        print(f"| best chain | {sizes} nodes (depth 3) | {est_chain:.4f} | {t_chain:.4f} |")
        print(f"\ngraph / chain measured: {t_graph / t_chain:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
