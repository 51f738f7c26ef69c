"""The NCCL posting order: the rendezvous checker and the batched groups (no process group needed)."""

from __future__ import annotations

import pytest
from runtime_plans import SEQ, plan, stage

from gpp_runtime.lowering.actions import Step, TransferSpec, endpoint, group_actions, lower
from gpp_runtime.lowering.plan_io import read_plan
from gpp_runtime.lowering.posting import Post, check_rendezvous, posting, send_releases
from gpp_solver.errors import DeadlockError


def _chain(b0=2, b1=2, dev1=(1,)):
    p = read_plan(
        plan(8, [stage(0, SEQ[:4], [0], b0, 8, depth=1), stage(1, SEQ[4:], list(dev1), b1, 8, depth=0)], [[0, 1]])
    )
    return p, lower(p, [TransferSpec("layers.3", 0, 1, 3)])


def test_early_receive_before_a_send_deadlocks_under_rendezvous():
    # an eager posting (receives two compute actions ahead): stage 0 posts recv grad(mb0)
    # before send act(mb0) on the one stream it shares with rank 1
    p, acts = _chain()
    items = posting(group_actions(acts[0]), "eager", lookahead=2)
    posts = [it for it in items if isinstance(it, Post)]
    first_grad_recv = next(i for i, it in enumerate(posts) if it.recvs and it.recvs[0].kind == "grad")
    first_send = next(i for i, it in enumerate(posts) if it.sends)
    assert first_grad_recv < first_send
    with pytest.raises(DeadlockError, match="rank 0 waits .*recv grad"):
        check_rendezvous(p, acts, "eager", lookahead=2)


@pytest.mark.parametrize("b0,b1,dev1", [(2, 2, (1,)), (2, 4, (1,)), (4, 2, (1,)), (4, 4, (1, 2))])
def test_batched_groups_complete_under_rendezvous(b0, b1, dev1):
    p, acts = _chain(b0, b1, dev1)
    check_rendezvous(p, acts, "batched")
    # posting receives only when due is not enough on one stream per peer: after F1 stage 0
    # sends act(mb1) while stage 1, after B0, sends grad(mb0); both sends wait for receives
    with pytest.raises(DeadlockError):
        check_rendezvous(p, acts, "eager", lookahead=0)


def test_batched_groups_hold_previous_sends_and_due_receives():
    _p, acts = _chain()
    steps = group_actions(acts[0])
    items = posting(steps, "batched")
    assert isinstance(items[0], Post) and items[0] == Post((), ())
    computes = [it for it in items if isinstance(it, Step)]
    assert computes == steps
    for i, it in enumerate(items):
        if isinstance(it, Step):
            nxt = items[i + 1] if i + 1 < len(items) else Post()
            assert isinstance(nxt, Post) and set(nxt.sends) == set(it.sends)
            assert set(items[i - 1].recvs) == set(it.recvs)  # no receive before it is due


@pytest.mark.parametrize("mode", ["eager", "batched"])
@pytest.mark.parametrize("b0,b1,dev1", [(2, 2, (1,)), (1, 1, (1,)), (2, 4, (1, 2))])
def test_sends_are_released_after_their_receive_is_posted(mode, b0, b1, dev1):
    """Each send is released (waited for) at most once, at a step after it was posted, and only where
    the receiving rank posted a message to this one after posting the send's receive; the
    activations a stage sends come free before the step ends (their gradients come back)."""
    p, acts = _chain(b0, b1, dev1)
    items = {r: posting(group_actions(a), mode, lookahead=2) for r, a in acts.items()}
    posted = {}
    for lst in items.values():
        for i, it in enumerate(lst):
            if isinstance(it, Post):
                posted.update({("send", m): i for m in it.sends} | {("recv", m): i for m in it.recvs})
    for rank, mine in items.items():
        rel = send_releases(items, rank)
        released = [m for ms in rel.values() for m in ms]
        assert len(released) == len(set(released))
        for i, ms in rel.items():
            st = mine[i]
            assert isinstance(st, Step)
            for m in ms:
                assert posted[("send", m)] < i  # sent before
                peer = endpoint(m, "dst")
                assert any(endpoint(r, "src") == peer and posted[("send", r)] > posted[("recv", m)] for r in st.recvs)
        acts_sent = [m for it in mine if isinstance(it, Post) for m in it.sends if m.kind == "act"]
        assert set(acts_sent) <= set(released), "every sent activation is freed when its gradient returns"
