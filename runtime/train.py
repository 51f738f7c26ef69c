"""Train a workload with a gpp-plan/1 under torchrun (one rank per plan device).

Commands (from the repository root; plans are JSON written by ``gpp plan`` or by hand, e.g. the
ones in ``examples/plans/``):

    # profile the model into a graph the planner reads
    python -m gpp_runtime.profile --model examples.two_branch:workload --micro-batch-sizes 1,2,4,8 -o graph.json
    # two-branch graph pipeline on 3 CPU ranks (branch 0 | branch 1 -> cat+head), checked
    # against one-process training
    torchrun --standalone --nproc-per-node 3 -m gpp_runtime.train \\
        --plan examples/plans/two_branch_3ranks.json --model examples.two_branch:workload --steps 5 --verify
    # a 2-stage 1F1B chain
    torchrun --standalone --nproc-per-node 2 -m gpp_runtime.train \\
        --plan examples/plans/sequential_2ranks.json --model examples.sequential:workload --steps 5 --verify
    # with metrics, a Chrome trace, and checkpoints every 2 steps
    torchrun --standalone --nproc-per-node 3 -m gpp_runtime.train --plan examples/plans/two_branch_3ranks.json \\
        --model examples.two_branch:workload --steps 20 --metrics m.json --trace t.json \\
        --checkpoint ckpt --checkpoint-every 2
    # continue after a crash from the newest complete checkpoint
    torchrun --standalone --nproc-per-node 3 -m gpp_runtime.train --plan examples/plans/two_branch_3ranks.json \\
        --model examples.two_branch:workload --steps 20 --checkpoint ckpt --resume

    # Adam, float64 and an explicit --verify tolerance; the NCCL posting order on gloo
    torchrun --standalone --nproc-per-node 2 -m gpp_runtime.train --plan examples/plans/sequential_2ranks.json \
        --model examples.sequential:workload --optimizer adam --lr 1e-3 --dtype float64 \
        --verify --rtol 1e-9 --atol 1e-12 --p2p batched
    # mixed precision (each forward under torch.autocast in bfloat16), checked in the same precision
    torchrun --standalone --nproc-per-node 3 -m gpp_runtime.train --plan examples/plans/two_branch_3ranks.json \
        --model examples.two_branch:workload --steps 5 --precision bf16-autocast --verify

This module is a thin user of ``gpp_runtime.GraphPipeline`` (one ``pipe.step`` per mini-batch, then
the optimizer). The workload's ``loss`` is a sum over samples (divided here by the mini-batch
size, so gradients are those of the mean) unless the workload sets ``loss_reduction = "mean"``;
the first step checks which it is and exits 2 naming ``loss_reduction`` when it is the other, and
refuses a loss that is neither (a term over the batch's statistics, in-batch negatives; see
``gpp_runtime.engine.loss_check``): every rank exits 2, the one line naming ``loss_fn``. The run stops
at the first non-finite loss: exit 1, one line naming the step (0-based) and the micro-batch. With
``--precision fp16-autocast`` a gradient that overflows skips the step on every rank and halves the
loss scale (``gpp_runtime.engine.loss_scale``; the loss itself is checked as above). A rank that stops with its own
line counts itself in the process group's store; a peer that then fails because it stopped stays
silent.
Rank r runs the stage whose ``devices`` list r (replica = position in the list). Backend: NCCL
with device cuda:LOCAL_RANK when CUDA is available (unless ``--cpu``), else gloo on CPU. Only
rank 0 logs; every rank that fails writes its own error to stderr (flushed) before exiting.
``--json`` prints one last line ``{"gpp_runtime": {...}}`` on rank 0's stdout with the measured
seconds of each step (``step_seconds``: per step, the first rank's start to the last rank's end,
warm-up included), and ``seconds_per_step`` and ``samples_per_second`` after the warm-up steps
(the timed steps' wall time over all ranks divided by their count). The two differ: ranks are
not synchronised between steps, so one step's span overlaps the next one's and the mean of
``step_seconds`` exceeds ``seconds_per_step`` (by 12-22% on the examples' CPU plans); throughput
is ``seconds_per_step``, one step's latency ``step_seconds`` (``gpp_runtime.engine.metrics``); the plan's
``predicted_iteration_seconds``; and ``ranks``: per rank ``{"rank", "stage", "peak_memory_bytes",
"predicted_peak_memory_bytes"}``, the peak measured over ``--memory-step`` (``gpp_runtime.engine.memory``:
on CPU that step is profiled, slower, and its profile is processed when the next step starts, so
by default it is step ``--warmup-steps`` - 2, at least 1: both stay out of the timed steps with 3
warm-up steps or more)
and the cost model's memory of the rank's stage for the optimizer used (``GraphPipeline.memory_stats``;
exact with ``--graph`` and ``--cluster``). The optimizer's state factor is compared with the plan's
before the first step. Exit codes: 0 ok; 2 bad input (plan
JSON, unknown module, plan/model mismatch, deadlocking orders, a loss refused at the first step)
with one message and no traceback; 1 runtime failure (peer timeout or death, a non-finite loss,
``--verify`` mismatch).
The command line (:func:`parse_args`, its flags in the order ``--help`` lists them) is a contract
the benchmarks and users' scripts rely on. Rank 0 gathers every rank's record (step times, memory,
trace events, losses) and the stages' parameters (:func:`gather`), assembles the metrics summary
(:func:`summarize`) and the ``--json`` line (:func:`json_line`), whose names (``JSON_FIELDS``) are
a contract read from outside.

Test hooks (environment): ``GPP_RUNTIME_TEST_KILL_RANK=r`` makes rank r ``os._exit(17)`` at step
``GPP_RUNTIME_TEST_KILL_STEP`` (default 1); ``GPP_RUNTIME_TEST_HANG_RANK=r`` makes it sleep there.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import logging
import math
import os
import sys
import time

import torch
import torch.distributed as dist

from gpp_solver.errors import InvalidInputError
from gpp_solver.formats.graph import load_graph

from . import cores
from .capture.precision import PRECISIONS, precision
from .capture.tracing import workload_hooks
from .engine import checkpoint, metrics
from .engine.allocator import keep_freed_memory
from .engine.memory import default_memory_step
from .engine.p2p import CommTimeout
from .engine.pipeline import GraphPipeline
from .engine.stage_setup import TrainWorkload, build, prepare, seeded_workload
from .engine.verify import (
    compare,
    default_tolerance,
    largest_difference,
    make_optimizer,
    optimizer_spec,
    reference_params,
)
from .lowering.plan_io import predicted_time_per_sample

logger = logging.getLogger("gpp_runtime.train")


# The command line: its arguments, in the order ``--help`` lists them.

#: ``--dtype`` choices -> the dtype the model and the floating inputs are cast to
DTYPES = {"float32": torch.float32, "float64": torch.float64}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="torchrun ... -m gpp_runtime.train", description="Train a workload with a gpp-plan/1."
    )
    ap.add_argument("--plan", required=True, help="plan JSON (gpp-plan/1)")
    ap.add_argument("--model", required=True, help="MODULE:FUNCTION returning the workload")
    ap.add_argument(
        "--graph",
        default=None,
        help="the profiled gpp-graph/1 the plan was made from "
        "(with --cluster: the plan is validated exactly as `gpp validate` does)",
    )
    ap.add_argument("--cluster", default=None, help="the gpp-cluster/1 the plan was made for")
    ap.add_argument("--steps", type=int, default=10, help="mini-batches to train (default 10)")
    ap.add_argument("--optimizer", choices=("sgd", "adam"), default="sgd", help="default sgd")
    ap.add_argument("--lr", type=float, default=0.01, help="learning rate (default 0.01)")
    ap.add_argument("--momentum", type=float, default=0.0, help="SGD momentum (default 0)")
    ap.add_argument(
        "--optimizer-state-factor",
        type=float,
        default=None,
        help="the optimizer_state_factor the plan was made with (default: the plan's record, "
        "else --cluster's, else 4.0 = fp32 Adam); a larger optimizer state is warned about",
    )
    ap.add_argument(
        "--dtype",
        choices=tuple(DTYPES),
        default=None,
        help="cast the model and floating inputs (default: as the workload makes them)",
    )
    ap.add_argument(
        "--precision",
        choices=tuple(PRECISIONS),
        default="float32",
        help="float32 (default); bf16-autocast or fp16-autocast: each forward and the loss under "
        "torch.autocast, fp32 weights and optimizer state, fp16 with one loss scale for the whole "
        "pipeline; bf16-model: the model, inputs and targets cast to bfloat16",
    )
    ap.add_argument(
        "--strict",
        action="store_true",
        help="refuse (exit 2) what is otherwise warned of: a --graph profiled in another precision, "
        "an optimizer state larger than the plan priced",
    )
    ap.add_argument("--seed", type=int, default=0, help="dropout streams' seed (default 0)")
    ap.add_argument(
        "--p2p",
        choices=("auto", "eager", "batched"),
        default="auto",
        help="posting of sends/receives (default auto: batched on NCCL, eager on gloo)",
    )
    _add_verify_arguments(ap)
    ap.add_argument("--timeout", type=float, default=60.0, help="seconds before a silent peer is fatal")
    ap.add_argument("--checkpoint", default=None, help="checkpoint directory")
    ap.add_argument("--checkpoint-every", type=int, default=1)
    ap.add_argument("--resume", action="store_true", help="continue from the newest checkpoint")
    _add_output_arguments(ap)
    ap.add_argument("--threads", type=int, default=None, help="torch.set_num_threads per rank")
    ap.add_argument(
        "--pin-cores",
        action="store_true",
        help="pin rank LOCAL_RANK to its own core (the LOCAL_RANK-th of its affinity set)",
    )
    ap.add_argument("--cpu", action="store_true", help="gloo on CPU even when CUDA is available")
    ap.add_argument(
        "--allreduce-overlap",
        choices=("auto", "on", "off"),
        default="auto",
        help="data-parallel all-reduce during the last backward (on) or after it (off, as the "
        "cost model prices it); default auto: on with NCCL, off with gloo",
    )
    ap.add_argument("--quiet", action="store_true", help="no summary (benchmarks)")
    return ap.parse_args(argv)


def _model_dtype(args) -> torch.dtype | None:
    """The dtype the model and its floating inputs are cast to: ``--precision``'s (bf16-model),
    else ``--dtype``'s; InvalidInputError for ``--dtype`` beside a precision other than float32."""
    prec = precision(args.precision)
    if args.dtype is not None and prec.name != "float32":
        raise InvalidInputError(
            f"--dtype {args.dtype} and --precision {prec.name} both set the precision: give one of them"
        )
    return prec.model_dtype or DTYPES.get(args.dtype)


def _tolerance(args, dtype: torch.dtype | None = None) -> tuple[float, float]:
    """``--verify``'s ``(rtol, atol)``: ``--rtol/--atol`` where given, else ``default_tolerance``'s
    for the dtype, optimizer and precision; InvalidInputError where it has none (Adam in a low
    precision) and either is missing. ``dtype``: the model's (default: the one it is cast to)."""
    dtype = dtype or _model_dtype(args) or torch.float32
    default = default_tolerance(dtype, args.optimizer, args.lr, args.steps, args.precision)
    if default is None and (args.rtol is None or args.atol is None):
        raise InvalidInputError(
            f"--verify has no default tolerance for --optimizer {args.optimizer} in --precision {args.precision} "
            "(Adam turns rounding differences into steps of about lr, as large as a wrong gradient's): "
            "pass --rtol and --atol, or verify with --optimizer sgd"
        )
    rtol, atol = default or (args.rtol, args.atol)
    return (rtol if args.rtol is None else args.rtol), (atol if args.atol is None else args.atol)


def _check_profiled_precision(args, rank: int) -> None:
    """A ``--graph`` profiled (``extra.profile.precision``; float32 when absent) in another precision
    than ``--precision``: one warning on rank 0, InvalidInputError with ``--strict``. A graph that
    was not profiled (a hand-made one) states no precision."""
    if not args.graph:
        return
    profile = load_graph(args.graph).extra.get("profile")
    if not isinstance(profile, dict):
        return
    profiled = profile.get("precision", "float32")
    if profiled == args.precision:
        return
    msg = (
        f"{args.graph} was profiled in {profiled} but trains in {args.precision}: the plan's times and "
        f"bytes are {profiled}'s (profile with --precision {args.precision})"
    )
    if args.strict:
        raise InvalidInputError(msg)
    if rank == 0:
        logger.warning("%s", msg)


def _add_verify_arguments(ap: argparse.ArgumentParser) -> None:
    """``--verify`` (compare with one-process training) and its tolerances."""
    ap.add_argument("--verify", action="store_true", help="compare with one-process training")
    ap.add_argument(
        "--rtol",
        type=float,
        default=None,
        help="--verify relative tolerance (default by dtype and precision: float32 1e-5, float64 1e-9, "
        "bf16-model bfloat16's eps, autocast 0)",
    )
    ap.add_argument(
        "--atol",
        type=float,
        default=None,
        help="--verify absolute tolerance (default: sgd float32 1e-6, float64 1e-12, low precisions "
        "eps/2*lr*steps; adam float32 0.02*lr*steps, float64 1e-8*lr*steps, low precisions none: give "
        "--rtol/--atol; see gpp_runtime.engine.verify.default_tolerance)",
    )


def _add_output_arguments(ap: argparse.ArgumentParser) -> None:
    """What the run writes and measures: metrics, trace, ``--json``, the steps timed and measured,
    the final parameters."""
    ap.add_argument("--metrics", default=None, help="write the metrics summary JSON here")
    ap.add_argument("--trace", default=None, help="write a Chrome trace of all ranks here")
    ap.add_argument("--json", action="store_true", help="print a last JSON line with the step times")
    ap.add_argument("--warmup-steps", type=int, default=1, help="steps excluded from throughput")
    ap.add_argument(
        "--memory-step",
        type=int,
        default=None,
        help="the step (0-based) whose peak memory is measured (default: --warmup-steps - 2, at least 1; "
        "on CPU it runs slower and the next step processes its profile, so with 3 or more warm-up steps "
        "neither is timed)",
    )
    ap.add_argument("--save-params", default=None, help="rank 0 saves all final parameters (torch.save)")


def _test_hooks(rank: int, step: int) -> None:
    at = int(os.environ.get("GPP_RUNTIME_TEST_KILL_STEP", "1"))
    if step != at:
        return
    if os.environ.get("GPP_RUNTIME_TEST_KILL_RANK") == str(rank):
        os._exit(17)
    if os.environ.get("GPP_RUNTIME_TEST_HANG_RANK") == str(rank):
        time.sleep(10**6)


def _fatal(rank: int, msg: str) -> None:
    """Every rank writes its own fatal error (rank 0 as a plain ``error:`` line)."""
    head = "error:" if rank == 0 else f"[runtime] rank {rank}: error:"
    print(f"{head} {msg}", file=sys.stderr, flush=True)


class NonFiniteLoss(Exception):
    """The loss of a step is not finite (exit 1, one line naming the step and micro-batch)."""


#: the process group's store key a rank that stops with its own one line counts itself in
_REPORTED = "gpp_runtime/reported"


def _store():
    try:
        return dist.distributed_c10d._get_default_store()
    except Exception:  # no store: every rank reports its own error
        return None


def _claim_report() -> bool:
    """Whether this rank is the first to stop with its own error (it writes it; the others that
    found the same stay silent, and peers that fail because it stopped do too)."""
    store = _store()
    try:
        return store is None or store.add(_REPORTED, 1) == 1
    except Exception:
        return True


def _reported() -> bool:
    """Whether a rank already stopped with its own error (this rank's failure follows from it)."""
    store = _store()
    try:
        return store is not None and store.add(_REPORTED, 0) > 0
    except Exception:
        return False


def _check_finite(pipe: GraphPipeline, loss: float, step: int) -> None:
    """Stop at a non-finite loss, naming the step and this rank's first micro-batch whose loss is
    not finite. A replica of the sink whose own micro-batches are finite goes on: it stops when
    the replica that has one does."""
    if math.isfinite(loss):
        return
    for c, value in sorted(pipe.executor.chunk_losses, key=lambda cv: cv[0].mb):
        v = float(value)
        if not math.isfinite(v):
            raise NonFiniteLoss(
                f"the loss is not finite ({v}) at step {step}, micro-batch {c.mb} (samples {c.lo}:{c.hi} of "
                f"the mini-batch): training stopped (loss_fn's value there; lower the learning rate or "
                f"check the data)"
            )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    logging.basicConfig(level=logging.INFO if rank == 0 else logging.WARNING, format="[runtime] %(message)s")
    if args.pin_cores:  # before the process group: gloo's threads inherit the affinity
        cores.pin(local_rank)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.steps < 0 or args.checkpoint_every < 1 or (args.resume and not args.checkpoint):
        _fatal(rank, "--steps >= 0, --checkpoint-every >= 1, --resume needs --checkpoint")
        return 2
    use_cuda = torch.cuda.is_available() and not args.cpu
    if not use_cuda:  # as the profile ran (gpp_runtime.engine.allocator)
        keep_freed_memory()
    p2p = args.p2p if args.p2p != "auto" else ("batched" if use_cuda else "eager")
    try:  # every check before the process group: a bad plan exits 2 without a single message
        plan, raw = prepare(args.plan, args.model)
        wl = TrainWorkload(raw, _model_dtype(args), plan.mini_batch_size)
        example, _ = wl.sample(plan.mini_batch_size, 0)
        if bool(args.graph) != bool(args.cluster):
            raise InvalidInputError("--graph and --cluster go together")
        if args.verify:
            _tolerance(args)  # refused now, not after training, where no default applies
        _check_profiled_precision(args, rank)
        setup = build(
            plan,
            wl.model,
            example,
            rank,
            world,
            p2p_mode=p2p,
            rendezvous=use_cuda,
            graph_path=args.graph,
            cluster_path=args.cluster,
            tracing=workload_hooks(wl.raw),
            precision=args.precision,
        )
    except InvalidInputError as exc:
        _fatal(rank, str(exc))
        return 2
    device = torch.device(f"cuda:{local_rank}" if use_cuda else "cpu")
    if use_cuda:
        torch.cuda.set_device(device)
    dist.init_process_group(
        "nccl" if use_cuda else "gloo", timeout=datetime.timedelta(seconds=args.timeout), rank=rank, world_size=world
    )
    try:
        code = _train(args, setup, wl, rank, device, p2p)
    except (InvalidInputError, NonFiniteLoss) as exc:
        # the rank that found it writes the one line (the first of them, for replicas); every
        # rank raised a LossRefused, so its origin alone does
        if getattr(exc, "origin", rank) == rank and _claim_report():
            _fatal(rank, str(exc))
        sys.stderr.flush()
        os._exit(1 if isinstance(exc, NonFiniteLoss) else 2)
    except (CommTimeout, RuntimeError) as exc:
        if not _reported():  # else a peer stopped with its one line (a refusal, a non-finite loss)
            print(
                f"[runtime] rank {rank}: error: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}",
                file=sys.stderr,
                flush=True,
            )
        os._exit(1)  # peers may be gone: do not wait in process-group teardown
    dist.destroy_process_group()
    return code


def _train(args, setup, wl: TrainWorkload, rank: int, device: torch.device, p2p: str) -> int:
    plan = setup.plan
    example, _ = wl.sample(plan.mini_batch_size, 0)
    mem_step = args.memory_step if args.memory_step is not None else default_memory_step(args.warmup_steps)
    pipe = GraphPipeline(
        wl.model,
        plan,
        wl.loss,
        example,
        device,
        loss_reduction=wl.reduction,
        optimizer_state_factor=args.optimizer_state_factor,
        strict_optimizer_state=args.strict,
        seed=args.seed,
        p2p=p2p,
        timeout=args.timeout,
        emulate_allreduce=wl.emulate_allreduce,
        allreduce_overlap={"on": True, "off": False}.get(args.allreduce_overlap),
        memory_step=min(mem_step, max(0, args.steps - 1)),
        graph=args.graph,
        cluster=args.cluster,
        precision=args.precision,
        _setup=setup,
    )
    # declared now, before the first step (an optimizer state the plan did not price is stated at
    # once); sharded over the stage's replicas where the plan's stage says zero 1
    cls, settings = optimizer_spec(args.optimizer, args.lr, args.momentum)
    opt = pipe.optimizer(cls, **settings)
    rec = pipe.rec
    start = 0
    if args.resume:
        start = checkpoint.latest_common_step(args.checkpoint, [s.id for s in plan.stages]) or 0
        if start:
            state = checkpoint.load(args.checkpoint, pipe.stage.id, start, setup.fingerprint, device)
            pipe.load_state_dict(state["params"])
            if opt is not None and state["optimizer"]:
                opt.load_state_dict(state["optimizer"])
            if pipe.scaler.enabled and state.get("loss_scale"):
                pipe.scaler.load_state_dict(state["loss_scale"])
            pipe.rng_step = start
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
        loss = pipe.step(*inputs, target=target)
        if loss is not None:
            losses.append(float(loss))
            _check_finite(pipe, losses[-1], step)
        t1 = time.time()
        pipe.scaler.step(opt)  # opt.step(); with fp16, on every rank or on none (a gradient not finite)
        pipe.scaler.update()
        rec.event("optimizer", t1, time.time(), "compute")
        rec.step_done(step, t0, time.time())
        if args.checkpoint and (step + 1) % args.checkpoint_every == 0:
            # every replica: a sharded optimizer's state_dict gathers its parts (a collective)
            opt_state = opt.state_dict() if opt is not None else {}
            if setup.replica == 0:
                checkpoint.save(
                    args.checkpoint,
                    pipe.stage.id,
                    step + 1,
                    setup.fingerprint,
                    pipe.state_dict(),
                    opt_state,
                    loss_scale=pipe.scaler.state_dict() if pipe.scaler.enabled else None,
                )
    return _finish(args, pipe, rank, device, losses, start)


def _finish(args, pipe: GraphPipeline, rank, device, losses, start) -> int:
    """Gather metrics/parameters on rank 0, print, write files, verify."""
    run = gather(pipe, rank, device, losses, events=bool(args.trace))
    if run is None:
        return 0
    m = summarize(run.records, pipe.setup.plan, args.warmup_steps, start)
    if m:
        if not args.quiet:
            logger.info("%s", metrics.format_summary(m))
        if args.metrics:
            metrics.write_json(args.metrics, m)
    if args.trace:
        metrics.write_json(args.trace, metrics.chrome_trace(run.records))
    if args.save_params:
        torch.save(run.params, args.save_params)
    code = 0
    if run.tied_mismatch:
        print(
            f"error: copies of tied weights differ across stages: {', '.join(run.tied_mismatch[:5])}",
            file=sys.stderr,
            flush=True,
        )
        code = 1
    if args.verify and not _verify(args, run.params, pipe.setup.plan, device):
        return 1
    if args.json and m:
        print(json_line(m), flush=True)
    return code


def _verify(args, params: dict[str, torch.Tensor], plan, device: torch.device) -> bool:
    """``--verify``: every stage's final parameters against one-process training of the same
    steps, within ``--rtol``/``--atol`` (default by dtype and optimizer); says which differ."""
    ref = TrainWorkload(seeded_workload(args.model), _model_dtype(args), plan.mini_batch_size)
    want = reference_params(
        ref.model,
        ref.sample,
        ref.loss,
        plan,
        args.steps,
        lambda ps: make_optimizer(ps, args.optimizer, args.lr, args.momentum),
        device,
        args.seed,
        tracing=workload_hooks(ref.raw),
        precision=args.precision,
    )
    rtol, atol = _tolerance(args, next((p.dtype for p in ref.model.parameters() if p.is_floating_point()), None))
    bad = compare(params, want, rtol, atol)
    if bad:
        print(
            f"verify: FAILED, {len(bad)} parameters differ from one-process training "
            f"(rtol {rtol:g}, atol {atol:g}): " + "; ".join(bad[:5]),
            file=sys.stderr,
            flush=True,
        )
        return False
    logger.info(
        "verify: OK, %d parameters equal one-process training (rtol %g, atol %g; largest difference %.3g)",
        len(want),
        rtol,
        atol,
        largest_difference(params, want),
    )
    return True


# Rank 0's report of a finished run: every rank's record (step times, memory, trace events,
# losses) and stage parameters gathered, the metrics summary, and the ``--json`` line.

#: the fields of the ``{"gpp_runtime": {...}}`` line ``--json`` prints, in order
JSON_FIELDS = (
    "mini_batch_size",
    "warmup_steps",
    "timed_steps",
    "seconds_per_step",
    "samples_per_second",
    "step_seconds",
    "losses",
    "predicted_iteration_seconds",
    "ranks",
)


@dataclasses.dataclass(frozen=True)
class Gathered:
    """What rank 0 holds after the gather."""

    #: one record per rank, in rank order (``rank_record``)
    records: list[dict]
    #: every stage's parameters under the original model's names (replica 0 of each stage)
    params: dict[str, torch.Tensor]
    #: names of tied weights whose copies differ across stages
    tied_mismatch: list[str]


def rank_record(pipe: GraphPipeline, rank: int, device: torch.device, losses: list[float], events: bool) -> dict:
    """This rank's steps, memory (measured and predicted), trace events (when ``events``) and,
    on the sink's ranks, the per-step losses."""
    setup, rec = pipe.setup, pipe.rec
    stats = pipe.memory_stats()
    mem = {"peak": stats["peak_memory_bytes"], "predicted": stats["predicted_peak_memory_bytes"]}
    if device.type != "cuda":
        mem.update(saved_activations=pipe.executor.saved_peak, rss=metrics.peak_rss_bytes())
    return {
        "rank": rank,
        "stage": setup.stage.id,
        "steps": rec.steps,
        "memory": mem,
        "memory_stats": stats,
        "events": rec.events if events else [],
        "losses": losses if setup.program.holds_sink else None,
    }


def gather(pipe: GraphPipeline, rank: int, device: torch.device, losses: list[float], events: bool) -> Gathered | None:
    """Every rank's record and parameters on rank 0 (a collective: every rank calls it); None on
    the other ranks."""
    mine = rank_record(pipe, rank, device, losses, events)
    params = {k: v.detach().cpu() for k, v in pipe.named_parameters()} if pipe.setup.replica == 0 else {}
    gathered = [None] * dist.get_world_size() if rank == 0 else None
    dist.gather_object((mine, params), gathered, dst=0)
    dist.barrier()  # every transfer of the gather is done before any rank tears down its group
    if rank != 0:
        return None
    all_params: dict[str, torch.Tensor] = {}
    tied_bad = []
    for g in gathered:
        for k, v in g[1].items():
            if k in all_params and not torch.equal(all_params[k], v):
                tied_bad.append(k)
            all_params.setdefault(k, v)
    return Gathered(records=[g[0] for g in gathered], params=all_params, tied_mismatch=tied_bad)


def summarize(records: list[dict], plan, warmup_steps: int, first_step: int) -> dict:
    """The metrics summary (``gpp_runtime.engine.metrics.summarize``) with the losses, the first step
    run, the plan's predicted iteration time, every rank's memory and each step's seconds; ``{}``
    when no step ran."""
    if not records[0]["steps"]:
        return {}
    stages = [{"id": s.id, "predicted_time_per_sample": predicted_time_per_sample(s)} for s in plan.stages]
    m = metrics.summarize(records, stages, plan.mini_batch_size, warmup_steps)
    m["losses"] = next((r["losses"] for r in records if r["losses"] is not None), [])
    m["first_step"] = first_step
    m["predicted_iteration_seconds"] = plan.predicted.iteration_time
    m["ranks"] = sorted((r["memory_stats"] for r in records), key=lambda x: x["rank"])
    m["step_seconds"] = step_seconds(records)
    return m


def step_seconds(records: list[dict]) -> list[float]:
    """Each step's span over all ranks, the first rank's start to the last rank's end; spans of
    consecutive steps overlap (the module docstring)."""
    by_step: dict[int, list] = {}
    for r in records:
        for st, t0, t1, _busy in r["steps"]:
            by_step.setdefault(st, []).append((t0, t1))
    return [max(e for _s, e in v) - min(s for s, _e in v) for _k, v in sorted(by_step.items())]


def json_line(m: dict) -> str:
    """The ``--json`` line: ``{"gpp_runtime": {...}}`` with the ``JSON_FIELDS`` of summary ``m``."""
    return json.dumps({"gpp_runtime": {k: m.get(k) for k in JSON_FIELDS}})


if __name__ == "__main__":
    _code = main()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    # skip interpreter teardown: destroying c10d/gloo objects during it can abort
    # ("terminate called without an active exception") after a run that succeeded
    os._exit(_code)
