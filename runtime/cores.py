"""CPU cores as devices: pinning, busy fillers and concurrent profiling.

    python -m gpp_runtime.cores --model examples.sequential:bench --core 1 --batch 32   # a filler
    python -m gpp_runtime.cores --model examples.sequential:bench --core 1 --precision bf16-autocast

Why. On a CPU the cores of one machine are not independent devices: on the 2-vCPU VM this was
written on, one single-threaded 256x256 float32 matmul loop took 344 us per matmul alone and
620 us in each of two such loops run at the same time, one per core (the vCPUs share a physical
core or its caches and memory path). A profile taken by one process on an otherwise idle machine
therefore describes a faster device than each of two ranks training at once gets. Two tools make
every measurement see the same device, "one core while every other core works":

- ``gpp_runtime.profile --concurrent N`` (:func:`profile_concurrent`): N profilers of the same model
  at once, each pinned to its own core with one thread; a profiler that finishes first keeps its
  core busy (:func:`busy_loop`) until all have finished, and the graph gets each node's median
  over the N processes' medians (``extra.profile.concurrent`` records N and the cores).
- a *filler* (``python -m gpp_runtime.cores``): one pinned thread running the model's forward and
  backward in a loop, to keep a core the plan does not use as busy as a rank would. It prints
  ``ready`` after its first iteration.

:func:`pin` is what ``gpp_runtime.train --pin-cores`` calls: rank ``LOCAL_RANK`` on the
``LOCAL_RANK``-th core of the process's affinity set.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from gpp_solver.errors import InvalidInputError

from .engine.allocator import keep_freed_memory

ROOT = Path(__file__).resolve().parents[1]  # the checkout (its examples), or site-packages when installed
PROFILER = "gpp_runtime.profile"  # the workers run this package's profiler
WORKER_ENV = "GPP_PROFILE_WORKER"  # "K/N": this profiler is worker K of N (set by profile_concurrent)
#: gpp_runtime.capture.precision.PRECISIONS' names (named here so that --help imports no torch)
PRECISION_CHOICES = ("float32", "bf16-autocast", "fp16-autocast", "bf16-model")


def cores() -> list[int]:
    """The cores this process may run on, in order."""
    return sorted(os.sched_getaffinity(0))


def pin(index: int) -> int:
    """Pin the calling process (and the threads it creates later) to its ``index``-th core."""
    cs = cores()
    core = cs[index % len(cs)]
    os.sched_setaffinity(0, {core})
    return core


def busy_loop(workload, batch: int, stop=lambda: False, ready=lambda: None, prec=None) -> int:
    """Forward and backward of the whole model on ``sample(batch, 0)`` until ``stop()``; the count.
    ``ready()`` is called once, after the first iteration.  ``prec``: the forward and the loss in
    that precision's autocast (a :class:`~gpp_runtime.capture.precision.Precision`; the workload
    already cast for a low-precision model), as the ranks beside it train: the kernels a core runs
    change what its neighbour measures."""
    inputs, target = workload.sample(batch, 0)
    device = next((p.device for p in workload.model.parameters()), "cpu")
    n = 0
    while not stop():
        workload.model.zero_grad(set_to_none=True)
        with contextlib.nullcontext() if prec is None else prec.forward(device):
            loss = workload.loss(workload.model(*inputs), target)
        loss.backward()
        n += 1
        if n == 1:
            ready()
    return n


def profile_concurrent(argv: list[str], n: int, output: str) -> dict:
    """Run this package's profiler (``python -m gpp_runtime.profile ARGV``) as ``n`` pinned concurrent workers; the merged graph."""
    cs = cores()
    if not 1 <= n <= len(cs):
        raise InvalidInputError(f"--concurrent must be between 1 and the {len(cs)} cores this process may use, got {n}")
    tmp = Path(tempfile.mkdtemp(prefix="gpp-profile-"))
    outs = [tmp / f"worker{k}.json" for k in range(n)]
    procs = []
    try:
        for k in range(n):
            args = [a for a in argv]
            args[args.index(output)] = str(outs[k])
            here = {str(Path(p or ".").resolve()) for p in sys.path}  # ROOT only where it is missing
            path = os.pathsep.join(
                p for p in (str(ROOT) if str(ROOT) not in here else None, os.environ.get("PYTHONPATH")) if p
            )
            env = {**os.environ, WORKER_ENV: f"{k}/{n}", "OMP_NUM_THREADS": "1", "PYTHONPATH": path}
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-m", PROFILER, *args],
                    env=env,
                    stderr=subprocess.PIPE,
                    stdout=subprocess.DEVNULL,
                    text=True,
                )
            )
        while not all(o.exists() for o in outs):
            for k, p in enumerate(procs):
                if p.poll() is not None and not outs[k].exists():
                    err = (p.stderr.read().strip().splitlines() or ["?"])[-1]
                    raise InvalidInputError(f"profiler worker {k} failed: {err.removeprefix('error: ')}")
            time.sleep(0.05)
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            p.wait()
    docs = [json.loads(o.read_text()) for o in outs]
    for o in outs:
        o.unlink()
    tmp.rmdir()
    return merge(docs, [cs[k] for k in range(n)])


def merge(docs: list[dict], used: list[int]) -> dict:
    """One graph from concurrent profiles of one model: per node and size, the median of the
    workers' medians; the spread is the fastest and slowest run of any worker."""
    out = json.loads(json.dumps(docs[0]))
    for i, nd in enumerate(out["nodes"]):
        per = [d["nodes"][i] for d in docs]
        for kind in ("fw", "bw"):
            nd[f"{kind}_time"] = [float(statistics.median(v)) for v in zip(*[p[f"{kind}_time"] for p in per])]
            spreads = list(zip(*[p["extra"]["time_spread"][kind] for p in per]))
            nd["extra"]["time_spread"][kind] = [[min(s[0] for s in sz), max(s[1] for s in sz)] for sz in spreads]
        if "bw_weight_time" in nd:  # its median too, at most the merged backward (medians may cross)
            w = [float(statistics.median(v)) for v in zip(*[p["bw_weight_time"] for p in per])]
            nd["bw_weight_time"] = [min(a, b) for a, b in zip(w, nd["bw_time"])]
    for key in ("op_overhead", "optimizer_time_per_byte", "grad_accumulation_time_per_byte"):  # medians too
        if all(key in d for d in docs):
            vals = [d[key] for d in docs]
            out[key] = (
                {k: float(statistics.median(v[k] for v in vals)) for k in vals[0]}
                if isinstance(vals[0], dict)
                else float(statistics.median(vals))
            )
    for key in ("step_time_per_sample", "step_time_fixed"):  # 0: not fitted
        value = float(statistics.median(d.get(key, 0.0) for d in docs))
        out.pop(key, None)
        if value > 0:
            out[key] = value
    in_situ = [d["extra"]["profile"].get("in_situ") for d in docs]
    if any(in_situ):  # each worker's calibration (gpp_runtime.calibration.insitu): their scaled node times were merged
        out["extra"]["profile"]["in_situ"] = {"workers": in_situ}
    totals = [d["extra"]["profile"].get("round_totals") for d in docs]
    if all(totals):  # every worker's rounds, per size: each an independent measurement
        out["extra"]["profile"]["round_totals"] = [sum(per, []) for per in zip(*totals)]
    out["extra"]["profile"].update(
        statistic=f"median over {len(docs)} concurrent processes of each one's median",
        concurrent={
            "processes": len(docs),
            "cores": used,
            "pinned": True,
            "why": "every core busy, as when ranks train on all of them (runtime/cores.py)",
        },
    )
    return out


def worker_index() -> tuple[int, int] | None:
    """(K, N) when this process is a concurrent profiler worker."""
    spec = os.environ.get(WORKER_ENV)
    if not spec:
        return None
    k, n = spec.split("/")
    return int(k), int(n)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m gpp_runtime.cores", description="Keep one core busy with a model's forward and backward."
    )
    ap.add_argument("--model", required=True, help="MODULE:FUNCTION returning a workload")
    ap.add_argument("--core", type=int, required=True, help="index into this process's cores")
    ap.add_argument("--batch", type=int, default=8, help="samples per forward (default 8)")
    ap.add_argument("--seconds", type=float, default=None, help="stop after this long (default: SIGTERM)")
    ap.add_argument(
        "--precision",
        choices=PRECISION_CHOICES,
        default="float32",
        help="train the model in this precision, as the ranks beside it do (gpp_runtime.train's --precision)",
    )
    args = ap.parse_args(argv)
    import torch

    from .capture.fx_graph import load_workload
    from .capture.precision import in_precision, precision

    if args.batch < 1:
        print(f"error: --batch must be >= 1, got {args.batch}", file=sys.stderr)
        return 2
    if not 0 <= args.core < len(cores()):
        print(
            f"error: --core must be between 0 and {len(cores()) - 1} (this process may use {len(cores())} "
            f"cores), got {args.core}",
            file=sys.stderr,
        )
        return 2
    if args.seconds is not None and not args.seconds > 0:
        print(f"error: --seconds must be > 0, got {args.seconds}", file=sys.stderr)
        return 2
    torch.set_num_threads(1)
    keep_freed_memory()  # as the ranks beside it run (gpp_runtime.engine.allocator)
    pin(args.core)
    prec = precision(args.precision)
    try:
        wl = in_precision(load_workload(args.model), prec)
    except InvalidInputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    end = time.monotonic() + args.seconds if args.seconds is not None else float("inf")
    busy_loop(wl, args.batch, lambda: time.monotonic() > end, lambda: print("ready", flush=True), prec)
    return 0


if __name__ == "__main__":
    sys.exit(main())
