"""Gradient synchronisation inside a pipeline step: data-parallel buckets and tied weights.

Data parallelism (as DDP does): the stage's parameters are cut into buckets of about
``bucket_cap_bytes`` in reverse registration order (the order backward produces them); during
the rank's last backward of the step a ``register_post_accumulate_grad_hook`` marks each
parameter ready, and every bucket whose parameters are all ready is all-reduced asynchronously
(buckets are launched strictly in index order, so every replica issues the same collectives in
the same order), overlapping the rest of the backward pass. ``finish`` launches what is left
(parameters with no gradient in the last backward), waits, and copies the sums back.

``overlap=False`` runs the all-reduce as the cost model prices it: every bucket is launched by
``finish``, after the last backward, so the all-reduce neither overlaps nor slows that backward
(``GraphPipeline`` does this on gloo: CPU ranks share their core with gloo's threads, and an
overlapped all-reduce slowed the backward it overlapped by 21-90% and took 1.8-2.8x its own time).

The step's loss (the sink stage's replicas each hold their samples' part) rides in the last
bucket's all-reduce (``finish(sid, extra=loss)``): one collective a step, not two; with
``fold_last`` the last bucket waits for ``finish`` to be launched with it. On a 2-vCPU VM a
second, separate all-reduce of the loss cost 1.0 ms a step on average (median 0.2 ms: a rank that
blocks on a collective is sometimes woken milliseconds late), on a 2.4 ms step of BERT tiny.

Tied weights: a parameter object used by several stages (a GPT-2 head tied to the embedding) has
one copy per stage; its gradient is summed over every rank that holds a copy (all replicas of
all those stages, one process group per distinct set of ranks) after the step, so the copies
stay equal under any deterministic optimizer. Such parameters are left out of the buckets.

Emulated all-reduce (``emulate_seconds``, set by emulated workloads only, see ``gpp_runtime.emulate``):
instead of the buckets, ``finish`` all-reduces one number over the data-parallel group (the
latest replica's end of its last backward: replicas still synchronise) and sleeps until
``emulate_seconds`` have passed since then. The real all-reduce is the default.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

from .p2p import P2P


class GradSync:
    """Sums gradients over data-parallel replicas (bucketed, overlapped) and tied copies."""

    def __init__(
        self,
        params: list[torch.nn.Parameter],
        dp_group,
        tied: list[tuple[object, list]],
        comm: P2P,
        bucket_cap_bytes: int = 25 * 2**20,
        rec=None,
        emulate_seconds: float | None = None,
        overlap: bool = True,
        fold_last: bool = False,
    ) -> None:
        tied_ids = {id(p) for _g, ps in tied for p in ps}
        self.dp_group = dp_group
        self.tied = tied
        self.comm = comm
        self.rec = rec
        self.emulate_seconds = emulate_seconds
        self.overlap = overlap
        self.fold_last = fold_last
        self.buckets: list[list[torch.nn.Parameter]] = []
        if dp_group is not None:
            size = 0
            for p in reversed([p for p in params if id(p) not in tied_ids and p.requires_grad]):
                if not self.buckets or size + p.numel() * p.element_size() > bucket_cap_bytes:
                    self.buckets.append([])
                    size = 0
                self.buckets[-1].append(p)
                size += p.numel() * p.element_size()
        self._bucket_of = {id(p): i for i, b in enumerate(self.buckets) for p in b}
        self._hooks = [p.register_post_accumulate_grad_hook(self._ready) for b in self.buckets for p in b]
        self._armed = False
        self._reset()

    def _reset(self) -> None:
        self._missing = [len(b) for b in self.buckets]
        self._seen: set[int] = set()
        self._next = 0
        self._flight: list[tuple[int, torch.Tensor, object]] = []

    @property
    def launched(self) -> int:
        """Buckets whose all-reduce is in flight this step."""
        return len(self._flight)

    def arm(self) -> None:
        """Call before the rank's last backward of the step: gradients are final from now on."""
        self._armed = True

    def _ready(self, p: torch.Tensor) -> None:
        if not self._armed or not self.overlap or id(p) in self._seen or self.emulate_seconds is not None:
            return
        self._seen.add(id(p))
        i = self._bucket_of[id(p)]
        self._missing[i] -= 1
        last = len(self.buckets) - (1 if self.fold_last else 0)
        while self._next < last and self._missing[self._next] == 0:
            self._launch(self._next)

    def _launch(self, i: int, extra: torch.Tensor | None = None) -> None:
        for p in self.buckets[i]:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        parts = [p.grad.reshape(-1) for p in self.buckets[i]]
        flat = torch.cat(parts + ([extra.detach().reshape(-1)] if extra is not None else []))
        self._flight.append((i, flat, dist.all_reduce(flat, group=self.dp_group, async_op=True)))
        self._next = i + 1

    def can_fold(self, extra: torch.Tensor) -> bool:
        """Whether ``finish(sid, extra=...)`` can sum ``extra`` in the last bucket's all-reduce."""
        if self.dp_group is None or self.emulate_seconds is not None or not self.buckets:
            return False
        if self._next >= len(self.buckets):  # the last bucket is already in flight
            return False
        p = self.buckets[-1][0]
        return extra.dtype == p.dtype and extra.device == p.device

    def finish(self, sid: int, extra: torch.Tensor | None = None) -> None:
        """After the step's last backward: complete every all-reduce and write the sums back.

        ``extra`` (where :meth:`can_fold` says so): a tensor summed over the replicas in place, in
        the last bucket's all-reduce.
        """
        t0 = time.time()
        if extra is not None and not self.can_fold(extra):
            raise ValueError("finish(extra=...): this tensor can't ride in the last bucket (see can_fold)")
        if self.emulate_seconds is not None and self.dp_group is not None:
            self._emulated(sid, t0)
        while self.emulate_seconds is None and self._next < len(self.buckets):
            last = self._next == len(self.buckets) - 1
            self._launch(self._next, extra if last else None)
        for i, flat, work in self._flight:
            self.comm.wait(work, f"gradient all-reduce of stage {sid} (bucket {i})")
            offset = 0
            for p in self.buckets[i]:
                n = p.numel()
                p.grad.copy_(flat[offset : offset + n].view_as(p))
                offset += n
            if extra is not None and i == len(self.buckets) - 1:
                with torch.no_grad():
                    extra.copy_(flat[offset:].view_as(extra))
            if flat.device.type == "cpu":
                # the sums are copied out: free the bucket now, not when the backend's worker
                # thread drops its reference to the finished work (on a rank's shared core, often
                # only during the optimizer step, whose temporaries then come on top of it)
                flat.untyped_storage().resize_(0)
        works = []
        for group, ps in self.tied:
            for p in ps:
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
                works.append((dist.all_reduce(p.grad, group=group, async_op=True), p))
        for work, _p in works:
            self.comm.wait(work, f"gradient all-reduce of a weight tied across stages (stage {sid})")
        self._armed = False
        self._reset()
        if self.rec is not None and (self.buckets or self.tied):
            self.rec.event("all-reduce wait", t0, time.time(), "comm")

    def _emulated(self, sid: int, t0: float) -> None:
        """One number all-reduced (MAX) over the replicas, then sleep to ``emulate_seconds`` after it."""
        end = t0
        for _name, _a, b, cat in reversed(self.rec.events if self.rec is not None else []):
            if cat == "compute":  # the last backward's end (only "wait sends" comes after it)
                end = b
                break
        device = self.buckets[0][0].device if self.buckets else self.comm.device
        t = torch.tensor([end], dtype=torch.float64, device=device)
        work = dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.dp_group, async_op=True)
        self.comm.wait(work, f"emulated gradient all-reduce of stage {sid}")
        time.sleep(max(0.0, float(t.item()) + self.emulate_seconds - time.time()))
