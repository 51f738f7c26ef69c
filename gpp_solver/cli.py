"""The ``gpp`` command (``python -m gpp_solver`` does the same).

Exit codes: 0 success; 1 no feasible plan (the message says what would be needed) or solver
failure; 2 bad input or usage (one line naming the problem, no traceback).
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import sys
from pathlib import Path
from typing import Any, Sequence

from gpp_solver.formats.cluster import load_cluster, v100_cluster
from gpp_solver.errors import GppError, InfeasibleError, InvalidInputError
from gpp_solver.formats.graph import load_graph, save_graph
from gpp_solver.formats.plan_json import load_plan, save_plan
from gpp_solver.types import Cluster


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit 2
        raise _UsageError(f"{self.prog}: {message}")


class _UsageError(Exception):
    pass


def _cluster(spec: str) -> Cluster:
    """A cluster file, or ``v100:N`` (the paper's V100 16 GB, 4 per node)."""
    m = re.fullmatch(r"v100:(\d+)", spec)
    if m:
        n = int(m.group(1))
        if n < 1:
            raise InvalidInputError(f"--cluster v100:N needs N >= 1, got {n}")
        return v100_cluster(n)
    return load_cluster(spec)


def _positive_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return v


def _positive_float(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}") from None
    if not v > 0:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
    return v


def build_parser() -> argparse.ArgumentParser:
    from gpp_solver.workloads import MODELS
    from gpp_solver.planners.registry import REGISTRY

    p = _Parser(prog="gpp", description="Plan graph pipeline parallelism (GraphPipe) for DNN training.",
                epilog="Exit codes: 0 ok, 1 no feasible plan or solver failure, 2 bad input or usage.")
    p.add_argument("-v", "--verbose", action="store_true", help="log progress details to stderr")
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
    i.add_argument("kind", choices=["pipedream", "piper"])
    i.add_argument("file")
    i.add_argument("-o", "--output", required=True)
    i.add_argument("--batch-size", type=_positive_int, default=1,
                   help="PipeDream: samples in the profiled mini-batch the times refer to (default 1)")
    i.add_argument("--name", default=None)

    v = sub.add_parser("validate", help="check a graph, and a plan against it")
    v.add_argument("graph")
    v.add_argument("--cluster", help="cluster JSON or v100:N")
    v.add_argument("--plan", help="plan JSON (needs --cluster)")

    def planning(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("graph")
        sp.add_argument("--cluster", required=True, help="cluster JSON, or v100:N for N V100 16 GB (4 per node)")
        sp.add_argument("--batch", type=_positive_int, required=True, help="mini-batch size B (samples)")
        sp.add_argument("--time-limit", type=_positive_float, default=None, help="seconds for the search")
        sp.add_argument("--quiet", action="store_true", help="no progress display")

    pl = sub.add_parser("plan", help="plan a graph on a cluster")
    planning(pl)
    pl.add_argument("--planner", default=None, help="one of: " + ", ".join(REGISTRY) + " (default: gpp if "
                    "installed, else graphpipe)")
    pl.add_argument("--tighten", dest="tighten", action="store_true", default=None,
                    help="tighten the micro-batch orders with CP-SAT (default: when it fits the time limit)")
    pl.add_argument("--no-tighten", dest="tighten", action="store_false")
    pl.add_argument("--micro-batch-sizes", default=None,
                    help="comma-separated candidate micro-batch sizes (default: powers of two dividing B)")
    pl.add_argument("--per-stage-micro-batch", action="store_true",
                    help="graphpipe: let every stage choose its own micro-batch size (GraphPipe §6)")
    pl.add_argument("--depth-tradeoff", dest="depth_tradeoff", action="store_true", default=None,
                    help="graphpipe: also try shallower stage graphs at a larger bottleneck (the default)")
    pl.add_argument("--no-depth-tradeoff", dest="depth_tradeoff", action="store_false",
                    help="graphpipe: the least TPS per micro-batch size only (Algorithm 1's objective)")
    pl.add_argument("--no-shared-sinks", dest="shared_sinks", action="store_false",
                    help="graphpipe: strict vertex-SP stages (a parallel block's sink never joins a branch's stage)")
    pl.add_argument("--search-k", action="store_true",
                    help="graphpipe: choose each stage's k of its kFkB schedule (Algorithm 2) instead of 1F1B")
    pl.add_argument("-o", "--output", help="plan JSON to write (default: print it)")

    c = sub.add_parser("compare", help="run several planners and print one row each")
    planning(c)
    c.add_argument("--planners", default=None, help="comma-separated names (default: all installed)")
    c.add_argument("--format", choices=["md", "json"], default="md")

    s = sub.add_parser("simulate", help="simulate a plan under the cost model")
    s.add_argument("plan")
    s.add_argument("--graph", required=True)
    s.add_argument("--cluster", required=True)
    s.add_argument("--trace", help="write a Chrome/Perfetto trace JSON")
    s.add_argument("--grid", action="store_true", help="print the stage x step grid")

    sh = sub.add_parser("show", help="draw the stage graph and the schedule (Gantt) to a PNG")
    sh.add_argument("plan")
    sh.add_argument("--graph", required=True)
    sh.add_argument("--cluster", default=None, help="cluster (needed for the Gantt chart)")
    sh.add_argument("-o", "--output", required=True)
    return p


def _summary(plan: Any) -> str:
    p = plan.predicted
    return (f"{plan.planner}: {len(plan.stages)} stages, depth {plan.depth}, {plan.devices_used} devices, "
            f"TPS {p.time_per_sample:.6g} s, iteration {p.iteration_time:.6g} s, throughput {p.throughput:.6g} "
            f"samples/s, peak memory {p.peak_memory_bytes / 2**30:.3f} GiB, status {_status(plan.search)}, "
            f"search {plan.search.seconds:.3f} s")


def _status(search: Any) -> str:
    """The status, and for an ``optimal-*`` one the objective it was proven for when the plan names it."""
    if search.status.startswith("optimal") and search.objective:
        return f"{search.status} ({search.objective})"
    return str(search.status)


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
        print(f"wrote {args.output}: graph {g.name!r}, {len(g.nodes)} nodes, {len(g.edges)} edges")
        return 0
    if args.command == "import":
        from gpp_solver.formats.importers import import_pipedream, import_piper

        g = import_pipedream(args.file, batch_size=args.batch_size, name=args.name) if args.kind == "pipedream" \
            else import_piper(args.file, name=args.name)
        save_graph(g, args.output)
        print(f"wrote {args.output}: graph {g.name!r}, {len(g.nodes)} nodes, {len(g.edges)} edges")
        return 0
    if args.command == "validate":
        from gpp_solver.plan.validate import validate

        g = load_graph(args.graph)
        if args.plan:
            if not args.cluster:
                raise InvalidInputError("--plan needs --cluster")
            c = _cluster(args.cluster)
            plan = load_plan(args.plan)
            validate(plan, g, c)
            print(f"plan {args.plan} is valid for graph {g.name!r}: " + _summary(plan))
        else:
            if args.cluster:
                _cluster(args.cluster)
            print(f"graph {g.name!r} is valid: {len(g.nodes)} nodes, {len(g.edges)} edges, micro-batch sizes "
                  f"{list(g.micro_batch_sizes)}" + (f"; cluster {args.cluster} is valid" if args.cluster else ""))
        return 0
    if args.command == "plan":
        from gpp_solver.api import solve

        g = load_graph(args.graph)
        c = _cluster(args.cluster)
        opts: dict[str, Any] = {}
        if args.tighten is not None:
            opts["tighten"] = args.tighten
        if args.micro_batch_sizes:
            try:
                opts["micro_batch_sizes"] = [int(x) for x in args.micro_batch_sizes.split(",") if x.strip()]
            except ValueError:
                raise InvalidInputError(f"--micro-batch-sizes must be comma-separated integers, got "
                                        f"{args.micro_batch_sizes!r}") from None
        if args.per_stage_micro_batch:
            opts["per_stage_micro_batch"] = True
        if args.search_k:
            opts["search_k"] = True
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
        plan = solve(g, c, mini_batch_size=args.batch, planner=args.planner, time_limit=args.time_limit,
                     progress=not args.quiet and sys.stderr.isatty(), **opts)
        if args.output:
            save_plan(plan, args.output)
            print(f"wrote {args.output}: " + _summary(plan))
        else:
            print(json.dumps(plan_to_dict(plan), indent=1))
        return 0
    if args.command == "compare":
        from gpp_solver.compare import compare, rows_to_json, rows_to_markdown

        g = load_graph(args.graph)
        c = _cluster(args.cluster)
        names = [x.strip() for x in args.planners.split(",") if x.strip()] if args.planners else None
        rows, _ = compare(g, c, args.batch, names, time_limit=args.time_limit)
        print(rows_to_markdown(rows) if args.format == "md" else rows_to_json(rows))
        return 0
    if args.command == "simulate":
        from gpp_solver.plan.simulate import simulate

        g = load_graph(args.graph)
        c = _cluster(args.cluster)
        plan = load_plan(args.plan)
        from gpp_solver.plan.validate import validate

        validate(plan, g, c, check_predictions=False)
        sim = simulate(plan, g, c)
        print(f"iteration {sim.iteration_time:.6g} s, throughput {sim.throughput:.6g} samples/s, "
              f"peak memory {sim.peak_memory_bytes / 2**30:.3f} GiB")
        for st in sim.stages:
            print(f"  stage {st.stage}: busy {st.busy:.6g} s, idle {st.idle_fraction:.1%}, "
                  f"peak in-flight {st.peak_in_flight_samples} samples, memory {st.memory_bytes / 2**30:.3f} GiB")
        if args.grid or args.trace:
            from gpp_solver.plan import trace as trace_mod

            if args.grid:
                print(trace_mod.grid_text(plan, sim))
            if args.trace:
                trace_mod.write_trace(sim, plan, args.trace)
                print(f"wrote {args.trace}")
        return 0
    if args.command == "show":
        from gpp_solver.viz import draw_plan

        g = load_graph(args.graph)
        c = _cluster(args.cluster) if args.cluster else None
        plan = load_plan(args.plan)
        draw_plan(plan, g, c, args.output)
        print(f"wrote {args.output}")
        return 0
    raise _UsageError("gpp: a command is required (see gpp --help)")


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
    except InfeasibleError as exc:
        print(f"gpp: no feasible plan: {exc}", file=sys.stderr)
        return 1
    except InvalidInputError as exc:
        print(f"gpp: {exc}", file=sys.stderr)
        return 2
    except GppError as exc:
        print(f"gpp: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("gpp: interrupted", file=sys.stderr)
        return 1
    except BrokenPipeError:
        return 0
    except OSError as exc:
        print(f"gpp: {exc.strerror or exc}: {getattr(exc, 'filename', '') or ''}".rstrip(": "), file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
