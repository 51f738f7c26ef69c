"""Lower the plan's stage orders to per-rank actions and dry-run them for deadlock.

Sample ranges are the unit of communication. Replica ``r`` of a stage with micro-batch size
``b`` and ``d`` replicas computes, for micro-batch ``j``, samples
``[j*b + r*b/d, j*b + (r+1)*b/d)`` (a *chunk*). For a transfer (value ``u`` of stage P read by
stage T) every pair of a P chunk and a T chunk whose sample ranges overlap is one message: the
overlapping rows of ``u`` (forward, ``act``) and later their gradient (backward, ``grad``). This
covers equal and unequal micro-batch sizes and data parallelism on either side alike.

Each rank's action list is its stage's order (``gpp_solver``'s :class:`~gpp_solver.action.Action`
records, ``F j`` / ``B j``) with, around each compute action, the receives it needs before and the
sends it posts after (:class:`MessageOp`):

    F j: recv act (per producer chunk overlapping, sample order) ; F j ; send act
    B j: recv grad (per consumer chunk overlapping)              ; B j ; send grad
    W j: W j (the weight gradient of a split backward: no message)

Sends are non-blocking; a receive waits for its matching send. Messages between two ranks are
matched in posting order, so ``lower`` checks that sender and receiver list each pair's messages
in the same order, and ``dry_run`` simulates the ranks to prove that every receive completes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gpp_solver.action import Action
from gpp_solver.errors import DeadlockError, InvalidPlanError
from gpp_solver.types import Plan, Stage

from .plan_io import replica_batch


@dataclass(frozen=True)
class TransferSpec:
    """What lowering needs of a transfer: value id, stages, order index, gradient or not."""

    value: str
    src: int
    dst: int
    index: int
    grad: bool = True


@dataclass
class Step:
    """One compute action with the receives before it and the sends after it."""

    act: Action
    recvs: list[Message] = field(default_factory=list)
    sends: list[Message] = field(default_factory=list)


@dataclass(frozen=True)
class Chunk:
    """Samples ``[lo, hi)`` of micro-batch ``mb`` computed by ``replica`` (rank ``rank``) of ``stage``."""

    stage: int
    mb: int
    replica: int
    rank: int
    lo: int
    hi: int


@dataclass(frozen=True)
class Message:
    """Rows ``[lo, hi)`` (absolute sample indices) of value ``value``, activation or gradient."""

    kind: str  # "act" | "grad"
    value: str
    src: Chunk
    dst: Chunk
    lo: int
    hi: int

    def __str__(self) -> str:
        a, b = (self.src, self.dst) if self.kind == "act" else (self.dst, self.src)
        return f"{self.kind}({self.value}, samples {self.lo}:{self.hi}) rank {a.rank} -> rank {b.rank}"


@dataclass(frozen=True)
class MessageOp:
    """``send`` or ``recv`` of ``msg`` in a rank's action list."""

    op: str  # "send" | "recv"
    msg: Message

    def __str__(self) -> str:
        return f"{self.op}:{self.msg}"


#: one entry of a rank's action list: a compute action or a message operation
RankAction = Action | MessageOp


def _is(a: RankAction, op: str) -> bool:
    return isinstance(a, MessageOp) and a.op == op


def chunk(stage: Stage, mb: int, replica: int) -> Chunk:
    """The chunk of ``stage`` for micro-batch ``mb`` and replica ``replica``."""
    rb = replica_batch(stage)
    lo = mb * stage.micro_batch_size + replica * rb
    return Chunk(stage.id, mb, replica, stage.devices[replica], lo, lo + rb)


def overlapping(stage: Stage, lo: int, hi: int) -> list[Chunk]:
    """Chunks of ``stage`` whose samples overlap ``[lo, hi)``, in sample order."""
    rb = replica_batch(stage)
    out = []
    for g in range(lo // rb, (hi - 1) // rb + 1):
        mb, r = divmod(g, len(stage.devices))
        out.append(chunk(stage, mb, r))
    return out


def _msg(kind: str, t: TransferSpec, pc: Chunk, cc: Chunk) -> Message:
    return Message(kind, t.value, pc, cc, max(pc.lo, cc.lo), min(pc.hi, cc.hi))


def lower(plan: Plan, specs: list[TransferSpec]) -> dict[int, list[RankAction]]:
    """Per-rank action lists (see the module docstring); InvalidPlanError if pairs disagree."""
    ins = {s.id: [t for t in specs if t.dst == s.id] for s in plan.stages}
    outs = {s.id: [t for t in specs if t.src == s.id] for s in plan.stages}
    result: dict[int, list[RankAction]] = {}
    for s in plan.stages:
        for r, rank in enumerate(s.devices):
            acts: list[RankAction] = []
            for a in s.schedule.order:
                kind, j = a
                c = chunk(s, j, r)
                if kind == "W":  # the weight gradient of a split backward: no message
                    acts.append(a)
                    continue
                if kind == "F":
                    recv = [
                        (pc.lo, t.index, _msg("act", t, pc, c))
                        for t in ins[s.id]
                        for pc in overlapping(plan.stage(t.src), c.lo, c.hi)
                    ]
                    send = [
                        (cc.lo, t.index, _msg("act", t, c, cc))
                        for t in outs[s.id]
                        for cc in overlapping(plan.stage(t.dst), c.lo, c.hi)
                    ]
                else:
                    recv = [
                        (cc.lo, t.index, _msg("grad", t, c, cc))
                        for t in outs[s.id]
                        if t.grad
                        for cc in overlapping(plan.stage(t.dst), c.lo, c.hi)
                    ]
                    send = [
                        (pc.lo, t.index, _msg("grad", t, pc, c))
                        for t in ins[s.id]
                        if t.grad
                        for pc in overlapping(plan.stage(t.src), c.lo, c.hi)
                    ]
                acts += [MessageOp("recv", m) for *_, m in sorted(recv, key=lambda x: x[:2])]
                acts.append(a)
                acts += [MessageOp("send", m) for *_, m in sorted(send, key=lambda x: x[:2])]
            result[rank] = acts
    _check_pair_order(result)
    return result


def endpoint(m: Message, side: str) -> int:
    """Rank that sends (``side='src'``) or receives ``m``."""
    fwd = m.kind == "act"
    if side == "src":
        return m.src.rank if fwd else m.dst.rank
    return m.dst.rank if fwd else m.src.rank


def _check_pair_order(acts: dict[int, list[RankAction]]) -> None:
    sent: dict[tuple[int, int], list[Message]] = {}
    got: dict[tuple[int, int], list[Message]] = {}
    for rank, lst in acts.items():
        for a in lst:
            if _is(a, "send"):
                sent.setdefault((rank, endpoint(a.msg, "dst")), []).append(a.msg)
            elif _is(a, "recv"):
                got.setdefault((endpoint(a.msg, "src"), rank), []).append(a.msg)
    for pair in set(sent) | set(got):
        if sent.get(pair, []) != got.get(pair, []):
            raise InvalidPlanError(
                f"ranks {pair[0]} -> {pair[1]}: the sender's message order differs from the receiver's"
            )


def dry_run(plan: Plan, acts: dict[int, list[RankAction]]) -> None:
    """Simulate all ranks (sends never block, a recv waits for its send); DeadlockError with the grid."""
    pos = {r: 0 for r in acts}
    posted: set[Message] = set()
    progress = True
    while progress:
        progress = False
        for r, lst in acts.items():
            while pos[r] < len(lst):
                a = lst[pos[r]]
                if _is(a, "recv") and a.msg not in posted:
                    break
                if _is(a, "send"):
                    posted.add(a.msg)
                pos[r] += 1
                progress = True
    if all(pos[r] == len(lst) for r, lst in acts.items()):
        return
    raise DeadlockError("the plan's schedules deadlock:\n" + grid(plan, acts, pos))


def grid(plan: Plan, acts: dict[int, list[RankAction]], pos: dict[int, int] | None = None) -> str:
    """The stage x step grid of compute actions; with ``pos``, each stuck rank's step is ``[..]*``."""
    lines = []
    waits = []
    for s in plan.stages:
        for rank in s.devices:
            lst = acts[rank]
            stuck_at = None
            if pos is not None and pos[rank] < len(lst):
                stuck_at = next(i for i in range(pos[rank], len(lst)) if isinstance(lst[i], Action))
                waits.append(f"  rank {rank} waits before {lst[stuck_at]} for {lst[pos[rank]].msg}")
            cells = [f"[{a}]*" if i == stuck_at else str(a) for i, a in enumerate(lst) if isinstance(a, Action)]
            lines.append(f"stage {s.id} (rank {rank}): " + " ".join(cells))
    return "\n".join(lines + waits)


def group_actions(actions: list[RankAction]) -> list[Step]:
    """Attach each send/recv to its compute action (recvs precede it, sends follow it)."""
    steps: list[Step] = []
    pending: list[Message] = []
    for a in actions:
        if _is(a, "recv"):
            pending.append(a.msg)
        elif _is(a, "send"):
            steps[-1].sends.append(a.msg)
        else:
            steps.append(Step(a, recvs=pending))
            pending = []
    return steps
