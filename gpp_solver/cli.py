"""The ``gpp`` command (``python -m gpp_solver`` does the same): its arguments, one parser per
subcommand; what each subcommand does is :mod:`gpp_solver.commands`.

Exit codes: 0 success; 1 no feasible plan (the message says what would be needed) or solver
failure; 2 bad input or usage (one line naming the problem, no traceback).
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from typing import Any

from gpp_solver.commands import COMMANDS
from gpp_solver.errors import GppError, exit_status
from gpp_solver.formats.machines import MACHINES

CLUSTER_HELP = (
    "a gpp-cluster/1 JSON file (write one with `gpp cluster`), or a machine shorthand NAME:N "
    "(N devices) or NAME:NODESxPER_NODE, NAME one of: "
    + ", ".join(MACHINES)
    + " (e.g. v100:8, a100-40g:8, a100-80g:4x8, h100:2x8; `gpp cluster --help` lists them)"
)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit 2
        raise _UsageError(f"{self.prog}: {message}")


class _UsageError(Exception):
    pass


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("gpp_solver")
    except PackageNotFoundError:
        return "unknown (not installed; run from a checkout)"


def _positive_int(text: str) -> int:
    v = int(text) if text.strip().isdigit() else 0
    if v < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return v


def _positive_float(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        v = 0.0
    if not 0 < v <= 1e9:
        raise argparse.ArgumentTypeError(f"expected a positive number (at most 1e9), got {text[:40]!r}")
    return v


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="gpp",
        description="Plan graph pipeline parallelism (GraphPipe) for DNN training.",
        epilog="Exit codes: 0 ok, 1 no feasible plan or solver failure, 2 bad input or usage.",
    )
    p.add_argument("-v", "--verbose", action="store_true", help="log the planners' details to stderr (default: off)")
    p.add_argument("--version", action="version", version=f"gpp {_version()}", help="print the version and exit")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for add in (
        _add_model,
        _add_import,
        _add_validate,
        _add_cluster,
        _add_plan,
        _add_compare,
        _add_simulate,
        _add_show,
    ):
        add(sub)
    return p


def _add_model(sub: Any) -> None:
    from gpp_solver.workloads import MODELS

    m = sub.add_parser(
        "model",
        help="write a built-in workload as a gpp-graph/1 JSON",
        description="Write one of the paper's workloads: "
        + ", ".join(
            f"{k} ({', '.join(f'--{q.replace(chr(95), chr(45))}' for q in v.params)})" for k, v in MODELS.items()
        ),
    )
    m.add_argument("name", help="workload: " + ", ".join(MODELS))
    m.add_argument("-o", "--output", required=True, help="graph JSON to write")
    params = sorted({q for v in MODELS.values() for q in v.params})
    for q in params:
        m.add_argument(
            f"--{q.replace('_', '-')}",
            dest=q,
            type=_positive_int,
            default=None,
            help="see the workload's description (default: the paper's value)",
        )


def _add_import(sub: Any) -> None:
    i = sub.add_parser("import", help="convert a published profile (PipeDream graph.txt, Piper JSON)")
    i.add_argument("kind", choices=["pipedream", "piper"], help="the profile's format: pipedream or piper")
    i.add_argument("file", help="the profile to convert (PipeDream graph.txt or Piper input JSON)")
    i.add_argument("-o", "--output", required=True, help="graph JSON to write")
    i.add_argument(
        "--batch-size",
        type=_positive_int,
        default=None,
        help="PipeDream: samples in the profiled mini-batch the times and activation sizes refer to "
        "(default: none; required unless FILE.json gives {\"batch_size\": N})",
    )
    i.add_argument("--name", default=None, help="the graph's name (default: from the file name)")


def _add_validate(sub: Any) -> None:
    v = sub.add_parser("validate", help="check a graph, and a plan against it")
    v.add_argument("graph", help="gpp-graph/1 JSON to check")
    v.add_argument(
        "--cluster", help="cluster to check, and the plan on it (default: none, the graph alone): " + CLUSTER_HELP
    )
    v.add_argument("--plan", help="plan JSON to check against the graph (needs --cluster; default: none)")


def _add_cluster(sub: Any) -> None:
    cl = sub.add_parser(
        "cluster",
        help="write a gpp-cluster/1 JSON from a machine shorthand or human units",
        description="Write a cluster. Machines: "
        + "; ".join(f"{k}: {mm.description}" for k, mm in MACHINES.items())
        + ". Sizes take B, kB, MB, GB, TB or KiB, MiB, GiB, TiB; bandwidths the same per second "
        "(GB/s) or in bits (Gb/s = 1e9 bits/s); times s, ms, us, ns. A number alone is in bytes, "
        "bytes/s or seconds.",
    )
    cl.add_argument(
        "machine",
        nargs="?",
        default=None,
        help="start from a machine: NAME:N or NAME:NODESxPER_NODE (default: none; then --devices and "
        "--memory are required, and --inter for more than one device); the options below override its "
        "figures; every figure not given is named on stderr with the value it takes",
    )
    cl.add_argument("--devices", type=_positive_int, default=None, help="number of devices (default: the machine's)")
    cl.add_argument(
        "--per-node",
        type=_positive_int,
        default=None,
        help="devices per node (default: the machine's; without a machine a flat network)",
    )
    cl.add_argument("--memory", default=None, help="usable memory per device, e.g. 80GiB (default: the machine's)")
    cl.add_argument(
        "--intra",
        default=None,
        help="bandwidth between two devices of a node, one direction, e.g. "
        "450GB/s (default: the machine's; without a machine the --inter figure)",
    )
    cl.add_argument(
        "--inter",
        default=None,
        help="bandwidth per device between nodes, one direction, e.g. 200Gb/s or 25GB/s (default: the machine's; "
        "without a machine required for more than one device, and for one 1TB/s, never used)",
    )
    cl.add_argument(
        "--latency",
        default=None,
        help="seconds per message, e.g. 10us or 0 (default: the machine's 10us; without a machine 0)",
    )
    cl.add_argument(
        "--optimizer-state-factor",
        type=_positive_float,
        default=None,
        help="bytes of weights + gradients + optimizer state per byte of weights (default 4: fp32 Adam)",
    )
    cl.add_argument("-o", "--output", default=None, help="cluster JSON to write (default: print it)")


def _planning_arguments(sp: argparse.ArgumentParser) -> None:
    from gpp_solver.planners.gpp.planner import DEFAULT_TIME_LIMIT

    sp.add_argument(
        "graph", help="gpp-graph/1 JSON to plan (from `gpp model`, `gpp import` or `python -m gpp_runtime.profile`)"
    )
    sp.add_argument("--cluster", required=True, help=CLUSTER_HELP)
    sp.add_argument("--batch", type=_positive_int, required=True, metavar="B", help="mini-batch size B (samples)")
    sp.add_argument(
        "--time-limit",
        type=_positive_float,
        default=None,
        metavar="SECONDS",
        help=f"seconds for each planner's search (default: {DEFAULT_TIME_LIMIT:g} s for gpp, seed "
        "planners and CP-SAT included; no limit for the other planners). A search that "
        "reaches it returns its best plan so far with status time-limit",
    )
    sp.add_argument(
        "--quiet", action="store_true", help="no progress on stderr (default: progress lines, and bars on a terminal)"
    )


def _add_plan(sub: Any) -> None:
    from gpp_solver.planners.gpp.tighten import TIGHTEN_MAX_ACTIONS
    from gpp_solver.planners.registry import REGISTRY

    pl = sub.add_parser("plan", help="plan a graph on a cluster")
    _planning_arguments(pl)
    pl.add_argument(
        "--planner",
        default=None,
        help="one of: " + ", ".join(REGISTRY) + " (default: gpp if installed, else graphpipe)",
    )
    pl.add_argument(
        "--tighten",
        dest="tighten",
        action="store_true",
        default=None,
        help="tighten the micro-batch orders with CP-SAT (default: gpp does when the plan has at most "
        f"{TIGHTEN_MAX_ACTIONS:,} forward/backward actions and time is left; the other planners do not)",
    )
    pl.add_argument("--no-tighten", dest="tighten", action="store_false", help="never run CP-SAT tightening")
    pl.add_argument(
        "--micro-batch-sizes",
        default=None,
        metavar="B1,B2,...",
        help="comma-separated candidate micro-batch sizes (default: powers of two dividing B)",
    )
    pl.add_argument(
        "--per-stage-micro-batch",
        action="store_true",
        help="graphpipe: let every stage choose its own micro-batch size (GraphPipe §6; default: one size)",
    )
    pl.add_argument(
        "--depth-tradeoff",
        dest="depth_tradeoff",
        action="store_true",
        default=None,
        help="graphpipe: also try shallower stage graphs at a larger bottleneck (the default)",
    )
    pl.add_argument(
        "--no-depth-tradeoff",
        dest="depth_tradeoff",
        action="store_false",
        help="graphpipe: the least TPS per micro-batch size only (Algorithm 1's objective)",
    )
    pl.add_argument(
        "--no-shared-sinks",
        dest="shared_sinks",
        action="store_false",
        help="graphpipe: strict vertex-SP stages (a parallel block's sink never joins a branch's "
        "stage; default: shared sinks allowed)",
    )
    pl.add_argument(
        "--search-k",
        action="store_true",
        help="graphpipe: choose each stage's k of its kFkB schedule (Algorithm 2; default: 1F1B)",
    )
    pl.add_argument(
        "--schedule",
        choices=["1f1b", "zb", "auto"],
        default=None,
        help="gpp, graphpipe: orders 1f1b (kFkB), "
        "zb (weight gradients split off as W actions, same memory), auto the faster (default: gpp auto, graphpipe 1f1b)",
    )
    pl.add_argument(
        "--ladder",
        type=int,
        default=None,
        metavar="N",
        help="gpp: rungs of the memory ladder, the search run again 10%% below the plan's peak, so that more "
        "memory never gives a slower plan at the limits it visits (default: 3 on instances of at most 48 "
        "nodes and 16 devices with --time-limit of at least 10 s, else 0; 0: off)",
    )
    pl.add_argument(
        "--recompute",
        choices=["auto", "on", "off"],
        default=None,
        help="gpp, graphpipe: activation recomputation per stage: auto (where no plan fits without it, or "
        "the plan uses 90%% of the memory, the faster plan with or without it; the default), on (every "
        "stage), off (none)",
    )
    pl.add_argument(
        "--zero",
        choices=["auto", "on", "off"],
        default=None,
        help="gpp, graphpipe: the optimizer state sharded over a stage's data-parallel replicas (ZeRO-1): auto "
        "(where no plan fits without it, or the plan uses 90%% of the memory, the faster plan with or without "
        "it; the default), on (every stage of two or more replicas), off (none)",
    )
    pl.add_argument("-o", "--output", help="plan JSON to write (default: print it to stdout, the summary to stderr)")


def _add_compare(sub: Any) -> None:
    from gpp_solver.compare import DEFAULT_PLANNERS
    from gpp_solver.planners.registry import REGISTRY

    c = sub.add_parser("compare", help="run several planners and print one row each")
    _planning_arguments(c)
    c.add_argument(
        "--planners",
        default=None,
        help="comma-separated names, any of: "
        + ", ".join(REGISTRY)
        + f" (default: {', '.join(DEFAULT_PLANNERS)}, those "
        "installed; milp is exact and exponential in the graph's size: name it to run it)",
    )
    c.add_argument("--format", choices=["md", "json"], default="md", help="md table or json rows (default md)")


def _add_simulate(sub: Any) -> None:
    s = sub.add_parser("simulate", help="simulate a plan under the cost model")
    s.add_argument("plan", help="plan JSON to simulate")
    s.add_argument("--graph", required=True, help="the plan's gpp-graph/1 JSON")
    s.add_argument("--cluster", required=True, help=CLUSTER_HELP)
    s.add_argument("--trace", help="write a Chrome/Perfetto trace JSON to this path (default: none)")
    s.add_argument("--grid", action="store_true", help="print the stage x step grid and a text Gantt chart")


def _add_show(sub: Any) -> None:
    sh = sub.add_parser("show", help="draw the stage graph and the schedule (Gantt) to a PNG, PDF or SVG")
    sh.add_argument("plan", help="plan JSON to draw")
    sh.add_argument("--graph", required=True, help="the plan's gpp-graph/1 JSON")
    sh.add_argument(
        "--cluster",
        default=None,
        help="needed for the Gantt chart (default: none, then only the stage graph is drawn): " + CLUSTER_HELP,
    )
    sh.add_argument(
        "-o", "--output", required=True, help="picture to write; its extension picks the format: .png, .pdf or .svg"
    )


def main(argv: Sequence[str] | None = None) -> int:
    try:
        parser = build_parser()
        args = parser.parse_args(argv)
    except _UsageError as exc:
        print(str(exc), file=sys.stderr)
        return 2
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s"
    )
    if args.command is None:
        parser.print_help()
        return 2
    try:
        return COMMANDS[args.command](args)
    except _UsageError as exc:
        print(str(exc), file=sys.stderr)
        return 2
    except BrokenPipeError:
        return 0
    except (Exception, KeyboardInterrupt) as exc:  # one line and an exit code (errors.exit_status), no traceback
        if args.verbose and not isinstance(exc, (GppError, OSError, KeyboardInterrupt)):
            logging.getLogger("gpp_solver").exception("internal error")
        code, message = exit_status(exc)
        print(message, file=sys.stderr)
        return code


if __name__ == "__main__":
    sys.exit(main())
