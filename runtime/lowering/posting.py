"""The order in which a rank posts its point-to-point operations, and its proof for NCCL.

``posting`` turns a rank's grouped actions into what the executor does, in order: post a group
of sends/receives (``Post``) or run a compute action (``Step``). ``check_rendezvous`` simulates
every rank's posting order with sends that complete only when met by their receive (NCCL runs a
rank's operations on a stream in posting order) and refuses an order that would hang.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from gpp_solver.errors import DeadlockError
from gpp_solver.types import Plan

from .actions import Message, RankAction, Step, endpoint, group_actions


@dataclass(frozen=True)
class Post:
    """One group of point-to-point operations a rank posts at once (see ``posting``)."""

    sends: tuple[Message, ...] = ()
    recvs: tuple[Message, ...] = ()


def posting(steps: list[Step], mode: str, lookahead: int = 2) -> list[Post | Step]:
    """The order in which a rank posts its operations and runs its compute actions.

    ``eager``: the receives of the compute actions up to ``lookahead`` ahead are posted (one
    operation at a time) before each compute action, its sends right after it. ``batched``: one
    group before each compute action holds the previous action's sends and this action's
    receives (receives are posted only when due); a last group holds the last sends.
    """
    items: list[Post | Step] = []
    if mode == "batched":
        prev: list[Message] = []
        for st in steps:
            items += [Post(tuple(prev), tuple(st.recvs)), st]
            prev = st.sends
        if prev:
            items.append(Post(tuple(prev), ()))
        return items
    nxt = 0
    for i, st in enumerate(steps):
        while nxt < len(steps) and nxt <= i + lookahead:
            items += [Post((), (m,)) for m in steps[nxt].recvs]
            nxt += 1
        items.append(st)
        items += [Post((m,), ()) for m in st.sends]
    return items


def send_releases(items: dict[int, list[Post | Step]], rank: int) -> dict[int, list[Message]]:
    """Where ``rank`` may wait for each of its sends without waiting on its peer: index of a
    ``Step`` in ``items[rank]`` -> the sends to wait for once that step's receives have arrived.

    A send of ``m`` to rank ``t`` is waited for at the first step of ``rank`` that receives a
    message ``t`` posted after it posted its receive of ``m``: by then ``t``'s receive of ``m`` is
    posted (and, in one lane, done), so the wait ends without ``rank`` doing anything more, and the
    sent tensors are freed there rather than when the step ends. A send no such message follows
    is waited for when the step ends (``P2P.wait_sends``). Without it a stage holds every
    micro-batch's sent activations and gradients until the step ends: 64 micro-batches of one
    sample held 64 sent values (torch.distributed.pipelining's 1F1B likewise waits each send
    before posting the next)."""
    posted_at: dict[tuple[str, Message], int] = {}  # (op, message) -> index in its rank's items
    for lst in items.values():
        for i, it in enumerate(lst):
            if isinstance(it, Post):
                posted_at.update({("send", m): i for m in it.sends})
                posted_at.update({("recv", m): i for m in it.recvs})
    mine = items[rank]
    steps = [(i, it) for i, it in enumerate(mine) if isinstance(it, Step)]
    out: dict[int, list[Message]] = {}
    for it in mine:
        if not isinstance(it, Post):
            continue
        for m in it.sends:
            peer, after = endpoint(m, "dst"), posted_at[("recv", m)]
            for i, st in steps:
                if posted_at[("send", m)] >= i:
                    continue
                if any(endpoint(r, "src") == peer and posted_at[("send", r)] > after for r in st.recvs):
                    out.setdefault(i, []).append(m)
                    break
    return out


# complexity: the rendezvous simulation's one loop: lanes, matching and progress together
def check_rendezvous(plan: Plan, acts: dict[int, list[RankAction]], mode: str, lookahead: int = 2) -> None:  # noqa: C901, PLR0912, PLR0915
    """Prove that the posting order completes when every operation is a rendezvous (NCCL).

    Model: a rank's groups run in posting order on one lane (``batched``: one lane for all peers,
    as NCCL's coalesced groups; ``eager``: one lane per peer, as NCCL's per-pair streams); a
    group completes when each of its operations met the matching operation in the head group of
    the peer's lane; a compute action starts once its receives completed. This is stricter than
    ``dry_run`` (where a send never blocks): a receive posted before a send that the peer waits
    for deadlocks here. DeadlockError names what every stuck rank waits for.
    """
    items = {r: posting(group_actions(lst), mode, lookahead) for r, lst in acts.items()}
    pos = {r: 0 for r in items}
    lanes: dict[tuple[int, object], deque] = {}
    done: set[tuple[str, Message]] = set()

    def lane(rank: int, peer: int):
        return (rank, "*" if mode == "batched" else peer)

    progress = True
    while progress:
        progress = False
        for r, lst in items.items():
            while pos[r] < len(lst):
                it = lst[pos[r]]
                if isinstance(it, Step):
                    if not all(("recv", m) in done for m in it.recvs):
                        break
                else:
                    ops = [("send", m, endpoint(m, "dst")) for m in it.sends]
                    ops += [("recv", m, endpoint(m, "src")) for m in it.recvs]
                    by_lane: dict = {}
                    for op in ops:
                        by_lane.setdefault(lane(r, op[2]), []).append(op)
                    for key, group in by_lane.items():
                        for g in [group] if mode == "batched" else [[op] for op in group]:
                            lanes.setdefault(key, deque()).append(g)
                pos[r] += 1
                progress = True
        for (r, _k), q in list(lanes.items()):
            if not q:
                continue
            for op, m, peer in q[0]:
                if (op, m) in done:
                    continue
                other = "recv" if op == "send" else "send"
                pq = lanes.get(lane(peer, r))
                if pq and any(o == other and mm == m for o, mm, _p in pq[0]):
                    done.update({(op, m), (other, m)})
                    progress = True
        for q in lanes.values():
            while q and all((op, m) in done for op, m, _p in q[0]):
                q.popleft()
                progress = True
    if all(pos[r] == len(lst) for r, lst in items.items()) and not any(lanes.values()):
        return
    waits = []
    for (r, _k), q in sorted(lanes.items(), key=lambda kv: str(kv[0])):
        if q:
            stuck = [f"{op} {m}" for op, m, _p in q[0] if (op, m) not in done]
            waits.append(f"  rank {r} waits in a {mode} group for: " + "; ".join(stuck))
    raise DeadlockError(
        f"the {mode} posting order deadlocks when sends and receives are rendezvous (NCCL):\n" + "\n".join(waits)
    )
