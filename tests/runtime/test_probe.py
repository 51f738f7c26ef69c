"""``gpp_runtime.probe`` under a real torchrun (2 gloo ranks, small messages): a valid gpp-cluster/1."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpp_runtime.probe import affine_fit, check_args, cluster_doc, host_available_memory, parse_args, ring_fit
from gpp_solver import load_cluster

REPO = Path(__file__).resolve().parents[2]
SPEC_FIELDS = {
    "format",
    "devices",
    "memory_bytes",
    "devices_per_node",
    "intra_node_bandwidth",
    "inter_node_bandwidth",
    "latency",
    "optimizer_state_factor",
    "allreduce_bandwidth",
    "allreduce_latency",
    "memory_overheads",
}


def _probe(nproc: int, args: list[str]):
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={nproc}",
        "-m",
        "gpp_runtime.probe",
        "--cpu",
        *args,
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)


def test_two_ranks_write_a_valid_cluster(tmp_path):
    out, det = tmp_path / "cluster.json", tmp_path / "details.json"
    res = _probe(
        2,
        [
            "-o",
            str(out),
            "--sizes",
            "4,16384,262144",
            "--repeats",
            "3",
            "--warmup",
            "1",
            "--details",
            str(det),
            "--optimizer-state-factor",
            "2",
        ],
    )
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    doc = json.loads(out.read_text())
    assert set(doc) == SPEC_FIELDS
    c = load_cluster(out)
    assert c.devices == 2 and c.devices_per_node == 2  # one host: both ranks in one node
    assert c.optimizer_state_factor == 2.0
    assert c.memory_overheads  # the runtime's own buffers and temporaries are priced
    assert 0 < c.latency < 0.5
    assert 1e6 < c.intra_node_bandwidth < 1e12
    assert c.inter_node_bandwidth == c.intra_node_bandwidth  # no inter-node pair on one host
    d = json.loads(det.read_text())
    assert [p["ranks"] for p in d["pairs"]] == [[0, 1]] and d["pairs"][0]["intra_node"]
    assert d["allreduce"]["seconds"] > 0 and d["backend"] == "gloo"
    # the all-reduce measured at every size and fitted to the ring model the cost model prices
    ar = d["allreduce"]
    assert ar["sizes"] == [4, 16384, 262144] and len(ar["seconds_per_size"]) == 3
    assert (c.allreduce_latency, c.allreduce_bandwidth) == pytest.approx(
        ring_fit(ar["sizes"], ar["seconds_per_size"], 2)
    )
    assert 1e6 < c.allreduce_bandwidth < 1e12 and 0 <= c.allreduce_latency < 0.5
    # memory: the host's available RAM shared by its 2 ranks (the smallest over ranks)
    assert 0 < c.memory_bytes <= host_available_memory() / 2 * 1.5
    assert "intra-node: 1 pair," in res.stderr + res.stdout and "2 ranks on 1 host," in res.stderr + res.stdout


def test_memory_flag_and_bad_arguments(tmp_path):
    args = parse_args(["-o", "x.json", "--memory", "123456789", "--sizes", "4,4096"])
    assert check_args(args) == [4, 4096] and args.memory == 123456789
    for bad, msg in (
        (["--sizes", "4096"], "at least two distinct sizes"),
        (["--memory", "-1"], "--memory"),
        (["--sizes", "4,x"], "comma-separated integers"),
        (["--compute-seconds", "-0.1"], "--compute-seconds"),
        (["--compute-seconds", "nan"], "--compute-seconds"),
    ):
        with pytest.raises(ValueError, match=msg):
            check_args(parse_args(["-o", "x.json", *bad]))
    # rank 0 says what is wrong in one line and exits 2 before joining a process group
    res = subprocess.run(
        [sys.executable, "-m", "gpp_runtime.probe", "-o", str(tmp_path / "c.json"), "--sizes", "4096"],
        cwd=REPO,
        env=dict(os.environ),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 2 and "error: --sizes needs at least two distinct sizes" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1
    # another rank says it too (torchrun may stop rank 0 before it prints), naming itself
    res = subprocess.run(
        [sys.executable, "-m", "gpp_runtime.probe", "-o", str(tmp_path / "c.json"), "--sizes", "4096"],
        cwd=REPO,
        env={**os.environ, "RANK": "1", "WORLD_SIZE": "2"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 2 and res.stderr.strip().startswith("[probe] rank 1: error: --sizes")


def test_affine_fit_and_cluster_doc_by_host():
    lat, bw = affine_fit([4, 1004], [1e-5, 1e-5 + 1e-6])
    assert lat == pytest.approx(1e-5) and bw == pytest.approx(1e9)
    # noise made the largest transfer look as fast as the smallest: a finite, conservative bandwidth
    lat, bw = affine_fit([4, 16384, 262144], [2e-4, 1e-4, 1.5e-4])
    assert lat == pytest.approx(2e-4) and bw == pytest.approx(262144 / 1.5e-4)
    pairs = [
        {"ranks": [0, 1], "intra_node": True, "latency": 1e-5, "bandwidth": 10e9},
        {"ranks": [0, 2], "intra_node": False, "latency": 3e-5, "bandwidth": 1e9},
        {"ranks": [1, 3], "intra_node": False, "latency": 3e-5, "bandwidth": 3e9},
        {"ranks": [2, 3], "intra_node": True, "latency": 1e-5, "bandwidth": 20e9},
    ]
    details = {
        "hosts": ["a", "a", "b", "b"],
        "pairs": pairs,
        "ranks": [{"memory_bytes": m} for m in (4e9, 3e9, 5e9, 6e9)],
    }
    doc = cluster_doc(details, 4, 4.0)
    assert doc["devices_per_node"] == 2 and doc["memory_bytes"] == 3e9
    assert doc["intra_node_bandwidth"] == 15e9 and doc["inter_node_bandwidth"] == 2e9
    details["hosts"] = ["a", "a", "a", "b"]  # uneven hosts: flat network, no devices_per_node
    assert "devices_per_node" not in cluster_doc(details, 4, 4.0)


def test_ring_fit_inverts_the_ring_model():
    """Times made by the cost model's ring formula give back its latency and bandwidth."""
    from gpp_solver.cost import allreduce_time as priced

    for n in (2, 3, 8):
        sizes = [4, 65536, 4194304]
        secs = [priced(s, n, 2e9, 3e-5) for s in sizes]
        lat, bw = ring_fit(sizes, secs, n)
        assert lat == pytest.approx(3e-5) and bw == pytest.approx(2e9)
    # noise: the largest no slower than the smallest -> a finite bandwidth, latency >= 0
    lat, bw = ring_fit([4, 1024], [1e-3, 5e-4], 2)
    assert bw == pytest.approx(1024 / 5e-4) and lat >= 0
    details = {
        "hosts": ["a", "a"],
        "pairs": [{"ranks": [0, 1], "intra_node": True, "latency": 1e-5, "bandwidth": 1e9}],
        "ranks": [{"memory_bytes": 1e9}] * 2,
        "allreduce": {"bandwidth": 5e8, "latency": 2e-5},
    }
    doc = cluster_doc(details, 2, 4.0)
    assert (doc["allreduce_bandwidth"], doc["allreduce_latency"]) == (5e8, 2e-5)


def test_cluster_doc_of_one_rank_is_valid():
    from gpp_solver.formats.cluster import cluster_from_dict

    doc = cluster_doc({"hosts": ["a"], "pairs": [], "ranks": [{"memory_bytes": 2e9}]}, 1, 4.0)
    c = cluster_from_dict(doc)
    assert c.devices == 1 and c.latency == 0.0 and c.inter_node_bandwidth > 0


def test_ring_fit_holds_the_small_sizes():
    """gloo's all-reduce on two CPU ranks (a probe's figures): the fit weighs each size by its
    time, so the smallest all-reduce is priced within 15% (a plain least-squares fit, ruled by the
    4 MiB one, priced it 44% low)."""
    from gpp_solver.cost import allreduce_time as priced

    sizes = [4, 65536, 1048576, 4194304]
    secs = [3.169e-4, 5.745e-4, 1.1341e-3, 6.4923e-3]
    lat, bw = ring_fit(sizes, secs, 2)
    assert abs(priced(sizes[0], 2, bw, lat) / secs[0] - 1) < 0.15
    assert all(abs(priced(s, 2, bw, lat) / t - 1) < 0.35 for s, t in zip(sizes, secs))


def test_work_between_messages_keeps_the_core_busy_for_the_time_asked():
    import time

    from gpp_runtime.probe import compute_for

    assert parse_args(["-o", "x.json"]).compute == 0.005  # the default: as a training step between messages
    cpu0, t0 = time.process_time(), time.perf_counter()
    compute_for(0.05)
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    assert wall >= 0.05 and cpu > 0.01  # computed, not slept (a sleep uses no CPU time)
    t0 = time.perf_counter()
    compute_for(0.0)
    assert time.perf_counter() - t0 < 0.01


def test_only_the_rank_that_starts_a_round_trip_works_before_it(monkeypatch):
    """The other rank waits for the message (as a pipeline's next stage does): were it to work too,
    the round trip would time whatever part of its work was left (a skew, not a latency)."""
    import torch

    import gpp_runtime.probe as probe

    worked = []
    monkeypatch.setattr(probe, "compute_for", lambda s: worked.append(s))

    class Done:
        def wait(self):
            return True

    monkeypatch.setattr(probe.dist, "isend", lambda buf, peer: Done())
    monkeypatch.setattr(probe.dist, "irecv", lambda buf, peer: Done())
    cpu = torch.device("cpu")
    assert probe.ping_pong(0, 0, 1, [64], 1, 3, cpu, compute=0.005)[0] >= 0
    assert worked == [0.005] * 4  # rank a: before each of warm-up + repeats
    worked.clear()
    probe.ping_pong(1, 0, 1, [64], 1, 3, cpu, compute=0.005)
    assert worked == []  # rank b only waits


def test_typical_time_is_the_mean_of_the_middle_80_percent():
    """A step's time is a mean over steps, so a message's is priced at its mean: a mixture of fast
    and slow messages (a rank woken late) at its share of slow ones, where a median jumps between
    the modes; the fastest and slowest tenth are left out (a one-off stall of the host)."""
    from gpp_runtime.calibration.probe_fit import typical

    fast, slow = 0.2e-3, 3e-3
    mixture = [fast] * 12 + [slow] * 8  # 40% slow: the median is the fast mode
    assert typical(mixture) == pytest.approx((10 * fast + 6 * slow) / 16)
    assert typical([1.0] * 18 + [100.0, 0.0]) == pytest.approx(1.0)  # one stall, one glitch: dropped
    assert typical([2.0]) == 2.0
    with pytest.raises(ValueError):
        typical([])


def test_sizes_take_turns_within_each_repeat(monkeypatch, tmp_path):
    """Every repeat times each size once, so a slow stretch of the machine weighs on all sizes alike
    (the ring fit's slope is a difference between sizes); the warm-up repeats are left out. The
    all-reduce is the runtime's own (``GradSync.finish``: a flat copy per bucket, summed, copied
    back), so its figure includes the copies."""
    import datetime

    import torch
    import torch.distributed as dist

    import gpp_runtime.probe as probe

    order = []
    monkeypatch.setattr(probe, "compute_for", lambda s: None)

    class Done:
        def wait(self, timeout=None):
            return True

    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1, timeout=datetime.timedelta(seconds=30))
    try:
        real = dist.all_reduce
        monkeypatch.setattr(dist, "all_reduce", lambda t, **kw: order.append(t.numel() * 4) or real(t, **kw))
        cpu = torch.device("cpu")
        times = probe.allreduce_time([4, 64, 1024], 1, 2, cpu)
        assert len(times) == 3 and order == [4, 64, 1024] * 3
        ticks = iter([9.0, 1.0, 2.0, 3.0])  # the first repeat is warm-up: left out
        assert probe.in_turns(["a", "b"], 1, 1, lambda item: next(ticks)) == [2.0, 3.0]
        big = probe._gradients(5 * 2**20 * 4, dist.new_group([0]), cpu, 30)  # 5 Mi floats: 5 tensors of 4 MiB
        assert len(big.buckets) == 1 and sum(p.numel() for p in big.buckets[0]) == 5 * 2**20
    finally:
        dist.destroy_process_group()
    order.clear()
    monkeypatch.setattr(probe.dist, "isend", lambda buf, peer: order.append(buf.numel() * 4) or Done())
    monkeypatch.setattr(probe.dist, "irecv", lambda buf, peer: Done())
    assert len(probe.ping_pong(0, 0, 1, [4, 64], 0, 2, torch.device("cpu"))) == 2 and order == [4, 64, 4, 64]


def test_runtime_memory_is_the_largest_rank_s_and_absent_on_the_cpu():
    """The libraries' workspaces (``runtime_memory``: cuBLAS's on CUDA) go into the cluster as the
    largest over ranks; a CPU rank measures none and the field is left out."""
    import torch

    from gpp_runtime.engine.memory import runtime_memory
    from gpp_solver.formats.cluster import cluster_from_dict

    assert runtime_memory(torch.device("cpu")) == 0.0
    ranks = [
        {"memory_bytes": 2e9, "runtime_memory_bytes": 65 * 2**20},
        {"memory_bytes": 3e9, "runtime_memory_bytes": 64 * 2**20},
    ]
    doc = cluster_doc({"hosts": ["a", "a"], "pairs": [], "ranks": ranks}, 2, 4.0)
    assert doc["runtime_memory_bytes"] == 65 * 2**20
    assert cluster_from_dict(doc).runtime_memory_bytes == 65 * 2**20
    cpu = [{"memory_bytes": 2e9, "runtime_memory_bytes": 0.0}]
    assert "runtime_memory_bytes" not in cluster_doc({"hosts": ["a"], "pairs": [], "ranks": cpu}, 1, 4.0)
