"""Run one rank's share of a training step: its lowered actions, in the posting order.

Forward ``F j`` slices the model inputs it reads to its chunk, assembles each remote value from the
received pieces (per tensor leaf: a received piece is a leaf that requires grad, so each piece gets
its own gradient; a value an in-place operator of the stage may modify is copied, so
``ReLU(inplace=True)`` as the first op never modifies a leaf; the pieces of a copied or concatenated
value are then freed), runs the stage module and, if it holds the sink, the loss (both in the
pipeline's precision: under its autocast, if any): ``loss_fn(output, target) * rows /
mini_batch_size`` for a loss that is the mean over the samples it is given
(``loss_reduction="mean"``), ``loss_fn(output, target)`` for a sum. Either way the gradients summed
over all chunks equal those of ``loss_fn`` on the whole mini-batch. Dropout nodes draw their masks
from ``(seed, step, chunk's first sample, node)``. Backward ``B j`` (outside any autocast; the
sink's seeded with the fp16 loss scale) assembles each output's gradient from the pieces received
from every consumer stage (pieces of one stage tile the rows; different stages are summed),
back-propagates, and sends each received piece's gradient back to its producer. In a plan whose order holds ``W``
actions, ``B j`` computes the received pieces' gradients alone and ``W j`` the weight gradients
(:mod:`gpp_runtime.engine.split_backward`); the data-parallel all-reduce follows the last ``W``.

Operations are posted in ``posting.posting``'s order (``eager`` or ``batched``, see
``gpp_runtime.engine.p2p``). On CUDA no synchronisation happens per action: compute times come from CUDA
events read once at the end of the step.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.utils._pytree as pytree

from gpp_solver.errors import InvalidInputError
from gpp_solver.types import Stage

from ..capture.dropout import Context, set_context
from ..capture.precision import Precision
from ..capture.precision import precision as as_precision
from ..lowering.actions import Chunk, Message, RankAction, Step, chunk, group_actions
from ..lowering.fx_split import StageProgram
from ..lowering.posting import Post, posting
from .loss_check import BATCH_LEVEL, check_loss, one_line
from .metrics import Recorder
from .p2p import P2P, ValueMeta, check_travelling, flatten, unflatten
from .split_backward import PendingWeight, backward_input, backward_weight


def _free(received: list[torch.Tensor]) -> None:
    """Release the memory of received pieces once copied (their copy or concatenation is what the
    stage computes on): each stays a leaf whose ``.grad`` the backward sends back, which needs its
    shape, not its data (as FSDP frees a gathered parameter's storage)."""
    for t in received:
        t.untyped_storage().resize_(0)


def _own_bytes(t: torch.Tensor) -> torch.Tensor:
    """``t`` contiguous, in a storage of its own size: a gradient sent back is often a view of a
    larger one (a concatenation's backward narrows the gradient of its output), which its send
    would keep whole until it is waited for; copied, that buffer is freed with the backward."""
    t = t.contiguous()
    if t.untyped_storage().nbytes() > t.numel() * t.element_size():
        return t.clone()
    return t


def _sent(m: Message) -> str:
    """How a check names message ``m``: the value, activation or gradient, the stages and ranks."""
    a, b = (m.src, m.dst) if m.kind == "act" else (m.dst, m.src)
    kind = "the activation" if m.kind == "act" else "the gradient of"
    return (
        f"{kind} {m.value!r} (samples {m.lo}:{m.hi}) sent from stage {a.stage} (rank {a.rank}) "
        f"to stage {b.stage} (rank {b.rank})"
    )


def _rows(tree, lo: int, hi: int):
    return pytree.tree_map(lambda t: t[lo:hi] if isinstance(t, torch.Tensor) else t, tree)


@dataclass(frozen=True)
class _Recompute:
    """What a recomputing stage's ``F j`` keeps for ``B j``: its step (whose receives name the
    pieces), the received pieces, the model inputs and target, the step number and the random state."""

    step_f: Step
    bufs: dict
    inputs: tuple
    target: object
    step: int
    rng: tuple


def _rng_state(device: torch.device) -> tuple:
    """The random state a forward starts from (CPU, and the device's on CUDA), as
    ``torch.utils.checkpoint`` keeps it for its recomputation."""
    cuda = torch.cuda.get_rng_state(device) if device.type == "cuda" else None
    return torch.get_rng_state(), cuda


def _set_rng_state(device: torch.device, state: tuple) -> None:
    torch.set_rng_state(state[0])
    if state[1] is not None:
        torch.cuda.set_rng_state(state[1], device)


class StageExecutor:
    """Executes the actions of one rank (one replica of one stage) for each training step."""

    def __init__(
        self,
        program: StageProgram,
        stage: Stage,
        replica: int,
        rank: int,
        actions: list[RankAction],
        meta: dict[str, ValueMeta],
        loss_fn,
        mini_batch_size: int,
        device: torch.device,
        comm: P2P,
        rec: Recorder,
        *,
        loss_reduction: str = "mean",
        lookahead: int = 2,
        seed: int = 0,
        grad_sync=None,
        precision: Precision | None = None,
        loss_scale: Callable[[], float] | None = None,
        releases: dict[int, list] | None = None,
    ) -> None:
        self.program = program
        self.stage = stage
        self.replica = replica
        self.rank = rank
        self.steps = group_actions(actions)
        self.items = posting(self.steps, comm.mode, lookahead)
        #: item index -> the sends waited for (their tensors freed) once its receives arrived
        self.releases = {i: {str(m) for m in ms} for i, ms in (releases or {}).items()}
        # the data-parallel all-reduce is armed for the last action that accumulates weight gradients
        self.split = any(s.act.kind == "W" for s in self.steps)
        last = "W" if self.split else "B"
        self.last_backward = max((i for i, s in enumerate(self.steps) if s.act.kind == last), default=-1)
        self.params = [p for p in program.module.parameters() if p.requires_grad]
        self._pending_w: dict[int, PendingWeight] = {}  # micro-batch -> what its W needs
        self.meta = meta
        self.loss_fn = loss_fn
        self.loss_reduction = loss_reduction
        self.check_loss = True
        self._checks_left = 8  # chunks whose check proves nothing (a loss never finite) before giving up
        #: the first step's refusal of loss_fn, raised by every rank after the step (GraphPipeline.step)
        self.refusal: str | None = None
        self.defer_refusal = True
        #: this step's (chunk, loss_fn's value) on the sink's ranks, to name a non-finite one
        self.chunk_losses: list[tuple[Chunk, torch.Tensor]] = []
        self.mini_batch_size = mini_batch_size
        self.device = device
        self.comm = comm
        self.rec = rec
        self.seed = seed
        self.grad_sync = grad_sync
        self.precision = precision or as_precision(None)
        #: the scale the sink's backward is seeded with (fp16's ``LossScaler.get_scale``; else 1)
        self.loss_scale = loss_scale or (lambda: 1.0)
        self.out_index = {key: i for i, (kind, key) in enumerate(program.outputs) if kind == "act"}
        self.param_ptrs = {p.untyped_storage().data_ptr() for p in program.module.parameters()}
        self._saved: dict[int, int] = {}  # micro-batch -> saved-activation bytes
        self.saved_now = 0
        self.saved_peak = 0

    # -- one training step -------------------------------------------------------------------
    def run_step(self, inputs: tuple, target, step: int):
        """Run all actions of one step; returns this rank's share of the loss (None without sink)."""
        state: dict[int, tuple] = {}
        posted: dict[Message, tuple[list[torch.Tensor], list]] = {}
        out_tensors: dict[Message, list[torch.Tensor]] = {}
        loss_sum = None
        cuda = self.device.type == "cuda"
        timings: list[tuple[str, object, object]] = []
        t_step = time.time()
        if cuda:
            first = torch.cuda.Event(enable_timing=True)
            first.record()
        index = {id(st): i for i, st in enumerate(self.steps)}
        self.chunk_losses = []
        for k, it in enumerate(self.items):
            if isinstance(it, Post):
                sends = [(out_tensors.pop(m), self._peer(m, "dst"), str(m)) for m in it.sends]
                recvs = [(self._leaves(m), m.hi - m.lo, self._peer(m, "src")) for m in it.recvs]
                for m, res in zip(it.recvs, self.comm.post(sends, recvs)):
                    posted[m] = res
                continue
            st: Step = it
            bufs, t1 = self._receive(k, st, posted)
            c = chunk(self.stage, st.act.micro_batch, self.replica)
            ev = None
            if cuda:
                ev = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                ev[0].record()
            if st.act.kind == "F":
                loss = self._forward(st, c, bufs, inputs, target, state, step, out_tensors)
                if loss is not None:
                    loss_sum = loss.detach() if loss_sum is None else loss_sum + loss.detach()
                # the graph a split backward retains lives while anything refers to it: not here
                del loss
            else:
                if index[id(st)] == self.last_backward and self.grad_sync is not None:
                    self.grad_sync.arm()
                if st.act.kind == "W":
                    self._weight(c)
                else:
                    self._backward(st, c, bufs, state, out_tensors)
            if cuda:
                ev[1].record()
                timings.append((str(st.act), ev[0], ev[1]))
            else:
                self.rec.event(str(st.act), t1, time.time(), "compute")
        t0 = time.time()
        self.comm.wait_sends()
        self.rec.event("wait sends", t0, time.time(), "wait")
        if cuda:  # one synchronisation per step, for the compute times
            torch.cuda.synchronize(self.device)
            for name, a, b in timings:
                start = t_step + first.elapsed_time(a) / 1e3
                self.rec.event(name, start, start + a.elapsed_time(b) / 1e3, "compute")
        return loss_sum

    def _receive(self, k: int, st: Step, posted: dict) -> tuple[dict, float]:
        """Wait for the receives of step ``st`` (item ``k``), then for the sends due there
        (``posting.send_releases``); its buffers and the time the waits ended (recorded as a wait)."""
        t0 = time.time()
        bufs = {}
        for m in st.recvs:
            buf, works = posted.pop(m)
            self.comm.wait(works, f"receive of {m}")
            bufs[m] = buf
        if k in self.releases:
            self.comm.release_sends(self.releases[k])
        t1 = time.time()
        if t1 - t0 > 1e-5:
            self.rec.event("wait", t0, t1, "wait")
        return bufs, t1

    def _peer(self, m: Message, side: str) -> int:
        if side == "dst":  # we send m
            return m.dst.rank if m.kind == "act" else m.src.rank
        return m.src.rank if m.kind == "act" else m.dst.rank

    def _leaves(self, m: Message):
        metas = self.meta[m.value].tensors
        if m.kind == "grad":
            metas = tuple(x for x in metas if x.grad)
        return list(metas)

    # -- forward / backward --------------------------------------------------------------------
    def _forward(
        self, st: Step, c: Chunk, bufs: dict, inputs: tuple, target, state: dict, step: int, out_tensors: dict
    ):
        if self.stage.recompute:  # nothing saved: the backward runs it again from what it received
            rng = _rng_state(self.device)
            args, _leaves = self._arguments(st, c, bufs, inputs, free=False)
            set_context(Context(seed=self.seed, step=step, lo=c.lo))
            with torch.no_grad(), self.precision.forward(self.device):
                outs = self.program.module(*args)
                loss = self._loss(c, outs[-1], target) if self.program.holds_sink else None
            del args
            self._send(st, c, outs, out_tensors)
            state[c.mb] = _Recompute(st, bufs, inputs, target, step, rng)
            return loss
        args, leaves = self._arguments(st, c, bufs, inputs, free=True)
        outs, loss = self._run(c, args, target, step, check=True)
        self._send(st, c, outs, out_tensors)
        state[c.mb] = (leaves, outs, loss)
        return loss

    def _arguments(self, st: Step, c: Chunk, bufs: dict, inputs: tuple, *, free: bool) -> tuple[list, dict]:
        """The stage module's arguments for chunk ``c`` and the received pieces (leaves that require
        grad) by message; with ``free``, the pieces copied or concatenated are freed."""
        args = []
        leaves: dict[tuple, list] = {}
        for kind, key in self.program.inputs:
            if kind == "input":
                if key >= len(inputs):
                    raise InvalidInputError(
                        f"stage {self.stage.id} reads model input {key} but step() got {len(inputs)} inputs"
                    )
                args.append(inputs[key][c.lo : c.hi].to(self.device, non_blocking=True))
                continue
            meta = self.meta[key]
            pieces = []
            for m in st.recvs:
                if m.value == key:
                    ts = bufs[m]
                    for t in ts:
                        if t.is_floating_point():
                            t.requires_grad_(True)
                    leaves[(m.value, m.src, m.dst)] = ts
                    pieces.append(ts)
            if len(pieces) == 1 and key in self.program.copied_inputs:
                joined = [t.clone() if t.requires_grad else t for t in pieces[0]]
                if free:
                    _free([t for t in pieces[0] if t.requires_grad])
            elif len(pieces) == 1:
                joined = pieces[0]
            else:
                joined = [torch.cat(col) for col in zip(*pieces)]
                if free:
                    _free([t for ts in pieces for t in ts])
            args.append(unflatten(joined, meta))
        return args, leaves

    def _run(self, c: Chunk, args: list, target, step: int, *, check: bool):
        """The stage module (and the sink's loss) on chunk ``c``, saving for the backward; ``check``:
        the loss's value is this chunk's (recorded and checked), not a recomputation's."""
        self._saved[c.mb] = 0
        set_context(Context(seed=self.seed, step=step, lo=c.lo))
        pack = torch.autograd.graph.saved_tensors_hooks(self._make_pack(c.mb), lambda t: t)
        with pack, self.precision.forward(self.device):
            outs = self.program.module(*args)
            loss = None
            if self.program.holds_sink:
                loss = self._loss(c, outs[-1], target) if check else self._scaled_loss(c, outs[-1], target)
        return outs, loss

    def _send(self, st: Step, c: Chunk, outs, out_tensors: dict) -> None:
        for m in st.sends:
            value = outs[self.out_index[m.value]]
            out_tensors[m] = [
                t[m.lo - c.lo : m.hi - c.lo].detach().contiguous() for t in flatten(value, self.meta[m.value])
            ]
            check_travelling(out_tensors[m], list(self.meta[m.value].tensors), m.hi - m.lo, _sent(m))

    def _recomputed(self, c: Chunk, saved: _Recompute) -> tuple:
        """``(leaves, outs, loss)`` of a recomputing stage's chunk ``c``: its forward again, from the
        received pieces kept by ``F``, with the same dropout masks and random state."""
        args, leaves = self._arguments(saved.step_f, c, saved.bufs, saved.inputs, free=True)
        with torch.random.fork_rng(devices=[self.device] if self.device.type == "cuda" else []):
            _set_rng_state(self.device, saved.rng)
            outs, loss = self._run(c, args, saved.target, saved.step, check=False)
        return leaves, outs, loss

    def _target(self, c: Chunk, target):
        """Chunk ``c``'s rows of the target, on this rank's device."""
        tgt = _rows(target, c.lo, c.hi)
        return pytree.tree_map(lambda t: t.to(self.device) if isinstance(t, torch.Tensor) else t, tgt)

    def _loss(self, c: Chunk, out, target):
        """The sink's loss on chunk ``c``, scaled for a mean; checked until the check is conclusive."""
        tgt = self._target(c, target)
        try:
            loss = self.loss_fn(out, tgt)
        except (IndexError, RuntimeError) as exc:  # e.g. labels of the whole batch
            raise InvalidInputError(
                f"loss_fn failed on samples {c.lo}:{c.hi} of the mini-batch ({one_line(exc)}); {BATCH_LEVEL}"
            ) from exc
        if self.check_loss:
            self._check_reduction(out, tgt, loss)
        if isinstance(loss, torch.Tensor):
            self.chunk_losses.append((c, loss.detach()))
        return self._scale(c, loss)

    def _scaled_loss(self, c: Chunk, out, target):
        """The sink's loss on chunk ``c`` again (a recomputation: already checked and recorded)."""
        return self._scale(c, self.loss_fn(out, self._target(c, target)))

    def _scale(self, c: Chunk, loss):
        if self.loss_reduction == "mean":
            loss = loss * ((c.hi - c.lo) / self.mini_batch_size)
        return loss

    def _check_reduction(self, out, tgt, loss) -> None:
        """Until conclusive (``loss_check.check_loss``): the loss must be the mean (or the sum) of
        per-sample terms. A refusal at the first step waits for the step's end
        (``GraphPipeline.step`` raises it on every rank); later it is raised here."""
        msg, conclusive = check_loss(self.loss_fn, out, tgt, loss, self.loss_reduction, self.seed)
        self._checks_left -= 1
        self.check_loss = not conclusive and self._checks_left > 0
        if msg is None:
            return
        if not self.defer_refusal:
            raise InvalidInputError(msg)
        self.refusal = self.refusal or msg

    def _backward(self, st: Step, c: Chunk, bufs: dict, state: dict, out_tensors: dict) -> None:
        saved = state.pop(c.mb)
        leaves, outs, loss = self._recomputed(c, saved) if isinstance(saved, _Recompute) else saved
        by_out: dict[str, dict[int, list[list[torch.Tensor]]]] = {}
        for m in st.recvs:  # sample order within each consumer stage
            by_out.setdefault(m.value, {}).setdefault(m.dst.stage, []).append(bufs[m])
        roots, grads = [], []
        for key, per_stage in by_out.items():
            meta = self.meta[key]
            outs_flat = [t for t, g in zip(flatten(outs[self.out_index[key]], meta), meta.grad_mask) if g]
            total = None
            for pieces in per_stage.values():
                part = pieces[0] if len(pieces) == 1 else [torch.cat(col) for col in zip(*pieces)]
                total = part if total is None else [a + b for a, b in zip(total, part)]
            for o, g in zip(outs_flat, total):
                if o.requires_grad:
                    roots.append(o)
                    grads.append(g)
        if loss is not None:  # seeded with the loss scale (fp16), 1 otherwise
            roots.append(loss)
            grads.append(torch.full_like(loss, self.loss_scale()))
        input_grad: dict[int, torch.Tensor | None] = {}
        if self.split:  # the input gradients now, the weight gradients at W (split_backward)
            wanted = [t for ts in leaves.values() for t in ts if t.requires_grad]
            got, self._pending_w[c.mb] = backward_input(roots, grads, wanted, self.params)
            input_grad = {id(t): g for t, g in zip(wanted, got)}
        else:
            if roots:
                torch.autograd.backward(roots, grads)
            self.saved_now -= self._saved.pop(c.mb, 0)
        for m in st.sends:
            got = leaves.get((m.value, m.src, m.dst), [])
            metas = self.meta[m.value].tensors
            out = []
            for leaf, lm in zip(got, metas):
                if not lm.grad:
                    continue
                g = input_grad.get(id(leaf)) if self.split else leaf.grad
                out.append(
                    _own_bytes(g)
                    if g is not None
                    else torch.zeros((m.hi - m.lo, *lm.shape), dtype=lm.dtype, device=self.device)
                )
            check_travelling(out, [lm for lm in metas if lm.grad], m.hi - m.lo, _sent(m))
            out_tensors[m] = out

    def _weight(self, c: Chunk) -> None:
        """``W j``: the weight gradients of micro-batch ``j``; its activations are freed after it."""
        backward_weight(self._pending_w.pop(c.mb))
        self.saved_now -= self._saved.pop(c.mb, 0)

    def _make_pack(self, mb: int):
        def pack(t: torch.Tensor) -> torch.Tensor:
            if t.untyped_storage().data_ptr() not in self.param_ptrs:
                n = t.numel() * t.element_size()
                self._saved[mb] = self._saved.get(mb, 0) + n
                self.saved_now += n
                self.saved_peak = max(self.saved_peak, self.saved_now)
            # the same storage without its autograd history: a saved output returned as itself would
            # refer to the node that saves it, a cycle that only a backward without retain_graph
            # breaks, so a split backward's graph (retained for W) would outlive its micro-batch
            return t.detach()

        return pack
