"""What each ``gpp`` subcommand does, one function per command (``gpp_solver.cli`` parses the
arguments, picks the function from :data:`COMMANDS` and maps errors to exit codes)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import Any

from gpp_solver._backend.progress import show_progress_on_stderr
from gpp_solver.errors import InvalidInputError
from gpp_solver.formats.cluster_spec import cluster_from_spec
from gpp_solver.formats.graph import load_graph, save_graph
from gpp_solver.formats.plan_json import load_plan, save_plan
from gpp_solver.formats.sniff import load_expecting
from gpp_solver.formats.summary import describe_cluster, describe_plan, describe_profile, time_limit_note
from gpp_solver.formats.units import format_bytes, plural
from gpp_solver.types import Cluster, Graph, Plan


def _graph(path: str) -> Graph:
    """The graph at ``path``; a PipeDream or Piper profile, a plan or a cluster gets what to run instead."""
    return load_expecting(path, "gpp-graph/1", load_graph)


def _default_time_limit() -> float:
    from gpp_solver.planners.gpp.planner import DEFAULT_TIME_LIMIT

    return DEFAULT_TIME_LIMIT


def _summary(plan: Any, cluster: Cluster) -> str:
    return describe_plan(plan, cluster.devices) + "\n  cluster: " + describe_cluster(cluster)


def _counts(g: Graph) -> str:
    return f"{plural(len(g.nodes), 'node')}, {plural(len(g.edges), 'edge')}"


def run_model(args: argparse.Namespace) -> int:
    """``gpp model``: one of the paper's workloads as a gpp-graph/1 file."""
    from gpp_solver.workloads import MODELS, build_model

    params = (
        {q: getattr(args, q) for q in MODELS[args.name].params if getattr(args, q, None) is not None}
        if args.name in MODELS
        else {}
    )
    extra = [
        q
        for q in vars(args)
        if q not in params
        and getattr(args, q) is not None
        and q not in {"command", "name", "output", "verbose"}
        and args.name in MODELS
    ]
    if extra:
        raise InvalidInputError(
            f"model {args.name!r} has no parameter --{extra[0].replace('_', '-')}; "
            f"valid: {', '.join('--' + q.replace('_', '-') for q in MODELS[args.name].params)}"
        )
    g = build_model(args.name, **params)
    save_graph(g, args.output)
    print(f"wrote {args.output}: graph {g.name!r}, {_counts(g)}")
    return 0


def run_import(args: argparse.Namespace) -> int:
    """``gpp import``: a PipeDream or Piper profile as a gpp-graph/1 file."""
    from gpp_solver.formats.importers import import_pipedream, import_piper
    from gpp_solver.formats.pipedream import assumed_batch_size

    if args.kind == "piper" and args.batch_size is not None:
        raise InvalidInputError("--batch-size is for PipeDream profiles; a Piper input has no batch size")
    g = (
        import_pipedream(args.file, batch_size=args.batch_size, name=args.name)
        if args.kind == "pipedream"
        else import_piper(args.file, name=args.name)
    )
    save_graph(g, args.output)
    assumed = "; " + assumed_batch_size(g) if args.kind == "pipedream" else ""
    print(f"wrote {args.output}: graph {g.name!r}, {_counts(g)}{assumed}")
    return 0


def run_validate(args: argparse.Namespace) -> int:
    """``gpp validate``: a graph, a cluster, and a plan against both."""
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
        print(
            f"graph {g.name!r} is valid: {_counts(g)}, micro-batch sizes "
            f"{list(g.micro_batch_sizes)}" + (f"; cluster {args.cluster} is valid: {describe_cluster(c)}" if c else "")
        )
    return 0


def run_cluster(args: argparse.Namespace) -> int:
    """``gpp cluster``: a machine shorthand and/or explicit figures in human units -> gpp-cluster/1."""
    from gpp_solver.formats.cluster import cluster_to_dict, save_cluster
    from gpp_solver.formats.cluster_spec import cluster_from_figures

    c = cluster_from_figures(
        args.machine,
        devices=args.devices,
        devices_per_node=args.per_node,
        memory=args.memory,
        intra=args.intra,
        inter=args.inter,
        latency=args.latency,
        optimizer_state_factor=args.optimizer_state_factor,
        filled=(filled := []),
    )
    if filled:
        print("gpp cluster: not given, so taken as: " + "; ".join(filled), file=sys.stderr)
    if args.output:
        save_cluster(c, args.output)
        print(f"wrote {args.output}: {describe_cluster(c)}")
    else:
        print(json.dumps(cluster_to_dict(c), indent=1))
    return 0


def planner_options(args: argparse.Namespace) -> dict[str, Any]:
    """The planner options ``gpp plan``'s flags give; graphpipe's own flags refused for another planner."""
    opts: dict[str, Any] = {}
    if args.tighten is not None:
        opts["tighten"] = args.tighten
    if args.micro_batch_sizes:
        try:
            opts["micro_batch_sizes"] = [int(x) for x in args.micro_batch_sizes.split(",") if x.strip()]
        except ValueError:
            raise InvalidInputError(
                f"--micro-batch-sizes must be comma-separated integers, got {args.micro_batch_sizes!r}"
            ) from None
    if args.per_stage_micro_batch:
        opts["per_stage_micro_batch"] = True
    if args.search_k:
        opts["search_k"] = True
    if args.depth_tradeoff is not None:
        opts["depth_tradeoff"] = args.depth_tradeoff
    if args.schedule is not None:  # gpp and graphpipe take it; other planners refuse it by name
        opts["schedule"] = args.schedule
    if not args.shared_sinks:
        opts["shared_sinks"] = False
    if args.ladder is not None:  # gpp takes it; other planners refuse it by name
        opts["ladder"] = args.ladder
    if args.recompute is not None:  # gpp and graphpipe take it; solve refuses it for the others
        opts["recompute"] = args.recompute
    if args.zero is not None:  # the same
        opts["zero"] = args.zero
    graphpipe_flags = {
        "per_stage_micro_batch": "--per-stage-micro-batch",
        "search_k": "--search-k",
        "depth_tradeoff": "--depth-tradeoff" if args.depth_tradeoff else "--no-depth-tradeoff",
        "shared_sinks": "--no-shared-sinks",
    }
    only_gp = [flag for key, flag in graphpipe_flags.items() if key in opts]
    if only_gp:
        from gpp_solver.api import default_planner

        chosen = args.planner or default_planner()
        if chosen != "graphpipe":
            raise InvalidInputError(
                f"{', '.join(only_gp)}: only for --planner graphpipe, but the planner is {chosen!r}"
            )
    return opts


def run_plan(args: argparse.Namespace) -> int:
    """``gpp plan``: one planner's plan, written or printed, its summary on stderr."""
    from gpp_solver.api import solve
    from gpp_solver.formats.plan_json import plan_to_dict

    g = _graph(args.graph)
    c = cluster_from_spec(args.cluster)
    opts = planner_options(args)
    show_progress_on_stderr(args.quiet)
    plan = solve(
        g,
        c,
        mini_batch_size=args.batch,
        planner=args.planner,
        time_limit=args.time_limit,
        progress=not args.quiet,
        **opts,
    )
    profile = describe_profile(g)
    if args.output:
        save_plan(plan, args.output)
        print(f"wrote {args.output}: " + _summary(plan, c) + (f"\n  {profile}" if profile else ""))
    else:
        print(json.dumps(plan_to_dict(plan), indent=1))
        if not args.quiet:
            print(_summary(plan, c) + (f"\n  {profile}" if profile else ""), file=sys.stderr)
    if plan.search.status == "time-limit":
        print(time_limit_note([plan.planner], args.time_limit, _default_time_limit()), file=sys.stderr)
    return 0


def run_compare(args: argparse.Namespace) -> int:
    """``gpp compare``: several planners on one input, one row each; exit 1 when none found a plan."""
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
        print(
            "gpp: no planner found a plan (" + "; ".join(f"{r.planner}: {r.note or r.status}" for r in rows) + ")",
            file=sys.stderr,
        )
        return 1
    return 0


def run_simulate(args: argparse.Namespace) -> int:
    """``gpp simulate``: a plan's simulated iteration, per stage; optionally its grid and a trace file."""
    from gpp_solver.plan.simulate import require_finite, simulate
    from gpp_solver.plan.validate import validate

    g = _graph(args.graph)
    c = cluster_from_spec(args.cluster)
    plan = load_expecting(args.plan, "gpp-plan/1", load_plan)
    validate(plan, g, c, check_predictions=False)
    sim = simulate(plan, g, c)
    require_finite(sim)
    print(
        f"iteration {sim.iteration_time:.6g} s, throughput {sim.throughput:.6g} samples/s, "
        f"peak memory {format_bytes(sim.peak_memory_bytes)} per device\n  cluster: {describe_cluster(c)}"
    )
    for st in sim.stages:
        print(
            f"  stage {st.stage}: busy {st.busy:.6g} s, idle {st.idle_fraction:.1%}, "
            f"peak in-flight {plural(st.peak_in_flight_samples, 'sample')}, memory {format_bytes(st.memory_bytes)}"
        )
    if args.grid or args.trace:
        _simulation_extras(args, plan, sim)
    return 0


def _simulation_extras(args: argparse.Namespace, plan: Plan, sim: Any) -> None:
    from gpp_solver.plan import trace as trace_mod

    if args.grid:
        print(trace_mod.grid_text(plan, sim))
    if args.trace:
        trace_mod.write_trace(sim, plan, args.trace)
        print(f"wrote {args.trace}")


def run_show(args: argparse.Namespace) -> int:
    """``gpp show``: the stage graph, and with a cluster the Gantt chart, drawn to a picture."""
    from gpp_solver.plan.validate import unbounded_cluster, validate
    from gpp_solver.viz import draw_plan

    g = _graph(args.graph)
    c = cluster_from_spec(args.cluster) if args.cluster else None
    plan = load_expecting(args.plan, "gpp-plan/1", load_plan)
    # refuse a plan that does not fit its graph (and cluster): without --cluster, devices and memory
    # are unbounded but the node partition, convexity, edges and orders are checked all the same
    validate(plan, g, c if c is not None else unbounded_cluster(plan), check_predictions=False)
    if c is None:
        print(
            "gpp: no --cluster given: drawing the stage graph only (the Gantt chart of the schedule needs "
            "the cluster, e.g. --cluster v100:8)",
            file=sys.stderr,
        )
    path = draw_plan(plan, g, c, args.output)
    print(f"wrote {path}: the stage graph" + (" and the Gantt chart" if c is not None else ""))
    return 0


#: subcommand -> the function that runs it
COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "model": run_model,
    "import": run_import,
    "validate": run_validate,
    "cluster": run_cluster,
    "plan": run_plan,
    "compare": run_compare,
    "simulate": run_simulate,
    "show": run_show,
}
