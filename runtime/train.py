"""Train a workload with a gpp-plan/1 under torchrun (one rank per plan device).

Commands (from the repository root; plans are JSON written by ``gpp plan`` or by hand, e.g. the
ones in ``examples/plans/``):

    # profile the model into a graph the planner reads
    python -m runtime.profile --model examples.two_branch:workload --batch-sizes 1,2,4,8 -o graph.json
    # two-branch graph pipeline on 3 CPU ranks (branch 0 | branch 1 -> cat+head), checked
    # against one-process training
    torchrun --standalone --nproc-per-node 3 -m runtime.train \\
        --plan examples/plans/two_branch_3ranks.json --model examples.two_branch:workload --steps 5 --verify
    # a 2-stage 1F1B chain
    torchrun --standalone --nproc-per-node 2 -m runtime.train \\
        --plan examples/plans/sequential_2ranks.json --model examples.sequential:workload --steps 5 --verify
    # with metrics, a Chrome trace, and checkpoints every 2 steps
    torchrun --standalone --nproc-per-node 3 -m runtime.train --plan examples/plans/two_branch_3ranks.json \\
        --model examples.two_branch:workload --steps 20 --metrics m.json --trace t.json \\
        --checkpoint ckpt --checkpoint-every 2
    # continue after a crash from the newest complete checkpoint
    torchrun --standalone --nproc-per-node 3 -m runtime.train --plan examples/plans/two_branch_3ranks.json \\
        --model examples.two_branch:workload --steps 20 --checkpoint ckpt --resume

Rank r runs the stage whose ``devices`` list r (replica = position in the list). Backend: NCCL
with device cuda:LOCAL_RANK when CUDA is available (unless ``--cpu``), else gloo on CPU. Only
rank 0 prints, except a rank that fails says why on stderr. Exit codes: 0 ok; 2 bad input (plan
JSON, unknown module, plan/model mismatch, deadlocking orders) with one message and no
traceback; 1 runtime failure (peer timeout or death, ``--verify`` mismatch).

Test hooks (environment): ``GPP_RUNTIME_TEST_KILL_RANK=r`` makes rank r ``os._exit(17)`` at step
``GPP_RUNTIME_TEST_KILL_STEP`` (default 1); ``GPP_RUNTIME_TEST_HANG_RANK=r`` makes it sleep there.
"""

from __future__ import annotations

import argparse
import datetime
import logging
import os
import sys
import time

import torch
import torch.distributed as dist

from gpp_solver.errors import InvalidInputError
from runtime import checkpoint, metrics
from runtime.executor import StageExecutor
from runtime.p2p import P2P, CommTimeout
from runtime.stage_setup import RankSetup, prepare
from runtime.verify import compare, make_optimizer, reference_params

logger = logging.getLogger("runtime.train")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="torchrun ... -m runtime.train",
                                 description="Train a workload with a gpp-plan/1.")
    ap.add_argument("--plan", required=True, help="plan JSON (gpp-plan/1)")
    ap.add_argument("--model", required=True, help="MODULE:FUNCTION returning the workload")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--lr", type=float, default=0.01)
    ap.add_argument("--momentum", type=float, default=0.0)
    ap.add_argument("--verify", action="store_true", help="compare with one-process training")
    ap.add_argument("--timeout", type=float, default=60.0, help="seconds before a silent peer is fatal")
    ap.add_argument("--checkpoint", default=None, help="checkpoint directory")
    ap.add_argument("--checkpoint-every", type=int, default=1)
    ap.add_argument("--resume", action="store_true", help="continue from the newest checkpoint")
    ap.add_argument("--metrics", default=None, help="write the metrics summary JSON here")
    ap.add_argument("--trace", default=None, help="write a Chrome trace of all ranks here")
    ap.add_argument("--warmup-steps", type=int, default=1, help="steps excluded from throughput")
    ap.add_argument("--save-params", default=None, help="rank 0 saves all final parameters (torch.save)")
    ap.add_argument("--threads", type=int, default=None, help="torch.set_num_threads per rank")
    ap.add_argument("--cpu", action="store_true", help="gloo on CPU even when CUDA is available")
    ap.add_argument("--quiet", action="store_true", help="no summary (benchmarks)")
    return ap.parse_args(argv)


def _test_hooks(rank: int, step: int) -> None:
    at = int(os.environ.get("GPP_RUNTIME_TEST_KILL_STEP", "1"))
    if step != at:
        return
    if os.environ.get("GPP_RUNTIME_TEST_KILL_RANK") == str(rank):
        os._exit(17)
    if os.environ.get("GPP_RUNTIME_TEST_HANG_RANK") == str(rank):
        time.sleep(10**6)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    logging.basicConfig(level=logging.INFO if rank == 0 else logging.WARNING,
                        format="[runtime] %(message)s")
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.steps < 0 or args.checkpoint_every < 1 or (args.resume and not args.checkpoint):
        if rank == 0:
            print("error: --steps >= 0, --checkpoint-every >= 1, --resume needs --checkpoint", file=sys.stderr)
        return 2
    try:
        setup = prepare(args.plan, args.model, rank, world)
    except InvalidInputError as exc:
        if rank == 0:
            print(f"error: {exc}", file=sys.stderr)
        return 2
    use_cuda = torch.cuda.is_available() and not args.cpu
    device = torch.device(f"cuda:{local_rank}" if use_cuda else "cpu")
    if use_cuda:
        torch.cuda.set_device(device)
    timeout = datetime.timedelta(seconds=args.timeout)
    dist.init_process_group("nccl" if use_cuda else "gloo", timeout=timeout,
                            rank=rank, world_size=world)
    try:
        code = _train(args, setup, rank, device)
    except (CommTimeout, RuntimeError) as exc:
        print(f"[runtime] rank {rank}: error: {str(exc).splitlines()[0]}", file=sys.stderr, flush=True)
        sys.stderr.flush()
        os._exit(1)  # peers may be gone: do not wait in process-group teardown
    except InvalidInputError as exc:
        if rank == 0:
            print(f"error: {exc}", file=sys.stderr, flush=True)
        os._exit(2)
    dist.destroy_process_group()
    return code


def _groups(setup: RankSetup):
    """Data-parallel subgroups, created on every rank in stage order; this rank's or None."""
    mine = None
    for s in setup.plan.stages:
        if s.dp > 1:
            g = dist.new_group(list(s.devices))
            if s.id == setup.stage.id:
                mine = g
    return mine


def _train(args, setup: RankSetup, rank: int, device: torch.device) -> int:
    plan, stage, wl = setup.plan, setup.stage, setup.workload
    module = setup.program.module.to(device)
    module.train()
    group = _groups(setup)
    opt = make_optimizer(module.parameters(), args.lr, args.momentum)
    comm = P2P(device, args.timeout)
    rec = metrics.Recorder(rank=rank, stage=stage.id)
    ex = StageExecutor(setup.program, stage, setup.replica, rank, setup.actions[rank], setup.meta,
                       wl.loss, plan.mini_batch_size, device, comm, rec)
    start = 0
    if args.resume:
        start = checkpoint.latest_common_step(args.checkpoint, [s.id for s in plan.stages]) or 0
        if start:
            checkpoint.load(args.checkpoint, stage.id, start, setup.fingerprint, module, opt, device)
            logger.info("resumed from step %d of %s", start, args.checkpoint)
        else:
            logger.info("no complete checkpoint in %s: starting from step 0", args.checkpoint)
    dist.barrier()
    losses = []
    for step in range(start, args.steps):
        _test_hooks(rank, step)
        t0 = time.time()
        if opt is not None:
            opt.zero_grad(set_to_none=True)
        inputs, target = wl.sample(plan.mini_batch_size, step)
        losses.append(ex.run_step(inputs, target))
        if group is not None:
            _allreduce(module, group, comm, rec, stage.id)
        t1 = time.time()
        if opt is not None:
            opt.step()
        rec.event("optimizer", t1, time.time(), "compute")
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        rec.step_done(step, t0, time.time())
        if args.checkpoint and (step + 1) % args.checkpoint_every == 0 and setup.replica == 0:
            checkpoint.save(args.checkpoint, stage.id, step + 1, setup.fingerprint, module, opt)
    return _finish(args, setup, rank, device, module, rec, ex, losses, start)


def _allreduce(module, group, comm: P2P, rec, sid: int) -> None:
    """Sum the gradients of the stage's replicas (loss already divided by B)."""
    t0 = time.time()
    params = list(module.parameters())
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    flat = torch.cat([p.grad.reshape(-1) for p in params])
    comm.wait(dist.all_reduce(flat, group=group, async_op=True), f"gradient all-reduce of stage {sid}")
    offset = 0
    for p in params:
        n = p.numel()
        p.grad.copy_(flat[offset:offset + n].view_as(p))
        offset += n
    rec.event("all-reduce", t0, time.time(), "comm")


def _finish(args, setup: RankSetup, rank, device, module, rec, ex, losses, start) -> int:
    """Gather metrics/parameters on rank 0, print, write files, verify."""
    mem = ({"cuda_max_allocated": torch.cuda.max_memory_allocated(device)} if device.type == "cuda"
           else {"saved_activations": ex.saved_peak, "rss": metrics.peak_rss_bytes()})
    mine = {"rank": rank, "stage": setup.stage.id, "steps": rec.steps, "memory": mem,
            "events": rec.events if args.trace else [],
            "loss_sums": losses if setup.program.holds_sink else None}
    params = ({k: v.detach().cpu() for k, v in module.named_parameters()}
              if setup.replica == 0 else {})
    world = dist.get_world_size()
    gathered = [None] * world if rank == 0 else None
    dist.gather_object((mine, params), gathered, dst=0)
    dist.barrier()  # every transfer of the gather is done before any rank tears down its group
    if rank != 0:
        return 0
    records = [g[0] for g in gathered]
    all_params: dict[str, torch.Tensor] = {}
    for g in gathered:
        all_params.update(g[1])
    sums = [r["loss_sums"] for r in records if r["loss_sums"] is not None]
    b = setup.plan.mini_batch_size
    per_step = [sum(x) / b for x in zip(*sums)] if sums else []
    stages = [{"id": s.id, "predicted_time_per_sample": s.predicted_time_per_sample}
              for s in setup.plan.stages]
    m = metrics.summarize(records, stages, b, args.warmup_steps) if records[0]["steps"] else {}
    if m:
        m["losses"] = per_step
        m["first_step"] = start
        if not args.quiet:
            logger.info("%s", metrics.format_summary(m))
        if args.metrics:
            metrics.write_json(args.metrics, m)
    if args.trace:
        metrics.write_json(args.trace, metrics.chrome_trace(records))
    if args.save_params:
        torch.save(all_params, args.save_params)
    if args.verify:
        want = reference_params(args.model, args.steps, b, args.lr, args.momentum, device)
        bad = compare(all_params, want)
        if bad:
            print(f"verify: FAILED, {len(bad)} parameters differ from one-process training: "
                  + "; ".join(bad[:5]), file=sys.stderr, flush=True)
            return 1
        logger.info("verify: OK, %d parameters equal one-process training (rtol 1e-5, atol 1e-6)",
                    len(want))
    return 0


if __name__ == "__main__":
    _code = main()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    # skip interpreter teardown: destroying c10d/gloo objects during it can abort
    # ("terminate called without an active exception") after a run that succeeded
    os._exit(_code)
