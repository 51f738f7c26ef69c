"""The ``gpp`` command (``python -m gpp_solver`` does the same).

Exit codes: 0 success; 1 no feasible plan (the message says what would be needed) or solver
failure; 2 bad input or usage (one line naming the problem, no traceback).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from typing import Any, Sequence

from gpp_solver.formats.cluster_spec import cluster_from_spec
from gpp_solver.errors import GppError, InvalidInputError, exit_status
from gpp_solver.formats.graph import load_graph, save_graph
from gpp_solver.formats.machines import MACHINES
from gpp_solver.formats.plan_json import load_plan, save_plan
from gpp_solver.formats.sniff import load_expecting
from gpp_solver.formats.summary import describe_cluster, describe_plan, time_limit_note
from gpp_solver.formats.units import format_bytes, plural
from gpp_solver._backend.progress import show_progress_on_stderr
from gpp_solver.types import Cluster, Graph

CLUSTER_HELP = ("a gpp-cluster/1 JSON file (write one with `gpp cluster`), or a machine shorthand NAME:N "
                "(N devices) or NAME:NODESxPER_NODE, NAME one of: " + ", ".join(MACHINES)
                + " (e.g. v100:8, a100-40g:8, a100-80g:4x8, h100:2x8; `gpp cluster --help` lists them)")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit 2
        raise _UsageError(f"{self.prog}: {message}")


class _UsageError(Exception):
    pass


def _graph(path: str) -> Graph:
    """The graph at ``path``; a PipeDream or Piper profile, a plan or a cluster gets what to run instead."""
    return load_expecting(path, "gpp-graph/1", load_graph)


def _default_time_limit() -> float:
    from gpp_solver.planners.gpp.planner import DEFAULT_TIME_LIMIT
    return DEFAULT_TIME_LIMIT


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
    from gpp_solver.workloads import MODELS
    from gpp_solver.compare import DEFAULT_PLANNERS
    from gpp_solver.planners.gpp.planner import DEFAULT_TIME_LIMIT
    from gpp_solver.planners.gpp.tighten import TIGHTEN_MAX_ACTIONS
    from gpp_solver.planners.registry import REGISTRY

    p = _Parser(prog="gpp", description="Plan graph pipeline parallelism (GraphPipe) for DNN training.",
                epilog="Exit codes: 0 ok, 1 no feasible plan or solver failure, 2 bad input or usage.")
    p.add_argument("-v", "--verbose", action="store_true", help="log the planners' details to stderr (default: off)")
    p.add_argument("--version", action="version", version=f"gpp {_version()}", help="print the version and exit")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    m = sub.add_parser("model", help="write a built-in workload as a gpp-graph/1 JSON",
                       description="Write one of the paper's workloads: " + ", ".join(
                           f"{k} ({', '.join(f'--{q.replace(chr(95), chr(45))}' for q in v.params)})"
                           for k, v in MODELS.items()))
    m.add_argument("name", help="workload: " + ", ".join(MODELS))
    m.add_argument("-o", "--output", required=True, help="graph JSON to write")
    params = sorted({q for v in MODELS.values() for q in v.params})
    for q in params:
        m.add_argument(f"--{q.replace('_', '-')}", dest=q, type=_positive_int, default=None,
                       help="see the workload's description (default: the paper's value)")

    i = sub.add_parser("import", help="convert a published profile (PipeDream graph.txt, Piper JSON)")
    i.add_argument("kind", choices=["pipedream", "piper"], help="the profile's format: pipedream or piper")
    i.add_argument("file", help="the profile to convert (PipeDream graph.txt or Piper input JSON)")
    i.add_argument("-o", "--output", required=True, help="graph JSON to write")
    i.add_argument("--batch-size", type=_positive_int, default=None,
                   help="PipeDream: samples in the profiled mini-batch the times and activation sizes refer to "
                        "(default: none; required unless FILE.json gives {\"batch_size\": N})")
    i.add_argument("--name", default=None, help="the graph's name (default: from the file name)")

    v = sub.add_parser("validate", help="check a graph, and a plan against it")
    v.add_argument("graph", help="gpp-graph/1 JSON to check")
    v.add_argument("--cluster", help="cluster to check, and the plan on it (default: none, the graph alone): " + CLUSTER_HELP)
    v.add_argument("--plan", help="plan JSON to check against the graph (needs --cluster; default: none)")

    cl = sub.add_parser("cluster", help="write a gpp-cluster/1 JSON from a machine shorthand or human units",
                        description="Write a cluster. Machines: " + "; ".join(
                            f"{k}: {mm.description}" for k, mm in MACHINES.items())
                        + ". Sizes take B, kB, MB, GB, TB or KiB, MiB, GiB, TiB; bandwidths the same per second "
                        "(GB/s) or in bits (Gb/s = 1e9 bits/s); times s, ms, us, ns. A number alone is in bytes, "
                        "bytes/s or seconds.")
    cl.add_argument("machine", nargs="?", default=None,
                    help="start from a machine: NAME:N or NAME:NODESxPER_NODE (default: none; then --devices, "
                         "--memory and --inter are required); the options below override its figures")
    cl.add_argument("--devices", type=_positive_int, default=None, help="number of devices (default: the machine's)")
    cl.add_argument("--per-node", type=_positive_int, default=None,
                    help="devices per node (default: the machine's; without a machine a flat network)")
    cl.add_argument("--memory", default=None, help="usable memory per device, e.g. 80GiB (default: the machine's)")
    cl.add_argument("--intra", default=None, help="bandwidth between two devices of a node, one direction, e.g. "
                    "450GB/s (default: the machine's; without a machine the --inter figure)")
    cl.add_argument("--inter", default=None, help="bandwidth per device between nodes, one direction, e.g. "
                    "200Gb/s or 25GB/s (default: the machine's)")
    cl.add_argument("--latency", default=None, help="seconds per message, e.g. 10us (default: the machine's "
                    "10us; without a machine 0)")
    cl.add_argument("--optimizer-state-factor", type=_positive_float, default=None,
                    help="bytes of weights + gradients + optimizer state per byte of weights (default 4: fp32 Adam)")
    cl.add_argument("-o", "--output", default=None, help="cluster JSON to write (default: print it)")

    def planning(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("graph", help="gpp-graph/1 JSON to plan (from `gpp model`, `gpp import` or "
                                      "`python -m runtime.profile`)")
        sp.add_argument("--cluster", required=True, help=CLUSTER_HELP)
        sp.add_argument("--batch", type=_positive_int, required=True, metavar="B", help="mini-batch size B (samples)")
        sp.add_argument("--time-limit", type=_positive_float, default=None, metavar="SECONDS",
                        help=f"seconds for each planner's search (default: {DEFAULT_TIME_LIMIT:g} s for gpp, seed "
                             "planners and CP-SAT included; no limit for the other planners). A search that "
                             "reaches it returns its best plan so far with status time-limit")
        sp.add_argument("--quiet", action="store_true",
                        help="no progress on stderr (default: progress lines, and bars on a terminal)")

    pl = sub.add_parser("plan", help="plan a graph on a cluster")
    planning(pl)
    pl.add_argument("--planner", default=None, help="one of: " + ", ".join(REGISTRY) + " (default: gpp if "
                    "installed, else graphpipe)")
    pl.add_argument("--tighten", dest="tighten", action="store_true", default=None,
                    help="tighten the micro-batch orders with CP-SAT (default: gpp does when the plan has at most "
                         f"{TIGHTEN_MAX_ACTIONS:,} forward/backward actions and time is left; the other planners do not)")
    pl.add_argument("--no-tighten", dest="tighten", action="store_false", help="never run CP-SAT tightening")
    pl.add_argument("--micro-batch-sizes", default=None, metavar="B1,B2,...",
                    help="comma-separated candidate micro-batch sizes (default: powers of two dividing B)")
    pl.add_argument("--per-stage-micro-batch", action="store_true",
                    help="graphpipe: let every stage choose its own micro-batch size (GraphPipe §6; default: one size)")
    pl.add_argument("--depth-tradeoff", dest="depth_tradeoff", action="store_true", default=None,
                    help="graphpipe: also try shallower stage graphs at a larger bottleneck (the default)")
    pl.add_argument("--no-depth-tradeoff", dest="depth_tradeoff", action="store_false",
                    help="graphpipe: the least TPS per micro-batch size only (Algorithm 1's objective)")
    pl.add_argument("--no-shared-sinks", dest="shared_sinks", action="store_false",
                    help="graphpipe: strict vertex-SP stages (a parallel block's sink never joins a branch's "
                         "stage; default: shared sinks allowed)")
    pl.add_argument("--search-k", action="store_true",
                    help="graphpipe: choose each stage's k of its kFkB schedule (Algorithm 2; default: 1F1B)")
    pl.add_argument("--schedule", choices=["1f1b", "zb", "auto"], default=None, help="gpp, graphpipe: orders 1f1b (kFkB), "
                    "zb (weight gradients split off as W actions, same memory), auto the faster (default: gpp auto, graphpipe 1f1b)")
    pl.add_argument("-o", "--output", help="plan JSON to write (default: print it to stdout, the summary to stderr)")

    c = sub.add_parser("compare", help="run several planners and print one row each")
    planning(c)
    c.add_argument("--planners", default=None,
                   help="comma-separated names, any of: " + ", ".join(REGISTRY) + f" (default: {', '.join(DEFAULT_PLANNERS)}, those "
                        "installed; milp is exact and exponential in the graph's size: name it to run it)")
    c.add_argument("--format", choices=["md", "json"], default="md", help="md table or json rows (default md)")

    s = sub.add_parser("simulate", help="simulate a plan under the cost model")
    s.add_argument("plan", help="plan JSON to simulate")
    s.add_argument("--graph", required=True, help="the plan's gpp-graph/1 JSON")
    s.add_argument("--cluster", required=True, help=CLUSTER_HELP)
    s.add_argument("--trace", help="write a Chrome/Perfetto trace JSON to this path (default: none)")
    s.add_argument("--grid", action="store_true", help="print the stage x step grid and a text Gantt chart")

    sh = sub.add_parser("show", help="draw the stage graph and the schedule (Gantt) to a PNG, PDF or SVG")
    sh.add_argument("plan", help="plan JSON to draw")
    sh.add_argument("--graph", required=True, help="the plan's gpp-graph/1 JSON")
    sh.add_argument("--cluster", default=None, help="needed for the Gantt chart (default: none, then only the "
                    "stage graph is drawn): " + CLUSTER_HELP)
    sh.add_argument("-o", "--output", required=True,
                    help="picture to write; its extension picks the format: .png, .pdf or .svg")
    return p


def _summary(plan: Any, cluster: Cluster) -> str:
    return describe_plan(plan, cluster.devices) + "\n  cluster: " + describe_cluster(cluster)


def _run(args: argparse.Namespace) -> int:
    from gpp_solver.formats.plan_json import plan_to_dict

    if args.command == "model":
        from gpp_solver.workloads import MODELS, build_model

        params = {q: getattr(args, q) for q in MODELS[args.name].params if getattr(args, q, None) is not None} \
            if args.name in MODELS else {}
        extra = [q for q in vars(args) if q not in params and getattr(args, q) is not None and q not in
                 {"command", "name", "output", "verbose"} and args.name in MODELS]
        if extra:
            raise InvalidInputError(f"model {args.name!r} has no parameter --{extra[0].replace('_', '-')}; "
                                    f"valid: {', '.join('--' + q.replace('_', '-') for q in MODELS[args.name].params)}")
        g = build_model(args.name, **params)
        save_graph(g, args.output)
        print(f"wrote {args.output}: graph {g.name!r}, {plural(len(g.nodes), 'node')}, {plural(len(g.edges), 'edge')}")
        return 0
    if args.command == "import":
        from gpp_solver.formats.importers import import_pipedream, import_piper
        from gpp_solver.formats.pipedream import assumed_batch_size

        if args.kind == "piper" and args.batch_size is not None:
            raise InvalidInputError("--batch-size is for PipeDream profiles; a Piper input has no batch size")
        g = import_pipedream(args.file, batch_size=args.batch_size, name=args.name) if args.kind == "pipedream" \
            else import_piper(args.file, name=args.name)
        save_graph(g, args.output)
        assumed = "; " + assumed_batch_size(g) if args.kind == "pipedream" else ""
        print(f"wrote {args.output}: graph {g.name!r}, {plural(len(g.nodes), 'node')}, {plural(len(g.edges), 'edge')}{assumed}")
        return 0
    if args.command == "validate":
        from gpp_solver.plan.validate import validate

        g = _graph(args.graph)
        if args.plan:
            if not args.cluster:
                raise InvalidInputError("--plan needs --cluster")
            c = cluster_from_spec(args.cluster)
            plan = load_expecting(args.plan, "gpp-plan/1", load_plan)
            validate(plan, g, c)
            print(f"plan {args.plan} is valid for graph {g.name!r}: " + _summary(plan, c))
        else:
            c = cluster_from_spec(args.cluster) if args.cluster else None
            print(f"graph {g.name!r} is valid: {plural(len(g.nodes), 'node')}, {plural(len(g.edges), 'edge')}, micro-batch sizes "
                  f"{list(g.micro_batch_sizes)}" + (f"; cluster {args.cluster} is valid: {describe_cluster(c)}" if c else ""))
        return 0
    if args.command == "cluster":
        return _write_cluster(args)
    if args.command == "plan":
        from gpp_solver.api import solve

        g = _graph(args.graph)
        c = cluster_from_spec(args.cluster)
        opts: dict[str, Any] = {}
        if args.tighten is not None:
            opts["tighten"] = args.tighten
        if args.micro_batch_sizes:
            try:
                opts["micro_batch_sizes"] = [int(x) for x in args.micro_batch_sizes.split(",") if x.strip()]
            except ValueError:
                raise InvalidInputError(f"--micro-batch-sizes must be comma-separated integers, got "
                                        f"{args.micro_batch_sizes!r}") from None
        opts.update({k: True for k in ("per_stage_micro_batch", "search_k") if getattr(args, k)})
        opts.update({} if args.schedule is None else {"schedule": args.schedule})    # other planners refuse it
        if args.depth_tradeoff is not None:
            opts["depth_tradeoff"] = args.depth_tradeoff
        if not args.shared_sinks:
            opts["shared_sinks"] = False
        only_gp = [flag for flag, key in (("--per-stage-micro-batch", "per_stage_micro_batch"),
                                          ("--search-k", "search_k"),
                                          ("--depth-tradeoff" if args.depth_tradeoff else "--no-depth-tradeoff",
                                           "depth_tradeoff"),
                                          ("--no-shared-sinks", "shared_sinks")) if key in opts]
        if only_gp:
            from gpp_solver.api import default_planner

            chosen = args.planner or default_planner()
            if chosen != "graphpipe":
                raise InvalidInputError(f"{', '.join(only_gp)}: only for --planner graphpipe, "
                                        f"but the planner is {chosen!r}")
        show_progress_on_stderr(args.quiet)
        plan = solve(g, c, mini_batch_size=args.batch, planner=args.planner, time_limit=args.time_limit,
                     progress=not args.quiet, **opts)
        if args.output:
            save_plan(plan, args.output)
            print(f"wrote {args.output}: " + _summary(plan, c))
        else:
            print(json.dumps(plan_to_dict(plan), indent=1))
            if not args.quiet:
                print(_summary(plan, c), file=sys.stderr)
        if plan.search.status == "time-limit":
            print(time_limit_note([plan.planner], args.time_limit, _default_time_limit()), file=sys.stderr)
        return 0
    if args.command == "compare":
        from gpp_solver.compare import compare, rows_to_json, rows_to_markdown

        g = _graph(args.graph)
        c = cluster_from_spec(args.cluster)
        names = [x.strip() for x in args.planners.split(",") if x.strip()] if args.planners else None
        show_progress_on_stderr(args.quiet)
        rows, plans = compare(g, c, args.batch, names, time_limit=args.time_limit, progress=not args.quiet)
        if args.format == "md":
            print(f"graph {g.name!r}, mini-batch {args.batch}, cluster: {describe_cluster(c)}\n")
        print(rows_to_markdown(rows) if args.format == "md" else rows_to_json(rows))
        cut = [r.planner for r in rows if r.status == "time-limit"]
        if cut:
            print(time_limit_note(cut, args.time_limit, _default_time_limit()), file=sys.stderr)
        if not plans:  # exit 1 as `gpp plan` does when nothing fits
            print("gpp: no planner found a plan (" + "; ".join(f"{r.planner}: {r.note or r.status}" for r in rows)
                  + ")", file=sys.stderr)
            return 1
        return 0
    if args.command == "simulate":
        from gpp_solver.plan.simulate import require_finite, simulate

        g = _graph(args.graph)
        c = cluster_from_spec(args.cluster)
        plan = load_expecting(args.plan, "gpp-plan/1", load_plan)
        from gpp_solver.plan.validate import validate

        validate(plan, g, c, check_predictions=False)
        sim = simulate(plan, g, c)
        require_finite(sim)
        print(f"iteration {sim.iteration_time:.6g} s, throughput {sim.throughput:.6g} samples/s, "
              f"peak memory {format_bytes(sim.peak_memory_bytes)} per device\n  cluster: {describe_cluster(c)}")
        for st in sim.stages:
            print(f"  stage {st.stage}: busy {st.busy:.6g} s, idle {st.idle_fraction:.1%}, "
                  f"peak in-flight {plural(st.peak_in_flight_samples, 'sample')}, memory {format_bytes(st.memory_bytes)}")
        if args.grid or args.trace:
            from gpp_solver.plan import trace as trace_mod

            if args.grid:
                print(trace_mod.grid_text(plan, sim))
            if args.trace:
                trace_mod.write_trace(sim, plan, args.trace)
                print(f"wrote {args.trace}")
        return 0
    if args.command == "show":
        from gpp_solver.plan.validate import unbounded_cluster, validate
        from gpp_solver.viz import draw_plan

        g = _graph(args.graph)
        c = cluster_from_spec(args.cluster) if args.cluster else None
        plan = load_expecting(args.plan, "gpp-plan/1", load_plan)
        # refuse a plan that does not fit its graph (and cluster): without --cluster, devices and memory
        # are unbounded but the node partition, convexity, edges and orders are checked all the same
        validate(plan, g, c if c is not None else unbounded_cluster(plan), check_predictions=False)
        if c is None:
            print("gpp: no --cluster given: drawing the stage graph only (the Gantt chart of the schedule needs "
                  "the cluster, e.g. --cluster v100:8)", file=sys.stderr)
        path = draw_plan(plan, g, c, args.output)
        print(f"wrote {path}: the stage graph" + (" and the Gantt chart" if c is not None else ""))
        return 0
    raise _UsageError("gpp: a command is required (see gpp --help)")


def _write_cluster(args: argparse.Namespace) -> int:
    """``gpp cluster``: a machine shorthand and/or explicit figures in human units -> gpp-cluster/1."""
    from gpp_solver.formats.cluster import cluster_to_dict, save_cluster
    from gpp_solver.formats.cluster_spec import cluster_from_figures

    c = cluster_from_figures(args.machine, devices=args.devices, devices_per_node=args.per_node, memory=args.memory,
                             intra=args.intra, inter=args.inter, latency=args.latency,
                             optimizer_state_factor=args.optimizer_state_factor)
    if args.output:
        save_cluster(c, args.output)
        print(f"wrote {args.output}: {describe_cluster(c)}")
    else:
        print(json.dumps(cluster_to_dict(c), indent=1))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    try:
        parser = build_parser()
        args = parser.parse_args(argv)
    except _UsageError as exc:
        print(str(exc), file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    if args.command is None:
        parser.print_help()
        return 2
    try:
        return _run(args)
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
