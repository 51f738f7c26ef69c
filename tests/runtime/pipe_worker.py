"""A torchrun worker for the GraphPipeline tests: ``pipe_worker.py CASE PLAN.json``.

Every rank builds the case's model (seeded), trains ``STEPS`` mini-batches through
``gpp_runtime.GraphPipeline`` with Adam, and rank 0 gathers every stage's gradients (after the first
step) and parameters (after the last) under the original names and compares them with the same
loop on one process, and the copies of a weight tied across stages with each other (bitwise).
Prints ``PIPE-OK <details>`` on success; exits 1 with the differences otherwise.
"""

from __future__ import annotations

import json
import os
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

import gpp_runtime
from examples.two_tower import workload as two_tower_workload

STEPS = 3
B = 8


class TwoTower(nn.Module):
    """Text and image towers (Sequential, so names are ``text.0.weight``), concatenated, a head."""

    def __init__(self) -> None:
        super().__init__()
        self.text = nn.Sequential(nn.Linear(6, 8), nn.ReLU(inplace=True), nn.Linear(8, 8))
        self.image = nn.Sequential(nn.Linear(5, 8), nn.ReLU(), nn.Linear(8, 8))
        self.head = nn.Linear(16, 3)

    def forward(self, t, i):
        return self.head(torch.cat([self.text(t), self.image(i)], dim=1))


class TinyGPT(nn.Module):
    """Embedding, two MLP blocks, a head whose weight IS the embedding's weight (GPT-2 style)."""

    def __init__(self, vocab: int = 11, width: int = 8) -> None:
        super().__init__()
        self.wte = nn.Embedding(vocab, width)
        self.block0 = nn.Linear(width, width)
        self.act0 = nn.GELU()
        self.block1 = nn.Linear(width, width)
        self.ln = nn.LayerNorm(width)
        self.lm_head = nn.Linear(width, vocab, bias=False)
        self.lm_head.weight = self.wte.weight

    def forward(self, idx):
        h = self.wte(idx)
        h = h + self.block1(self.act0(self.block0(h)))
        return self.lm_head(self.ln(h))


@torch.fx.wrap
def split_dict(x):
    """A value that is a dict of tensors (an fx leaf: one node, one dict value)."""
    return {"lo": x[..., :4], "hi": x[..., 4:]}


class TupleDict(nn.Module):
    """MultiheadAttention (a tuple value) and a dict value, each cut from its consumer."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(6, 8)
        self.attn = nn.MultiheadAttention(8, 2, batch_first=True)
        self.fc = nn.Linear(8, 8)
        self.out = nn.Linear(4, 3)

    def forward(self, x):
        h = self.inp(x)
        a = self.attn(h, h, h)
        h = a[0] + a[1].sum(-1, keepdim=True)
        d = split_dict(self.fc(h))
        return self.out(torch.relu_(d["lo"] * d["hi"])).mean(1)


def tok_loss(logits, target):
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1))


_GPT2: dict = {}


def _gpt2_tied() -> nn.Module:
    """HuggingFace GPT-2, head tied to the embedding (examples.real_models, torch.export); a new
    model (the caller seeds), its workload's ``sample``/``loss`` kept for the lambdas below."""
    from examples.real_models import gpt2_tiny_tied

    wl = gpt2_tiny_tied()
    _GPT2.setdefault("wl", wl)
    return wl.model.double()  # float64: see "tuple_dict" (a key bias's zero gradient under Adam)


CASES = {
    # name: (model class, make inputs(B, step), loss[, loss reduction])
    "two_tower": (TwoTower, lambda n, s: ((torch.randn(n, 6), torch.randn(n, 5)), torch.randn(n, 3)), F.mse_loss),
    "tied": (TinyGPT, lambda n, s: ((torch.randint(0, 11, (n, 5)),), torch.randint(0, 11, (n, 5))), tok_loss),
    # float64: the key bias gets a zero gradient up to rounding, which Adam would magnify
    "tuple_dict": (
        lambda: TupleDict().double(),
        lambda n, s: ((torch.randn(n, 4, 6, dtype=torch.float64),), torch.randn(n, 3, dtype=torch.float64)),
        F.mse_loss,
    ),
    "gpt2_tied": (_gpt2_tied, lambda n, s: _GPT2["wl"].sample(n, s), lambda o, t: _GPT2["wl"].loss(o, t), "sum"),
}


def data(case: str, step: int):
    torch.manual_seed(100 + step)
    return CASES[case][1](B, step)


def one_process(case: str, steps: int):
    torch.manual_seed(0)
    model = CASES[case][0]()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    grads = None
    for step in range(steps):
        inputs, target = data(case, step)
        opt.zero_grad()
        CASES[case][2](model(*inputs), target).backward()
        if grads is None:
            grads = {n: p.grad.clone() for n, p in model.named_parameters()}
        opt.step()
        sched.step()
    return grads, {n: p.detach().clone() for n, p in model.named_parameters()}


def main() -> int:
    global B
    case, plan_path = sys.argv[1], sys.argv[2]
    with open(plan_path) as f:
        B = json.load(f)["mini_batch_size"]  # the hand-written plans' 8, or a planner's
    p2p = sys.argv[3] if len(sys.argv) > 3 else "auto"
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = CASES[case][0]()
    example, _ = data(case, 0)
    reduction = CASES[case][3] if len(CASES[case]) > 3 else "mean"
    pipe = gpp_runtime.GraphPipeline(
        model, plan_path, CASES[case][2], example_inputs=example, p2p=p2p, loss_reduction=reduction
    )
    opt = torch.optim.Adam(pipe.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    grads, losses = {}, []
    for step in range(STEPS):
        inputs, target = data(case, step)
        opt.zero_grad()
        loss = pipe.step(*inputs, target=target)
        losses.append(None if loss is None else float(loss))
        if step == 0:
            grads = {n: p.grad.clone() for n, p in pipe.named_parameters()}
        opt.step()
        sched.step()
    params = {n: p.detach().clone() for n, p in pipe.named_parameters()}
    # state_dict round trip under the original names
    sd = pipe.state_dict()
    pipe.load_state_dict({k: v.clone() for k, v in sd.items()})
    mine = (rank, pipe.stage.id, grads, params, losses, sorted(sd), pipe.measured_state_factor)
    out = [None] * dist.get_world_size() if rank == 0 else None
    dist.gather_object(mine, out, dst=0)
    dist.barrier()
    if rank != 0:
        return 0
    want_g, want_p = one_process(case, STEPS)
    bad = []
    copies: dict[str, list] = {}  # a weight tied across stages: every stage's copy, bitwise
    for r, _sid, _g, p, _l, _k, _f in out:
        for n, t in p.items():
            copies.setdefault(n, []).append((r, t))
    for n, cs in copies.items():
        if any(not torch.equal(t, cs[0][1]) for _r, t in cs[1:]):
            bad.append(f"copies of {n} differ across ranks {[r for r, _t in cs]} after {STEPS} steps")
    for r, _sid, g, p, _l, _k, _f in out:
        for n in p:
            if n not in want_p:
                bad.append(f"rank {r}: {n} is not a name of the original model")
                continue
            if not torch.allclose(g[n], want_g[n], rtol=1e-4, atol=1e-6):
                bad.append(f"rank {r}: grad of {n} differs by {(g[n] - want_g[n]).abs().max():.3g}")
            if not torch.allclose(p[n], want_p[n], rtol=1e-4, atol=1e-6):
                bad.append(f"rank {r}: {n} differs by {(p[n] - want_p[n]).abs().max():.3g} after {STEPS} steps")
    missing = set(want_p) - {n for o in out for n in o[3]}
    if missing:
        bad.append(f"no stage holds {sorted(missing)}")
    if bad:
        print("PIPE-FAILED " + "; ".join(bad[:8]), file=sys.stderr, flush=True)
        return 1
    holders = {}
    for o in out:
        for n in o[3]:
            holders.setdefault(n, []).append(o[1])
    info = {
        "names": {o[1]: sorted(o[3]) for o in out},
        "losses": {o[0]: o[4] for o in out},
        "holders": {n: sorted(set(s)) for n, s in holders.items()},
        "state_factor": {o[0]: o[6] for o in out},
    }
    print("PIPE-OK " + json.dumps(info), flush=True)
    return 0


def undeclared_mean_workload():
    """For gpp_runtime.train: a mean-reduced loss that does not say so (must be refused)."""
    wl = two_tower_workload()
    wl.loss = F.mse_loss
    return wl


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    os._exit(code)
