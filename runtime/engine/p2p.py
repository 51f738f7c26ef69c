"""Point-to-point messages between ranks: values as pytrees, posting modes, waits with a deadline.

A value that crosses a stage boundary is a tensor or a tuple / list / dict of tensors (and
``None``): ``torch.utils._pytree`` flattens it, each tensor leaf with a leading batch dimension
travels as one tensor, ``None`` leaves are rebuilt by the receiver, which knows the structure
(``ValueMeta``, taken from one traced forward pass before training).

Posting modes (``P2P.mode``):

- ``"eager"``: every send and receive is its own ``isend`` / ``irecv`` (gloo's default; the
  executor posts receives a few compute actions ahead so data arrives while it computes);
- ``"batched"``: each group of operations (the sends of the previous compute action and the
  receives of the next one) is one ``dist.batch_isend_irecv`` call (NCCL's default: NCCL runs a
  rank's point-to-point operations in posting order on one stream, so a receive posted early can
  block a send behind it; ``posting.check_rendezvous`` proves the groups complete).

Gloo's transport threads (:func:`lower_transport_threads`): a gloo process group reads and writes
its sockets on an event-loop thread of its own (``gloo_tcp_loop``). A CPU rank's compute thread
shares its core with that thread; at equal priority the scheduler gave the loop thread slices of up
to 4-5 ms in the middle of the compute thread's posting (an ``isend`` of 256 bytes that usually
takes 0.03 ms), and the peer, waiting for the message, lost them too. At nice 19 the loop thread
still runs whenever the compute thread waits, which is when a message is needed.

Messages between two ranks are matched in posting order (the order ``actions.lower`` fixed and
checked), so no tags are used; that also holds for NCCL, which ignores tags.
"""

from __future__ import annotations

import datetime
import logging
import os
import sys
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.utils._pytree as pytree

from gpp_solver.errors import InvalidInputError, InvalidPlanError

logger = logging.getLogger(__name__)

MODES = ("eager", "batched")
#: the name of gloo's TCP transport thread (one per process group) and the nice it is given
GLOO_LOOP_THREAD = "gloo_tcp_loop"
TRANSPORT_NICE = 19


class CommTimeout(RuntimeError):
    """A peer did not answer within the process-group timeout (dead or stuck rank)."""


@dataclass(frozen=True)
class LeafMeta:
    """A tensor leaf: per-sample shape and dtype."""

    shape: tuple[int, ...]
    dtype: torch.dtype

    @property
    def grad(self) -> bool:
        return self.dtype.is_floating_point or self.dtype.is_complex


@dataclass(frozen=True)
class ValueMeta:
    """The structure of a transferred value: its pytree spec and, per leaf, LeafMeta or None."""

    spec: object  # pytree.TreeSpec
    leaves: tuple[LeafMeta | None, ...]

    @property
    def tensors(self) -> tuple[LeafMeta, ...]:
        """The leaves that travel, in order."""
        return tuple(x for x in self.leaves if x is not None)

    @property
    def grad_mask(self) -> tuple[bool, ...]:
        """Per travelling leaf: whether a gradient comes back for it."""
        return tuple(x.grad for x in self.tensors)

    @property
    def has_grad(self) -> bool:
        return any(self.grad_mask)


def lower_transport_threads(backend: str) -> int:
    """With gloo on Linux, this process's ``GLOO_LOOP_THREAD`` threads at nice ``TRANSPORT_NICE``
    (module docstring); the number changed. Call it after the process groups are made: each has
    its own thread. Other backends and systems: nothing (0)."""
    if backend != "gloo" or not sys.platform.startswith("linux"):
        return 0
    changed = 0
    tasks = f"/proc/{os.getpid()}/task"
    try:
        tids = os.listdir(tasks)
    except OSError:
        return 0
    for tid in tids:
        try:
            with open(f"{tasks}/{tid}/comm") as f:
                if f.read().strip() != GLOO_LOOP_THREAD:
                    continue
            if os.getpriority(os.PRIO_PROCESS, int(tid)) < TRANSPORT_NICE:
                os.setpriority(os.PRIO_PROCESS, int(tid), TRANSPORT_NICE)
                changed += 1
        except OSError:  # the thread ended, or the system refuses: it keeps its priority
            continue
    logger.debug("gloo transport threads at nice %d: %d", TRANSPORT_NICE, changed)
    return changed


def describe(value, rows: int, what: str) -> ValueMeta:
    """ValueMeta of ``value`` computed on ``rows`` samples; InvalidPlanError if it cannot travel."""
    leaves, spec = pytree.tree_flatten(value)
    metas: list[LeafMeta | None] = []
    for i, v in enumerate(leaves):
        where = what if len(leaves) == 1 else f"{what} (leaf {i} of {type(value).__name__})"
        if v is None:
            metas.append(None)
            continue
        if not isinstance(v, torch.Tensor):
            raise InvalidPlanError(
                f"{where} crosses a stage boundary but its value is a {type(v).__name__}, not a "
                "tensor; put it in the stage of its consumer"
            )
        if v.dim() == 0 or v.shape[0] != rows:
            raise InvalidPlanError(
                f"{where} crosses a stage boundary but its value (shape {tuple(v.shape)}) has no "
                "leading batch dimension"
            )
        metas.append(LeafMeta(tuple(v.shape[1:]), v.dtype))
    if not any(m is not None for m in metas):
        raise InvalidPlanError(f"{what} crosses a stage boundary but holds no tensor")
    return ValueMeta(spec, tuple(metas))


def check_travelling(tensors: list[torch.Tensor], metas: list[LeafMeta], rows: int, what: str) -> None:
    """InvalidInputError when a tensor about to be sent is not of the dtype and shape the plan's
    setup traced for it (``metas``, ``rows`` samples): its receiver allocates the buffer from
    those, so a tensor of another dtype would arrive as reinterpreted bytes. ``what`` names the
    value and the stages it goes between."""
    for i, (t, m) in enumerate(zip(tensors, metas)):
        if t.dtype != m.dtype or tuple(t.shape) != (rows, *m.shape):
            leaf = f" (tensor {i})" if len(metas) > 1 else ""
            raise InvalidInputError(
                f"{what}{leaf} is {str(t.dtype).removeprefix('torch.')} of shape {tuple(t.shape)}, but the "
                f"pipeline's setup traced {str(m.dtype).removeprefix('torch.')} of shape {(rows, *m.shape)}: "
                "a value that crosses stages keeps the dtype and shape traced when the pipeline was built "
                "(the receiving stage allocates its buffer from them); a model cast, or a step run under "
                "torch.autocast, after the pipeline was built changes them"
            )


def flatten(value, meta: ValueMeta) -> list[torch.Tensor]:
    """The travelling tensors of ``value`` (leaves in pytree order, ``None`` left out)."""
    return [v for v in pytree.tree_leaves(value) if v is not None]


def unflatten(tensors: list[torch.Tensor], meta: ValueMeta):
    """Rebuild the value from its travelling tensors."""
    it = iter(tensors)
    leaves = [None if m is None else next(it) for m in meta.leaves]
    return pytree.tree_unflatten(leaves, meta.spec)


class P2P:
    """Posts sends/receives (eagerly or in batches) and waits for them with a deadline."""

    def __init__(self, device: torch.device, timeout_s: float, mode: str = "eager") -> None:
        if mode not in MODES:
            raise ValueError(f"p2p mode must be one of {MODES}, got {mode!r}")
        self.device = device
        self.mode = mode
        self.timeout = datetime.timedelta(seconds=timeout_s)
        self._sends: list[tuple[object, list[torch.Tensor], str]] = []

    def post(
        self, sends: list[tuple[list[torch.Tensor], int, str]], recvs: list[tuple[list[LeafMeta], int, int]]
    ) -> list[tuple[list[torch.Tensor], list]]:
        """Post one group: ``sends`` = (tensors, dst, what), ``recvs`` = (leaf metas, rows, src).

        Returns, per receive, its fresh buffers and the works to wait for before reading them.
        Send tensors are kept alive until ``release_sends`` or ``wait_sends`` waits for them.
        """
        bufs = [
            [torch.empty((rows, *m.shape), dtype=m.dtype, device=self.device) for m in metas]
            for metas, rows, _src in recvs
        ]
        if self.mode == "eager" or not (sends or recvs):
            for tensors, dst, what in sends:
                for t in tensors:
                    self._sends.append((dist.isend(t, dst), [t], what))
            return [(b, [dist.irecv(t, src) for t in b]) for b, (_m, _r, src) in zip(bufs, recvs)]
        ops = [dist.P2POp(dist.isend, t, dst) for tensors, dst, _ in sends for t in tensors]
        n_send = len(ops)
        ops += [dist.P2POp(dist.irecv, t, src) for b, (_m, _r, src) in zip(bufs, recvs) for t in b]
        works = dist.batch_isend_irecv(ops) if ops else []
        what = "; ".join(w for _t, _d, w in sends) or "receive group"
        if len(works) != len(ops):  # coalesced (NCCL): one work for the whole group
            self._sends.append((works, [t for tensors, _d, _w in sends for t in tensors], what))
            return [(b, list(works)) for b in bufs]
        k = 0
        for tensors, _dst, w in sends:
            self._sends.append((works[k : k + len(tensors)], tensors, w))
            k += len(tensors)
        out = []
        k = n_send
        for b in bufs:
            out.append((b, works[k : k + len(b)]))
            k += len(b)
        return out

    def wait(self, work, what: str) -> None:
        """Wait for one posted operation (or a list); CommTimeout naming ``what`` if the peer fails."""
        for w in work if isinstance(work, list) else [work]:
            try:
                w.wait(self.timeout)
            except Exception as exc:  # noqa: BLE001 - backends raise RuntimeError / DistBackendError
                first = str(exc).splitlines()[0] if str(exc) else ""
                raise CommTimeout(
                    f"{what} failed or timed out after {self.timeout.total_seconds():g} s "
                    f"({type(exc).__name__}: {first})"
                ) from exc

    def release_sends(self, whats: set[str]) -> None:
        """Wait for the posted sends named in ``whats`` (``posting.send_releases`` says which are due:
        their receives are posted) and drop their tensors; a group whose sends are not all named
        waits for the step's end."""
        pending = []
        for work, tensors, what in self._sends:
            if all(w in whats for w in what.split("; ")):
                self.wait(work, f"send of {what}")
            else:
                pending.append((work, tensors, what))
        self._sends = pending

    def wait_sends(self) -> None:
        """Wait for every send posted since the last call."""
        sends, self._sends = self._sends, []
        for work, _t, what in sends:
            self.wait(work, f"send of {what}")
