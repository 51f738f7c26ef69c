"""Profile a PyTorch workload into a ``gpp-graph/1`` JSON, measuring what the trainer runs.

    python -m gpp_runtime.profile --model examples.two_branch:workload --micro-batch-sizes 1,2,4,8 -o graph.json
    # N profilers at once, each pinned to its own core (runtime/cores.py says why)
    python -m gpp_runtime.profile --model examples.sequential:bench --concurrent 2 -o graph.json

Precision: ``--precision`` as ``gpp_runtime.train`` takes it; the profile measures the model in it
(``extra.profile.precision``), so node times and the bytes of activations, outputs and weights
are that precision's.

Device: ``cuda:LOCAL_RANK`` (``cuda:0`` outside torchrun) when CUDA is available, as
``gpp_runtime.train`` runs the ranks, unless ``--cpu``; the model is moved there before anything is
measured, and the graph's ``extra.profile.device`` says which it was.

What is measured, and how, is the profiler's (``gpp_runtime.capture.profiler``), and the time-model
terms ``gpp_runtime.calibration.terms`` adds (the graph's ``op_overhead`` and ``optimizer_time_per_byte``
for ``--optimizer``, the loss in the sink node; ``--no-time-terms`` leaves them out); this module
is their command line. Exit codes: 0 ok, 2 bad input (one message, no traceback).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys

import torch

from gpp_solver.errors import InvalidInputError

from . import cores
from .calibration.quality import assess
from .calibration.terms import profile_with_terms
from .capture.fx_graph import load_workload
from .capture.precision import PRECISIONS, in_precision, precision
from .capture.profiler import profile
from .engine.allocator import keep_freed_memory

logger = logging.getLogger(__name__)


def main(argv: list[str] | None = None) -> int:
    """CLI entry point; returns the exit code (0 ok, 2 bad input)."""
    ap = _parser()
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if any(a == "--batch-sizes" or a.startswith("--batch-sizes=") for a in (sys.argv[1:] if argv is None else argv)):
        logger.warning("--batch-sizes is deprecated: it means micro-batch sizes, spelled --micro-batch-sizes")
    try:
        sizes = [int(s) for s in args.micro_batch_sizes.split(",") if s.strip()]
    except ValueError:
        print(f"error: --micro-batch-sizes must be integers, but got {args.micro_batch_sizes!r}", file=sys.stderr)
        return 2
    if args.threads < 1:
        print(f"error: --threads must be >= 1, got {args.threads}", file=sys.stderr)
        return 2
    device = profile_device(args.cpu)
    if args.concurrent != 1 and device.type != "cpu":
        print(
            f"error: --concurrent runs profilers on CPU cores, but this profile runs on {device} "
            "(add --cpu to profile on the CPU, or drop --concurrent)",
            file=sys.stderr,
        )
        return 2
    worker = cores.worker_index()
    if args.concurrent != 1 and worker is None:
        argv_ = sys.argv[1:] if argv is None else list(argv)
        try:
            doc = _assessed(lambda: cores.profile_concurrent(argv_, args.concurrent, args.output), args.again)
        except InvalidInputError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        return _write(doc, args.output)
    if worker is not None:
        cores.pin(worker[0])
    if device.type == "cpu":
        keep_freed_memory()  # as the ranks run (gpp_runtime.engine.allocator)
    threads = torch.get_num_threads()
    torch.set_num_threads(args.threads)
    try:
        torch.manual_seed(0)
        wl = in_precision(load_workload(args.model), precision(args.precision))
        wl.model.to(device)
        if worker is not None:  # one of --concurrent's workers: the parent assesses the merged profile
            doc = _profile(args, wl, sizes)
        else:
            doc = _assessed(lambda: _profile(args, wl, sizes), args.again)
        if worker is not None:  # keep this core busy until every worker has finished
            _write(doc, args.output)
            signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
            cores.busy_loop(wl, sizes[-1], prec=precision(args.precision))
    except InvalidInputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    finally:
        torch.set_num_threads(threads)
    return _write(doc, args.output)


def _profile(args, wl, sizes: list[int]) -> dict:
    """One profile of ``wl`` as the options say."""
    common = dict(name=args.name or args.model, rounds=args.rounds, precision=args.precision)
    if args.no_time_terms:
        return profile(wl, sizes, args.warmup, args.repeats, **common)
    return profile_with_terms(
        wl, sizes, args.warmup, args.repeats, optimizer=args.optimizer, in_situ=not args.no_in_situ, **common
    )


def _assessed(measure, again: bool) -> dict:
    """``measure()``'s profile with its ``extra.profile.quality`` (``calibration.quality``) and a
    one-line warning naming the sizes that look measured under interference; with ``again``
    (``--again``), such a profile is measured once more and the one with fewer such sizes kept."""
    doc = measure()
    quality = assess(doc)
    if quality["suspect_sizes"] and again:
        logger.warning(
            "profile: sizes %s look measured under interference (%s): measuring again",
            ", ".join(map(str, quality["suspect_sizes"])),
            "; ".join(quality["reasons"][:3]),
        )
        second = measure()
        assessed = assess(second)
        if len(assessed["suspect_sizes"]) < len(quality["suspect_sizes"]):
            doc, quality = second, assessed
    doc["extra"]["profile"]["quality"] = quality
    if quality["suspect_sizes"]:
        logger.warning(
            "profile: sizes %s %slook measured under interference (%s): plans made from it may be "
            "wrong there; profile with nothing else running%s",
            ", ".join(map(str, quality["suspect_sizes"])),
            "still " if again else "",
            "; ".join(quality["reasons"][:3]),
            "" if again else " (--again measures once more)",
        )
    return doc


def profile_device(cpu: bool) -> torch.device:
    """Where the model is profiled: the device ``gpp_runtime.train`` gives this rank (module docstring)."""
    if cpu or not torch.cuda.is_available():
        return torch.device("cpu")
    device = torch.device(f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}")
    torch.cuda.set_device(device)
    return device


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m gpp_runtime.profile", description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="MODULE:FUNCTION returning a workload")
    ap.add_argument(
        "--micro-batch-sizes",
        "--batch-sizes",
        dest="micro_batch_sizes",
        default="1,2,4,8",
        help="comma-separated micro-batch sizes (default 1,2,4,8; --batch-sizes is the deprecated spelling)",
    )
    ap.add_argument(
        "--again",
        action="store_true",
        help="when a size looks measured under interference, measure the whole profile once more and "
        "keep the one with fewer such sizes (either way it is recorded in extra.profile.quality and "
        "warned of)",
    )
    ap.add_argument("--warmup", type=int, default=2, help="untimed runs before timing (default 2)")
    ap.add_argument("--repeats", type=int, default=5, help="timed runs; the median is kept (default 5)")
    ap.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="sweeps over every size and node, one after the other; each node keeps the median of "
        "its rounds' medians (default 3: a slow stretch of the machine lands in one round of a node, "
        "not in a whole range of nodes)",
    )
    ap.add_argument(
        "--threads", type=int, default=1, help="intra-op threads, as each trainer rank uses (default 1, like torchrun)"
    )
    ap.add_argument(
        "--concurrent",
        type=int,
        default=1,
        help="N profilers at once, each pinned to its own core; the median is kept "
        "(default 1: one unpinned process; see runtime/cores.py)",
    )
    ap.add_argument("--name", default=None, help="graph name (default: the FUNCTION spec)")
    ap.add_argument(
        "--optimizer",
        choices=("sgd", "adam"),
        default="sgd",
        help="the optimizer whose step is timed (gpp_runtime.train's --optimizer; default sgd)",
    )
    ap.add_argument(
        "--no-time-terms",
        action="store_true",
        help="leave out op_overhead, optimizer_time_per_byte and the loss (node times only)",
    )
    ap.add_argument(
        "--no-in-situ",
        action="store_true",
        help="keep the node times as profiled: no calibration to a one-stage plan as the runtime runs it "
        "(runtime/calibration/insitu.py)",
    )
    ap.add_argument(
        "--cpu",
        action="store_true",
        help="profile on the CPU even where CUDA is available (gpp_runtime.train's --cpu; default: the GPU)",
    )
    ap.add_argument(
        "--precision",
        choices=tuple(PRECISIONS),
        default="float32",
        help="the precision the model will train in (gpp_runtime.train's --precision; default float32): "
        "bf16-autocast or fp16-autocast measure under torch.autocast, bf16-model casts the model and "
        "its inputs; recorded as extra.profile.precision",
    )
    ap.add_argument("-o", "--output", required=True)
    return ap


def _write(doc: dict, output: str) -> int:
    tmp = f"{output}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=1)
    os.replace(tmp, output)  # a concurrent worker's parent waits for the file to appear whole
    logger.info("wrote %s: %d nodes, %d edges", output, len(doc["nodes"]), len(doc["edges"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
