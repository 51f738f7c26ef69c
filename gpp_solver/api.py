"""``solve(graph, budget, **options) -> Plan``: the library's front door."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from gpp_solver.cost.memory import overheads_priced
from gpp_solver.cost.micro_batch import check_mini_batch_size
from gpp_solver.errors import InvalidInputError, show
from gpp_solver.formats.cluster import as_cluster, cluster_from_dict, cluster_to_dict
from gpp_solver.formats.cluster_spec import cluster_from_spec
from gpp_solver.formats.graph import as_graph, graph_from_dict, graph_to_dict
from gpp_solver.limits import MAX_SECONDS
from gpp_solver.plan import recompute, zero
from gpp_solver.plan.overheads import plan_within_overheads
from gpp_solver.plan.validate import validate
from gpp_solver.planners.registry import REGISTRY, get_planner
from gpp_solver.types import Cluster, Graph, Plan, SolveOptions

logger = logging.getLogger(__name__)

#: GraphPipe A.2 uses 16 samples per device for MMT; the default mini-batch when none is given.
DEFAULT_SAMPLES_PER_DEVICE = 16


def default_planner() -> str:
    """``gpp`` (the project's own planner) once it is installed, else the faithful ``graphpipe``."""
    try:
        get_planner("gpp")
        return "gpp"
    except InvalidInputError:
        return "graphpipe"


def _check_arguments(
    options: Any, planner: Any, time_limit: Any, tighten: Any, progress: Any, mini_batch_size: Any
) -> None:
    """Each argument of :func:`solve` has the type it documents (one clear error, never a TypeError)."""
    if options is not None and not isinstance(options, SolveOptions):
        raise InvalidInputError(f"options must be a SolveOptions, got {show(options)} ({type(options).__name__})")
    if options is not None and not isinstance(options.planner_options, Mapping):
        raise InvalidInputError(f"options.planner_options must be a mapping, got {show(options.planner_options)}")
    if planner is not None and not isinstance(planner, str):
        raise InvalidInputError(f"planner must be a planner name (a string), got {show(planner)}")
    if time_limit is not None and (
        isinstance(time_limit, bool) or not isinstance(time_limit, (int, float)) or not 0 < time_limit <= MAX_SECONDS
    ):
        raise InvalidInputError(
            f"time_limit must be a positive number of seconds (at most {MAX_SECONDS:g}), got {show(time_limit)}"
        )
    if tighten is not None and not isinstance(tighten, bool):
        raise InvalidInputError(f"tighten must be True, False or None, got {show(tighten)}")
    if not isinstance(progress, bool):
        raise InvalidInputError(f"progress must be True or False, got {show(progress)}")
    if mini_batch_size is not None:
        check_mini_batch_size(mini_batch_size)


def _planned(fn, name: str, g: Graph, c: Cluster, B: int, time_limit, progress: bool, options: dict) -> Plan:
    """The planner's plan under the whole memory model of ``c`` (``gpp`` its own way)."""
    if name == "gpp" and overheads_priced(c, g):
        from gpp_solver.planners.gpp.overheads import plan_gpp_within_overheads

        return plan_gpp_within_overheads(g, c, B, time_limit=time_limit, progress=progress, options=options)
    return plan_within_overheads(lambda seen: fn(g, seen, B, time_limit=time_limit, progress=progress, **options), g, c)


def _checked_graph(graph: Any) -> Graph:
    """:func:`as_graph`, and a :class:`Graph` built in Python gets the document's checks (ranges) too."""
    g = as_graph(graph)
    return graph_from_dict(graph_to_dict(g)) if isinstance(graph, Graph) else g


def _checked_cluster(budget: Any) -> Cluster:
    """:func:`as_cluster`; a string may also be a machine shorthand (``"v100:8"``, ``"h100:2x8"``) as on the CLI."""
    c = cluster_from_spec(budget) if isinstance(budget, str) else as_cluster(budget)
    return cluster_from_dict(cluster_to_dict(c)) if isinstance(budget, Cluster) else c


def solve(
    graph: Any,
    budget: Any,
    *,
    mini_batch_size: int | None = None,
    planner: str | None = None,
    time_limit: float | None = None,
    progress: bool = False,
    tighten: bool | None = None,
    options: SolveOptions | None = None,
    **planner_options: Any,
) -> Plan:
    """Plan ``graph`` (Graph, gpp-graph/1 dict, path or DiGraph) on ``budget`` (Cluster, dict, path or
    machine shorthand such as ``"v100:8"``).

    ``mini_batch_size`` defaults to 16 samples per device.  ``planner`` is a registry name
    (:data:`gpp_solver.planners.registry.REGISTRY`); other keyword options go to the planner.  ``options``
    (a :class:`SolveOptions`) gives the same settings as one value; explicit keywords win.  The plan returned has
    passed :func:`gpp_solver.validate`.

    ``tighten``: CP-SAT tightening of the micro-batch orders (``cp_schedule``).  The ``gpp`` planner
    tightens by default when it fits its time limit; the reproductions of published planners do
    not, unless ``tighten=True``.  What CP-SAT proved is recorded in ``plan.search.cp_tighten``.
    """
    _check_arguments(options, planner, time_limit, tighten, progress, mini_batch_size)
    if options is not None:
        mini_batch_size = options.mini_batch_size if mini_batch_size is None else mini_batch_size
        planner = planner or options.planner
        time_limit = options.time_limit if time_limit is None else time_limit
        tighten = options.tighten if tighten is None else tighten
        progress = progress or options.progress
        planner_options = {**dict(options.planner_options), **planner_options}
        _check_arguments(None, planner, time_limit, tighten, progress, mini_batch_size)
    g = _checked_graph(graph)
    c = _checked_cluster(budget)
    B = mini_batch_size if mini_batch_size is not None else DEFAULT_SAMPLES_PER_DEVICE * c.devices
    check_mini_batch_size(B)
    name = planner or default_planner()
    if name not in REGISTRY:
        raise InvalidInputError(f"unknown planner {name!r}; valid planners: {', '.join(REGISTRY)}")
    if name == "gpp":
        planner_options["tighten"] = tighten
    fn = get_planner(name)
    sharding = zero.choice_of(name, planner_options)
    choice = recompute.choice_of(name, planner_options)
    plan = zero.planned(
        sharding,
        lambda: recompute.planned(
            choice,
            lambda: _planned(fn, name, g, c, B, time_limit, progress, planner_options),
            # on the recomputation view, orders without W: a recomputing stage runs its whole backward at once
            lambda view, seen, left: fn(
                view, seen, B, time_limit=left, progress=False, **{**planner_options, "schedule": "1f1b"}
            ),
            g,
            c,
            time_limit,
        ),
        lambda seen, left: fn(g, seen, B, time_limit=left, progress=False, **planner_options),
        g,
        c,
        time_limit,
    )
    if tighten and name != "gpp" and not any(s.recompute for s in plan.stages):
        from gpp_solver.cp_schedule import tighten_plan_if_fits

        plan, info = tighten_plan_if_fits(plan, g, c, time_limit=time_limit, progress=progress)
        logger.info(
            "CP-SAT tightening: %s, iteration %.6g -> %.6g s",
            info["status"],
            info["makespan_before"],
            info["makespan_after"],
        )
    validate(plan, g, c)
    return plan
