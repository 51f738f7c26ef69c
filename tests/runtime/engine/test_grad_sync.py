"""The data-parallel all-reduce is launched bucket by bucket during the last backward (as DDP)."""

from __future__ import annotations

import datetime
import time

import pytest
import torch
import torch.distributed as dist
from torch import nn

from gpp_runtime.engine.grad_sync import GradSync
from gpp_runtime.engine.p2p import P2P


@pytest.fixture
def group(tmp_path):
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1, timeout=datetime.timedelta(seconds=30))
    try:
        yield dist.new_group([0])
    finally:
        dist.destroy_process_group()


def test_buckets_launch_in_order_during_the_armed_backward(group):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4), nn.Linear(4, 2))
    params = list(model.parameters())
    sync = GradSync(params, group, [], P2P(torch.device("cpu"), 30), bucket_cap_bytes=40)
    # reverse registration order (the order backward produces gradients), at most 40 bytes each
    assert [[tuple(p.shape) for p in b] for b in sync.buckets] == [[(2,), (2, 4)], [(4,)], [(4, 4)], [(4,)], [(4, 4)]]
    launched_during_backward = []
    model[0].weight.register_post_accumulate_grad_hook(lambda p: launched_during_backward.append(sync.launched))
    x = torch.randn(3, 4)
    model(x).sum().backward()  # not armed: an earlier micro-batch, nothing launched
    assert sync.launched == 0 and launched_during_backward == [0]
    sync.arm()
    model(x).sum().backward()
    # by the time the first layer's weight gradient is final, the head's and the middle layer's
    # buckets are already in flight: the all-reduce overlaps the rest of the backward pass
    assert launched_during_backward[-1] >= 3
    grads = [p.grad.clone() for p in params]
    sync.finish(0)
    assert all(torch.equal(g, p.grad) for g, p in zip(grads, params))  # world 1: the sum is itself
    assert sync.launched == 0


def test_without_overlap_every_bucket_waits_for_finish(group):
    """``overlap=False`` (the cost model's all-reduce, after the last backward): nothing is launched
    during the armed backward; ``finish`` launches every bucket and the sums are written back."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2))
    params = list(model.parameters())
    sync = GradSync(params, group, [], P2P(torch.device("cpu"), 30), bucket_cap_bytes=40, overlap=False)
    assert len(sync.buckets) >= 3
    seen = []
    model[0].weight.register_post_accumulate_grad_hook(lambda p: seen.append(sync.launched))
    sync.arm()
    model(torch.randn(3, 4)).sum().backward()
    assert seen == [0] and sync.launched == 0
    grads = [p.grad.clone() for p in params]
    sync.finish(0)
    assert all(torch.equal(g, p.grad) for g, p in zip(grads, params)) and sync.launched == 0


def test_emulated_all_reduce_sleeps_the_modelled_time_after_the_last_backward(group):
    from gpp_runtime.engine.metrics import Recorder

    model = nn.Linear(4, 2)
    rec = Recorder(rank=0, stage=0)
    sync = GradSync(list(model.parameters()), group, [], P2P(torch.device("cpu"), 30), rec=rec, emulate_seconds=0.08)
    sync.arm()
    model(torch.randn(3, 4)).sum().backward()  # hooks fire, but emulation launches no bucket
    assert sync.launched == 0
    grads = [p.grad.clone() for p in model.parameters()]
    backward_end = time.time() - 0.03  # the last backward ended 30 ms ago
    rec.event("B0", backward_end - 0.01, backward_end, "compute")
    rec.event("wait sends", backward_end, time.time(), "wait")
    sync.finish(0)
    done = time.time()
    assert backward_end + 0.08 <= done <= backward_end + 0.08 + 0.05  # A(S) from the backward's end
    assert all(torch.equal(g, p.grad) for g, p in zip(grads, model.parameters()))
    name, t0, t1, cat = rec.events[-1]
    assert name == "all-reduce wait" and cat == "comm" and t1 - t0 >= 0.04
    real = GradSync(list(nn.Linear(4, 2).parameters()), group, [], P2P(torch.device("cpu"), 30))
    real.finish(0)  # the default stays the real all-reduce: missing gradients are zero-filled
    assert all(p.grad is not None for b in real.buckets for p in b)


def test_loss_rides_in_the_last_bucket_held_for_finish(group, monkeypatch):
    """The sink's replicas sum their parts of the loss in the gradients' last all-reduce: with
    ``fold_last`` the last bucket is not launched during the armed backward (even with overlap),
    ``finish(sid, extra=loss)`` launches it with the loss appended, one collective per bucket and
    none more; a tensor that can't ride (another dtype) is refused by ``finish`` and reported by
    ``can_fold``."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2))
    params = list(model.parameters())
    sync = GradSync(params, group, [], P2P(torch.device("cpu"), 30), bucket_cap_bytes=40, fold_last=True)
    n = len(sync.buckets)
    assert n >= 3
    sync.arm()
    loss = model(torch.randn(3, 4)).sum()
    loss.backward()
    assert sync.launched == n - 1  # every bucket but the last is in flight
    calls = []
    real = dist.all_reduce
    monkeypatch.setattr(dist, "all_reduce", lambda t, **kw: calls.append(t.numel()) or real(t, **kw))
    value = loss.detach().clone()
    assert sync.can_fold(value) and not sync.can_fold(value.double())
    with pytest.raises(ValueError, match="can't ride"):
        sync.finish(0, extra=value.double())
    grads = [p.grad.clone() for p in params]
    sync.finish(0, extra=value)
    last = sum(p.numel() for p in sync.buckets[-1])
    assert calls == [last + 1]  # the last bucket and the loss, in one all-reduce
    assert torch.equal(value, loss.detach())  # world 1: the sum is itself, written back in place
    assert all(torch.equal(g, p.grad) for g, p in zip(grads, params)) and sync.launched == 0


def _fold_worker(rank: int, store_path: str, out) -> None:
    store = dist.FileStore(store_path, 2)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=2, timeout=datetime.timedelta(seconds=60))
    try:
        torch.manual_seed(0)
        model = nn.Linear(3, 2)
        sync = GradSync(
            list(model.parameters()), dist.new_group([0, 1]), [], P2P(torch.device("cpu"), 60), fold_last=True
        )
        sync.arm()
        loss = model(torch.full((2, 3), float(rank + 1))).sum()
        loss.backward()
        value = loss.detach().clone()
        sync.finish(0, extra=value)
        out.put((rank, float(value), model.weight.grad.tolist()))
    finally:
        dist.destroy_process_group()


def test_folded_loss_is_the_sum_over_two_replicas(tmp_path):
    """Two gloo replicas: the folded loss comes back as the sum of both parts, the gradients as the
    sum of both replicas' gradients."""
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_fold_worker, args=(r, str(tmp_path / "store"), out)) for r in range(2)]
    for p in procs:
        p.start()
    got = dict((r, (v, g)) for r, v, g in (out.get(timeout=120) for _ in procs))
    for p in procs:
        p.join(60)
    torch.manual_seed(0)
    model = nn.Linear(3, 2)
    parts = [model(torch.full((2, 3), float(r + 1))).sum() for r in range(2)]
    total = float(sum(p.detach() for p in parts))
    (parts[0] + parts[1]).backward()
    for r in range(2):
        assert got[r][0] == pytest.approx(total)
        assert torch.allclose(torch.tensor(got[r][1]), model.weight.grad)
