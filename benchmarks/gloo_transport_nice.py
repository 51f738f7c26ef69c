"""What gloo's transport thread at nice 19 (``gpp_runtime.engine.p2p.lower_transport_threads``)
saves two CPU ranks that compute and exchange small messages, as a pipeline of small micro-batches
does.

    python benchmarks/gloo_transport_nice.py [--rounds 64] [--tensors 7] [--repeats 3] [--no-pin]

Each run is two ranks under torchrun (gloo, one pinned thread each unless ``--no-pin``). Per round
each rank posts the receives of the peer's message, computes ``--compute-ms`` (a matmul loop, timed
by the clock), posts its own message (``--tensors`` tensors of 64 B to 24 kB, each an ``isend``, as
the runtime posts a stage's outputs) and waits for the peer's. Runs with the transport threads at
nice 19 and as gloo leaves them take turns (``--repeats`` each); per setting the median of the
run's time, of its time posting and waiting, and the longest single ``isend``. The rounds' compute
alone is ``rounds * compute-ms``; what a run takes above it is what its messages cost.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SIZES = (64, 16, 128, 2048, 6144, 64, 256)  # floats: the messages of a two-stage cut


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=64)
    ap.add_argument("--tensors", type=int, default=7, choices=range(1, len(SIZES) + 1))
    ap.add_argument("--compute-ms", type=float, default=2.0)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--no-pin", action="store_true", help="leave the ranks unpinned")
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)  # "nice" or "as-is": one run's rank
    args = ap.parse_args(argv)
    if args.rounds < 1 or args.repeats < 1 or args.compute_ms <= 0:
        ap.error("--rounds and --repeats must be >= 1 and --compute-ms > 0")
    return args


def worker(args) -> None:
    """One rank of one run: prints its figures as JSON (rank 0)."""
    import torch
    import torch.distributed as dist

    from gpp_runtime.engine.p2p import lower_transport_threads

    torch.set_num_threads(1)
    rank = int(os.environ["RANK"])
    if not args.no_pin:
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[rank % len(os.sched_getaffinity(0))]})
    dist.init_process_group("gloo")
    if args.worker == "nice":
        lower_transport_threads("gloo")
    peer = 1 - rank
    a, b = torch.randn(128, 128), torch.randn(128, 128)
    sizes = SIZES[: args.tensors]
    post = wait = longest = 0.0
    sends = []
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(args.rounds):
        bufs = [torch.empty(s) for s in sizes]
        t = time.perf_counter()
        works = [dist.irecv(x, peer) for x in bufs]
        post += time.perf_counter() - t
        t = time.perf_counter()
        while time.perf_counter() - t < args.compute_ms / 1e3:
            a @ b
        for s in sizes:
            t = time.perf_counter()
            sends.append(dist.isend(torch.randn(s), peer))
            d = time.perf_counter() - t
            post += d
            longest = max(longest, d)
        t = time.perf_counter()
        for w in works:
            w.wait()
        wait += time.perf_counter() - t
    for w in sends:
        w.wait()
    total = time.perf_counter() - t0
    dist.barrier()
    if rank == 0:
        print(json.dumps({"total": total, "post": post, "wait": wait, "longest_isend": longest}), flush=True)
    dist.destroy_process_group()


def run(args, setting: str) -> dict:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", __file__]
    cmd += ["--worker", setting, "--rounds", str(args.rounds), "--tensors", str(args.tensors)]
    cmd += ["--compute-ms", str(args.compute_ms)] + (["--no-pin"] if args.no_pin else [])
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    }
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    lines = [x for x in res.stdout.splitlines() if x.startswith("{")]
    if res.returncode != 0 or not lines:
        sys.exit(f"a run failed (exit {res.returncode}): {(res.stderr.strip().splitlines() or ['?'])[-1]}")
    return json.loads(lines[-1])


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.worker:
        worker(args)
        return
    got: dict[str, list[dict]] = {"nice": [], "as-is": []}
    for _ in range(args.repeats):
        for setting in got:
            got[setting].append(run(args, setting))
    floor = args.rounds * args.compute_ms
    print(
        f"{args.rounds} rounds of {args.compute_ms:g} ms compute ({floor:.0f} ms) and {args.tensors} tensors each way"
    )
    print(
        f"{'transport thread':<18} {'run ms':>8} {'above compute':>14} {'posting ms':>11} {'waiting ms':>11} {'longest isend ms':>17}"
    )
    for setting, runs in got.items():
        med = {k: statistics.median(r[k] for r in runs) * 1e3 for k in runs[0]}
        name = "nice 19" if setting == "nice" else "as gloo leaves it"
        print(
            f"{name:<18} {med['total']:>8.1f} {med['total'] - floor:>14.1f} {med['post']:>11.1f} "
            f"{med['wait']:>11.1f} {med['longest_isend']:>17.2f}"
        )


if __name__ == "__main__":
    main()
