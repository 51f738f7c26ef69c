"""Gloo's transport thread yields its core to the compute thread (engine.p2p.lower_transport_threads)."""

import os
import sys
import time

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

from gpp_runtime.engine.p2p import GLOO_LOOP_THREAD, TRANSPORT_NICE, lower_transport_threads  # noqa: E402

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="thread priorities are read from /proc")


def _loop_threads() -> dict[int, int]:
    """This process's gloo transport threads -> their nice."""
    out = {}
    for tid in os.listdir(f"/proc/{os.getpid()}/task"):
        try:
            with open(f"/proc/{os.getpid()}/task/{tid}/comm") as f:
                if f.read().strip() == GLOO_LOOP_THREAD:
                    out[int(tid)] = os.getpriority(os.PRIO_PROCESS, int(tid))
        except OSError:
            continue
    return out


def _new_loop_threads(earlier: set[int], want: int, wait: float = 10.0) -> dict[int, int]:
    """The loop threads not in ``earlier``, waiting up to ``wait`` seconds for ``want`` of them: a new
    thread names itself once it runs, which on a loaded machine may be after ``new_group`` returns."""
    until = time.monotonic() + wait
    while True:
        new = {t: n for t, n in _loop_threads().items() if t not in earlier}
        if len(new) >= want or time.monotonic() > until:
            return new
        time.sleep(0.01)


def test_gloo_loop_threads_get_the_lowest_priority_and_other_backends_nothing():
    assert not dist.is_initialized()
    earlier = set(_loop_threads())  # threads of groups an earlier test made and destroyed may linger
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        group = dist.new_group([0])  # a second group: a second thread
        before = _new_loop_threads(earlier, 2)
        assert len(before) >= 2, before
        assert all(n < TRANSPORT_NICE for n in before.values()), before
        assert lower_transport_threads("nccl") == 0
        assert {t: n for t, n in _loop_threads().items() if t in before} == before
        assert lower_transport_threads("gloo") >= len(before)  # lingering ones of earlier tests too
        assert {n for t, n in _loop_threads().items() if t in before} == {TRANSPORT_NICE}
        assert lower_transport_threads("gloo") == 0  # already there
        assert os.getpriority(os.PRIO_PROCESS, 0) < TRANSPORT_NICE  # the compute thread keeps its own
        t = torch.ones(3)
        dist.all_reduce(t, group=group)  # the group still works
        assert t.tolist() == [1.0, 1.0, 1.0]
    finally:
        dist.destroy_process_group()
