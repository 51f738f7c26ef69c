"""The ``runtime.train`` command line: its arguments, in the order ``--help`` lists them.

The flags are a contract the benchmarks and users' scripts rely on; ``runtime.train``'s module
docstring says what the run does with them.
"""

from __future__ import annotations

import argparse

import torch

#: ``--dtype`` choices -> the dtype the model and the floating inputs are cast to
DTYPES = {"float32": torch.float32, "float64": torch.float64}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="torchrun ... -m runtime.train", description="Train a workload with a gpp-plan/1."
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


def _add_verify_arguments(ap: argparse.ArgumentParser) -> None:
    """``--verify`` (compare with one-process training) and its tolerances."""
    ap.add_argument("--verify", action="store_true", help="compare with one-process training")
    ap.add_argument(
        "--rtol",
        type=float,
        default=None,
        help="--verify relative tolerance (default by dtype: float32 1e-5, float64 1e-9)",
    )
    ap.add_argument(
        "--atol",
        type=float,
        default=None,
        help="--verify absolute tolerance (default: sgd float32 1e-6, float64 1e-12; adam "
        "float32 0.02*lr*steps, float64 1e-8*lr*steps; see runtime.engine.verify.default_tolerance)",
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
