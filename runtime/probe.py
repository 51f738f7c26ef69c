"""Measure the cluster the ranks run on and write it as a ``gpp-cluster/1`` file for the planner.

    torchrun --standalone --nproc-per-node 4 -m gpp_runtime.probe -o cluster.json
    torchrun --nnodes 2 --nproc-per-node 8 ... -m gpp_runtime.probe -o cluster.json --details probe.json

What is measured (every rank takes part; rank 0 alone logs and writes):

- **nodes**: ranks are grouped by host name; ``devices_per_node`` is the ranks per host (torchrun's
  ``LOCAL_WORLD_SIZE``). Hosts with different rank counts: the field is left out (flat network,
  the inter-node figure everywhere) and the log says so.
- **point-to-point latency and bandwidth**, for every pair of ranks in turn (the others wait at a
  barrier): ping-pong with ``isend``/``irecv`` (as the runtime posts its messages) at each of
  ``--sizes`` bytes, ``--repeats`` round trips after ``--warmup``, each after ``--compute-seconds``
  of work on the rank that starts it (below); the one-way time is half the typical round trip.
  ``latency`` = one-way time of the smallest size, bandwidth = ``(largest - smallest) /
  (t(largest) - t(smallest))`` (the slope of the affine model ``latency + bytes / bandwidth``). A
  pair is intra-node when both ranks share a host. The cluster gets the median over the pairs of
  each kind; a single host has no inter-node pair, so ``inter_node_bandwidth`` is then the
  intra-node figure (the planner needs a positive value; nothing crosses nodes anyway).
- **all-reduce**: typical time of the runtime's data-parallel gradient all-reduce (``GradSync``:
  each bucket copied, all-reduced, copied back) over all ranks at each of ``--sizes``, each after
  ``--compute-seconds`` of work on every rank, fitted to the ring algorithm the cost model prices,
  ``2 (n-1) latency + 2 (n-1)/n * bytes / bandwidth`` (:func:`ring_fit`: least squares of the
  relative error; the slope gives ``allreduce_bandwidth``, the intercept ``allreduce_latency``;
  with one rank both are left out and an all-reduce is priced at the point-to-point bandwidth).
- **work between messages** (``--compute-seconds``, default 5 ms): before each timed round trip
  the rank that starts it computes while the other waits for its message, and before each
  all-reduce every rank computes (a matmul loop, untimed), as training does (on a 2-vCPU VM the
  one-way latency measured 101 us back to back and 1030 us after 5 ms of work).
- **typical time** (:func:`typical`): the mean of the middle 80% of the repeats, the sizes taking
  turns within each repeat. A step's time is a mean; on a 2-vCPU VM a gloo all-reduce after work
  took about 0.2 ms or about 3 ms (a blocked rank is sometimes woken late), and a median picks a
  mode (24 kB: median 0.44, mean 1.36 ms).
- **memory**: CUDA: ``torch.cuda.mem_get_info`` free bytes of each rank's device; CPU: the host's
  ``MemAvailable`` divided by the ranks on that host; ``--memory BYTES`` overrides; the minimum
  over ranks. ``runtime_memory_bytes`` (CUDA): cuBLAS's workspaces, held whatever the model
  (``gpp_runtime.engine.memory.runtime_memory``), the largest over ranks.
- ``optimizer_state_factor`` is not measured: ``--optimizer-state-factor`` (default 4.0, fp32 Adam);
  ``memory_overheads`` is true: the cost model prices the runtime's buffers (``docs/cost-model.md``).

Backend: NCCL on ``cuda:LOCAL_RANK`` when CUDA is available (unless ``--cpu``), else gloo. Exit
codes: 0 ok, 2 bad arguments (one line from each rank), 1 a communication failure.
"""

from __future__ import annotations

import argparse
import datetime
import json
import logging
import os
import socket
import statistics
import sys
import time

import torch
import torch.distributed as dist

from gpp_solver.formats.cluster import cluster_from_dict, save_cluster

from .calibration.probe_fit import affine_fit, in_turns, ring_fit, typical
from .engine.grad_sync import GradSync
from .engine.memory import host_available_memory, runtime_memory
from .engine.p2p import P2P, lower_transport_threads

__all__ = ["affine_fit", "in_turns", "ring_fit", "typical", "main"]

logger = logging.getLogger("gpp_runtime.probe")

DEFAULT_SIZES = "4,65536,1048576,8388608,26214400"  # up to one full 25 MiB gradient bucket


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="torchrun ... -m gpp_runtime.probe",
        description="Measure the ranks' network and memory; write gpp-cluster/1.",
    )
    ap.add_argument("-o", "--output", required=True, help="cluster JSON to write (gpp-cluster/1)")
    ap.add_argument(
        "--sizes",
        default=DEFAULT_SIZES,
        help="message sizes in bytes, comma-separated, at least two (default %(default)s)",
    )
    ap.add_argument(
        "--repeats", type=int, default=31, help="timed round trips (and all-reduces) per size and pair (default 31)"
    )
    ap.add_argument("--warmup", type=int, default=2, help="untimed round trips per size and pair")
    ap.add_argument(
        "--compute-seconds",
        dest="compute",
        type=float,
        default=0.005,
        help="seconds every rank computes (untimed) before each timed round trip and all-reduce, as a "
        "training step computes between its messages (default 0.005; 0: back to back)",
    )
    ap.add_argument("--memory", type=float, default=None, help="usable bytes per device (skip measuring)")
    ap.add_argument(
        "--optimizer-state-factor",
        type=float,
        default=4.0,
        help="bytes of weights+grads+optimizer state per weight byte (4.0: fp32 Adam)",
    )
    ap.add_argument("--details", default=None, help="also write every pair's figures here (JSON)")
    ap.add_argument("--cpu", action="store_true", help="gloo on CPU even when CUDA is available")
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds before a silent peer is fatal")
    return ap.parse_args(argv)


def check_args(args: argparse.Namespace) -> list[int]:
    """The message sizes; ValueError naming the bad argument."""
    try:
        sizes = sorted({int(s) for s in args.sizes.split(",") if s.strip()})
    except ValueError:
        raise ValueError(f"--sizes must be comma-separated integers, got {args.sizes!r}") from None
    if len(sizes) < 2 or sizes[0] < 4:
        raise ValueError(f"--sizes needs at least two distinct sizes of at least 4 bytes, got {args.sizes!r}")
    if args.repeats < 1 or args.warmup < 0:
        raise ValueError("--repeats must be >= 1 and --warmup >= 0")
    if not args.compute >= 0:
        raise ValueError(f"--compute-seconds must be >= 0, got {args.compute}")
    if args.memory is not None and not args.memory > 0:
        raise ValueError(f"--memory must be a positive number of bytes, got {args.memory:g}")
    if not args.optimizer_state_factor > 0:
        raise ValueError("--optimizer-state-factor must be positive")
    return sizes


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


_BUSY: dict = {}  # the matmul operand of compute_for


def compute_for(seconds: float) -> None:
    """Keep this rank's core busy for ``seconds`` (small CPU matmuls, untimed), as a training step
    computes between its messages."""
    if seconds <= 0:
        return
    a = _BUSY.get("a")
    if a is None:
        a = _BUSY["a"] = torch.ones(64, 64)
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        a @ a


def ping_pong(
    rank: int, a: int, b: int, sizes: list[int], warmup: int, repeats: int, device: torch.device, compute: float = 0.0
) -> list[float]:
    """Typical one-way time (half a round trip) of each of ``sizes`` bytes between ranks ``a`` and
    ``b`` (:func:`in_turns`), each round trip after ``compute`` seconds of work on rank ``a``
    (:func:`compute_for`) while ``b`` waits for the message, as a pipeline's next stage waits for
    the activation its predecessor computes. Only ``a`` works: were both to, ``a``'s round trip
    would also time whatever part of ``b``'s work was left when ``a`` finished its own (a skew that
    made the same probe measure 0.1 and 5.5 ms)."""

    def once(buf: torch.Tensor) -> float:
        if rank == a:
            compute_for(compute)
        _sync(device)
        t0 = time.perf_counter()
        if rank == a:  # as the runtime posts its messages (gpp_runtime.engine.p2p): isend / irecv, then wait
            dist.isend(buf, b).wait()
            dist.irecv(buf, b).wait()
        else:
            dist.irecv(buf, a).wait()
            dist.isend(buf, a).wait()
        _sync(device)
        return (time.perf_counter() - t0) / 2

    bufs = [torch.zeros(max(1, n // 4), dtype=torch.float32, device=device) for n in sizes]
    return in_turns(bufs, warmup, repeats, once)


def allreduce_time(
    sizes: list[int], warmup: int, repeats: int, device: torch.device, compute: float = 0.0, timeout: float = 120.0
) -> list[float]:
    """Typical time of the data-parallel gradient all-reduce of each of ``sizes`` bytes over all
    ranks (:func:`in_turns`), run as the runtime runs it: ``gpp_runtime.engine.grad_sync``'s ``finish``
    over gradients of that many bytes (4 MiB tensors, 25 MiB buckets: each bucket copied into a
    flat buffer, all-reduced, copied back), each after ``compute`` seconds of work on every rank
    (:func:`compute_for`). A bare ``all_reduce`` of a ready buffer leaves out the copies: on a
    2-vCPU VM they took 17-53 ms of a 100 ms all-reduce of resnet18's 93 MB of float64 gradients."""

    def once(sync: GradSync) -> float:
        compute_for(compute)
        _sync(device)
        t0 = time.perf_counter()
        sync.finish(0)
        _sync(device)
        return time.perf_counter() - t0

    group = dist.new_group(list(range(dist.get_world_size())))
    lower_transport_threads(dist.get_backend())  # the new group's thread too, as in the runtime
    return in_turns([_gradients(n, group, device, timeout) for n in sizes], warmup, repeats, once)


def _gradients(nbytes: int, group, device: torch.device, timeout: float) -> GradSync:
    """A ``GradSync`` (after the backward, as on gloo) over float32 gradients of ``nbytes`` in all."""
    left, params = max(1, nbytes // 4), []
    while left > 0:
        p = torch.nn.Parameter(torch.zeros(min(left, 2**20), device=device))
        p.grad = torch.ones_like(p)
        params.append(p)
        left -= p.numel()
    return GradSync(params, group, [], P2P(device, timeout), overlap=False)


def measure(args: argparse.Namespace, sizes: list[int], rank: int, world: int, device: torch.device) -> dict | None:
    """Every rank runs this; rank 0 gets the details dict, the others None."""
    hosts: list = [None] * world
    dist.all_gather_object(hosts, socket.gethostname())
    pairs = []
    for a in range(world):
        for b in range(a + 1, world):
            if rank in (a, b):
                one_way = ping_pong(rank, a, b, sizes, args.warmup, args.repeats, device, args.compute)
                if rank == a:
                    lat, bw = affine_fit(sizes, one_way)
                    pairs.append(
                        {
                            "ranks": [a, b],
                            "intra_node": hosts[a] == hosts[b],
                            "one_way_seconds": one_way,
                            "latency": lat,
                            "bandwidth": bw,
                        }
                    )
            dist.barrier()
    ar = allreduce_time(sizes, args.warmup, args.repeats, device, args.compute, args.timeout) if world > 1 else []
    if args.memory is not None:
        mem = float(args.memory)
    elif device.type == "cuda":
        mem = float(torch.cuda.mem_get_info(device)[0])
    else:
        mem = host_available_memory() / max(1, hosts.count(hosts[rank]))
    mine = {
        "rank": rank,
        "host": hosts[rank],
        "memory_bytes": mem,
        "runtime_memory_bytes": runtime_memory(device),
        "pairs": pairs,
    }
    gathered = [None] * world if rank == 0 else None
    dist.gather_object(mine, gathered, dst=0)
    if rank != 0:
        return None
    return {
        "hosts": hosts,
        "ranks": gathered,
        "sizes": sizes,
        "pairs": [p for g in gathered for p in g["pairs"]],
        "allreduce": _allreduce_details(sizes, ar, world),
        "backend": dist.get_backend(),
        "device": device.type,
    }


def _allreduce_details(sizes: list[int], seconds: list[float], world: int) -> dict:
    """The all-reduce's figures: per size, the largest's effective ring bandwidth, and the ring fit."""
    if not seconds:
        return {"bytes": sizes[-1], "seconds": 0.0, "ring_bandwidth": None}
    last = seconds[-1]
    lat, bw = ring_fit(sizes, seconds, world)
    return {
        "bytes": sizes[-1],
        "seconds": last,
        "sizes": sizes,
        "seconds_per_size": seconds,
        "ring_bandwidth": (2 * (world - 1) / world * sizes[-1] / last) if last > 0 else None,
        "latency": lat,
        "bandwidth": bw,
    }


def cluster_doc(details: dict, world: int, osf: float) -> dict:
    """The ``gpp-cluster/1`` document from the measured details (see the module docstring)."""
    hosts = details["hosts"]
    counts = {h: hosts.count(h) for h in hosts}
    intra = [p for p in details["pairs"] if p["intra_node"]]
    inter = [p for p in details["pairs"] if not p["intra_node"]]

    def med(ps, key, default):
        vals = [p[key] for p in ps if p[key] != float("inf")]
        return statistics.median(vals) if vals else default

    lat = med(details["pairs"], "latency", 0.0)
    intra_bw = med(intra, "bandwidth", None)
    inter_bw = med(inter, "bandwidth", None)
    if intra_bw is None and inter_bw is None:  # one rank: nothing to measure; a placeholder
        intra_bw = inter_bw = 1e12
    intra_bw = intra_bw if intra_bw is not None else inter_bw
    inter_bw = inter_bw if inter_bw is not None else intra_bw
    doc = {
        "format": "gpp-cluster/1",
        "devices": world,
        "memory_bytes": min(r["memory_bytes"] for r in details["ranks"]),
    }
    if len(set(counts.values())) == 1:
        doc["devices_per_node"] = next(iter(counts.values()))
    doc.update(
        {
            "intra_node_bandwidth": intra_bw,
            "inter_node_bandwidth": inter_bw,
            "latency": lat,
            "optimizer_state_factor": osf,
            "memory_overheads": True,
        }
    )  # the runtime's buffers and temporaries are priced
    runtime_memory_bytes = max((r.get("runtime_memory_bytes", 0.0) for r in details["ranks"]), default=0.0)
    if runtime_memory_bytes:
        doc["runtime_memory_bytes"] = runtime_memory_bytes
    ar = details.get("allreduce", {})
    if ar.get("bandwidth") not in (None, float("inf")):
        doc.update({"allreduce_bandwidth": ar["bandwidth"], "allreduce_latency": ar["latency"]})
    return doc


def _summary(details: dict, doc: dict) -> str:
    ranks = f"{doc['devices']} rank{'' if doc['devices'] == 1 else 's'}"
    hosts = len(set(details["hosts"]))
    lines = [f"{ranks} on {hosts} host{'' if hosts == 1 else 's'}, backend {details['backend']} ({details['device']})"]
    for kind, flag in (("intra-node", True), ("inter-node", False)):
        ps = [p for p in details["pairs"] if p["intra_node"] == flag]
        if ps:
            bws = [p["bandwidth"] for p in ps]
            lats = [p["latency"] for p in ps]
            lines.append(
                f"{kind}: {len(ps)} pair{'' if len(ps) == 1 else 's'}, bandwidth {min(bws) / 1e9:.3g}..{max(bws) / 1e9:.3g} GB/s, "
                f"latency {min(lats) * 1e6:.1f}..{max(lats) * 1e6:.1f} us"
            )
    ar = details["allreduce"]
    if ar["seconds"]:
        lines.append(
            f"all-reduce of {ar['bytes']} B over {ranks}: {ar['seconds'] * 1e3:.3f} ms "
            f"(ring bandwidth {ar['ring_bandwidth'] / 1e9:.3g} GB/s); ring fit: "
            f"{ar['bandwidth'] / 1e9:.3g} GB/s, latency {ar['latency'] * 1e6:.1f} us per step"
        )
    if "devices_per_node" not in doc:
        lines.append("hosts have different rank counts: devices_per_node left out (flat network)")
    lines.append(f"memory per device: {doc['memory_bytes'] / 2**30:.2f} GiB")
    if doc.get("runtime_memory_bytes"):
        lines.append(f"held by the runtime's libraries: {doc['runtime_memory_bytes'] / 2**20:.1f} MiB per device")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    logging.basicConfig(level=logging.INFO if rank == 0 else logging.WARNING, format="[probe] %(message)s")
    try:
        sizes = check_args(args)
    except ValueError as exc:  # every rank says it (as gpp_runtime.train does): torchrun may stop rank 0 first
        print(f"{'error:' if rank == 0 else f'[probe] rank {rank}: error:'} {exc}", file=sys.stderr, flush=True)
        return 2
    use_cuda = torch.cuda.is_available() and not args.cpu
    device = torch.device(f"cuda:{local_rank}" if use_cuda else "cpu")
    if use_cuda:
        torch.cuda.set_device(device)
    dist.init_process_group(
        "nccl" if use_cuda else "gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=args.timeout)
    )
    lower_transport_threads(dist.get_backend())  # as the runtime's ranks have them (engine.p2p)
    try:
        details = measure(args, sizes, rank, world, device)
        dist.barrier()
    except RuntimeError as exc:
        print(f"[probe] rank {rank}: error: {str(exc).splitlines()[0]}", file=sys.stderr, flush=True)
        os._exit(1)
    if details is not None:
        doc = cluster_doc(details, world, args.optimizer_state_factor)
        save_cluster(cluster_from_dict(doc), args.output)  # validates the document on the way
        logger.info("%s", _summary(details, doc))
        logger.info("wrote %s", args.output)
        if args.details:
            with open(args.details, "w") as f:
                json.dump({**details, "cluster": doc}, f, indent=1)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    _code = main()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(_code)  # skip interpreter teardown of c10d objects (see gpp_runtime.train)
