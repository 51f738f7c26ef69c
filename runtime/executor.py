"""Run one rank's share of a training step: its lowered actions, in order.

Forward ``F j`` slices the model inputs it reads from ``workload.sample(B, step)`` to its chunk,
assembles each remote activation from the received pieces (``torch.cat`` of leaves that require
grad, so each piece gets its own gradient), runs the stage module, computes
``loss(output, target) / B`` if it holds the sink, and sends the rows each consumer chunk needs.
Backward ``B j`` assembles each output's gradient from the pieces received from every consumer
stage (pieces of one stage tile the rows; different stages are summed), back-propagates, and
sends each received piece's gradient back to its producer.

Receives are posted ``lookahead`` compute actions ahead, in the lowered order.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from runtime.actions import Action, Chunk, Message, chunk
from runtime.fx_split import StageProgram
from runtime.metrics import Recorder
from runtime.p2p import P2P
from runtime.plan_io import StagePlan


@dataclass
class _Step:
    """One compute action with the receives before it and the sends after it."""

    act: Action
    recvs: list[Message] = field(default_factory=list)
    sends: list[Message] = field(default_factory=list)


def group_actions(actions: list[Action]) -> list[_Step]:
    """Attach each send/recv to its compute action (recvs precede it, sends follow it)."""
    steps: list[_Step] = []
    pending: list[Message] = []
    for a in actions:
        if a.op == "recv":
            pending.append(a.msg)
        elif a.op == "send":
            steps[-1].sends.append(a.msg)
        else:
            steps.append(_Step(a, recvs=pending))
            pending = []
    return steps


class StageExecutor:
    """Executes the actions of one rank (one replica of one stage) for each training step."""

    def __init__(self, program: StageProgram, stage: StagePlan, replica: int, rank: int,
                 actions: list[Action], meta: dict[str, tuple[tuple[int, ...], torch.dtype]],
                 loss_fn, mini_batch: int, device: torch.device, comm: P2P, rec: Recorder,
                 lookahead: int = 2) -> None:
        self.program = program
        self.stage = stage
        self.replica = replica
        self.rank = rank
        self.steps = group_actions(actions)
        self.meta = meta
        self.loss_fn = loss_fn
        self.mini_batch = mini_batch
        self.device = device
        self.comm = comm
        self.rec = rec
        self.lookahead = lookahead
        self.out_index = {key: i for i, (kind, key) in enumerate(program.outputs) if kind == "act"}
        self.param_ptrs = {p.untyped_storage().data_ptr() for p in program.module.parameters()}
        self._saved: dict[int, int] = {}  # micro-batch -> saved-activation bytes
        self.saved_now = 0
        self.saved_peak = 0

    # -- one training step -------------------------------------------------------------------
    def run_step(self, inputs: tuple, target) -> float:
        """Run all actions of one step; returns the summed loss of this rank's samples (0 if none)."""
        inputs = tuple(x.to(self.device) for x in inputs)
        target = target.to(self.device) if self.program.holds_sink else None
        state: dict[int, tuple] = {}
        posted: dict[Message, tuple[torch.Tensor, object]] = {}
        next_post = 0
        loss_sum = None
        for i, st in enumerate(self.steps):
            while next_post < len(self.steps) and next_post <= i + self.lookahead:
                for m in self.steps[next_post].recvs:
                    posted[m] = self._post_recv(m)
                next_post += 1
            t0 = time.time()
            bufs = {}
            for m in st.recvs:
                buf, work = posted.pop(m)
                self.comm.wait(work, f"receive of {m}")
                bufs[m] = buf
            t1 = time.time()
            if t1 - t0 > 1e-5:
                self.rec.event("wait", t0, t1, "wait")
            c = chunk(self.stage, st.act.mb, self.replica)
            if st.act.op == "F":
                loss = self._forward(st, c, bufs, inputs, target, state)
                if loss is not None:
                    loss_sum = loss.detach() if loss_sum is None else loss_sum + loss.detach()
            else:
                self._backward(st, c, bufs, state)
            if self.device.type == "cuda":  # so that the recorded compute time is real
                torch.cuda.synchronize(self.device)
            self.rec.event(str(st.act), t1, time.time(), "compute")
        t0 = time.time()
        self.comm.wait_sends()
        self.rec.event("wait sends", t0, time.time(), "wait")
        return 0.0 if loss_sum is None else float(loss_sum) * self.mini_batch

    def _post_recv(self, m: Message):
        shape, dtype = self.meta[m.value]
        src = m.src.rank if m.kind == "act" else m.dst.rank
        return self.comm.irecv((m.hi - m.lo, *shape), dtype, src)

    # -- forward / backward --------------------------------------------------------------------
    def _forward(self, st: _Step, c: Chunk, bufs: dict, inputs: tuple, target, state: dict):
        args = []
        leaves: dict[tuple, torch.Tensor] = {}
        for kind, key in self.program.inputs:
            if kind == "input":
                args.append(inputs[key][c.lo:c.hi])
                continue
            pieces = []
            for m in st.recvs:
                if m.value == key:
                    t = bufs[m]
                    if t.is_floating_point():
                        t.requires_grad_(True)
                        leaves[(m.value, m.src, m.dst)] = t
                    pieces.append(t)
            args.append(pieces[0] if len(pieces) == 1 else torch.cat(pieces))
        self._saved[c.mb] = 0
        with torch.autograd.graph.saved_tensors_hooks(self._make_pack(c.mb), lambda t: t):
            outs = self.program.module(*args)
            loss = None
            if self.program.holds_sink:
                loss = self.loss_fn(outs[-1], target[c.lo:c.hi]) / self.mini_batch
        for m in st.sends:
            t = outs[self.out_index[m.value]][m.lo - c.lo:m.hi - c.lo].detach().contiguous()
            self.comm.isend(t, m.dst.rank, f"send of {m}")
        state[c.mb] = (leaves, outs, loss)
        return loss

    def _backward(self, st: _Step, c: Chunk, bufs: dict, state: dict) -> None:
        leaves, outs, loss = state.pop(c.mb)
        by_out: dict[int, dict[int, list[torch.Tensor]]] = {}
        for m in st.recvs:  # sample order within each consumer stage
            by_out.setdefault(self.out_index[m.value], {}).setdefault(m.dst.stage, []).append(bufs[m])
        roots, grads = [], []
        for idx, per_stage in by_out.items():
            if not outs[idx].requires_grad:
                continue
            g = None
            for pieces in per_stage.values():
                part = pieces[0] if len(pieces) == 1 else torch.cat(pieces)
                g = part if g is None else g + part
            roots.append(outs[idx])
            grads.append(g)
        if loss is not None:
            roots.append(loss)
            grads.append(torch.ones_like(loss))
        if roots:
            torch.autograd.backward(roots, grads)
        self.saved_now -= self._saved.pop(c.mb, 0)
        for m in st.sends:
            leaf = leaves.get((m.value, m.src, m.dst))  # the activation this gradient belongs to
            g = leaf.grad if leaf is not None and leaf.grad is not None else None
            if g is None:
                shape, dtype = self.meta[m.value]
                g = torch.zeros((m.hi - m.lo, *shape), dtype=dtype, device=self.device)
            self.comm.isend(g.contiguous(), m.src.rank, f"send of {m}")

    def _make_pack(self, mb: int):
        def pack(t: torch.Tensor) -> torch.Tensor:
            if t.untyped_storage().data_ptr() not in self.param_ptrs:
                n = t.numel() * t.element_size()
                self._saved[mb] = self._saved.get(mb, 0) + n
                self.saved_now += n
                self.saved_peak = max(self.saved_peak, self.saved_now)
            return t
        return pack
