"""A torchrun worker for the ZeRO-1 tests: ``zero_worker.py PLAN.json`` (4 ranks, the plan's stage
1 on ranks 1 and 2 with ``"zero": 1``).

Every rank builds ``examples.two_tower``'s model as a ``GraphPipeline``. On the sharded stage's
replicas: an Adam over ``pipe.parameters()`` is refused, naming ``pipe.optimizer``; the one
``pipe.optimizer(torch.optim.Adam)`` builds holds, after a step, half of the stage's state (the
part's two moments), the stage's weights are equal on both replicas, and ``state_dict()`` gathers
the whole state. Prints ``ZERO-OK`` on every rank on success."""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist

import gpp_runtime
from examples.two_tower import workload
from gpp_solver.errors import InvalidInputError


def main(plan_path: str) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    wl = workload()
    x, y = wl.sample(8, 0)
    pipe = gpp_runtime.GraphPipeline(wl.model, plan_path, wl.loss, x, loss_reduction="sum")
    if pipe.stage.zero:
        try:
            pipe.use_optimizer(torch.optim.Adam(pipe.parameters(), lr=1e-3))
        except InvalidInputError as exc:
            assert "pipe.optimizer(torch.optim.Adam" in str(exc), exc
        else:
            raise AssertionError("an Adam over the whole sharded stage was accepted")
    opt = pipe.optimizer(torch.optim.Adam, lr=1e-3)
    for step in range(2):
        opt.zero_grad()
        x, y = wl.sample(8, step)
        pipe.step(*x, target=y)
        opt.step()
    if pipe.stage.zero:
        weights = sum(p.numel() for p in pipe.parameters())
        moments = sum(t.numel() for t in opt.state_tensors() if t.dim() > 0)
        assert moments == 2 * -(-weights // 2), (moments, weights)  # the two moments of the part
        assert abs(pipe.measured_state_factor - 3.0) < 0.01, pipe.measured_state_factor
        flat = torch.cat([p.detach().reshape(-1) for p in pipe.parameters()])
        peers = [torch.empty_like(flat) for _ in range(2)]
        dist.all_gather(peers, flat, group=pipe.dp_group)
        assert torch.equal(peers[0], peers[1]), "the replicas' weights differ"
        whole = opt.state_dict()["state"][0]["exp_avg"]
        assert whole.numel() == 2 * -(-weights // 2), (whole.numel(), weights)
    print(f"ZERO-OK rank {rank}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
