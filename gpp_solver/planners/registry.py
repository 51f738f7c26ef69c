"""One planner protocol and a registry by name.

A planner is a function ``plan(graph, cluster, mini_batch_size, *, time_limit=None, progress=False,
**options) -> Plan``; its options are one frozen dataclass in its package (``GraphPipeOptions``,
``GppOptions``, ...) that :func:`parse_options`, the one option check, builds.  Every planner builds its plan with ``plan_build.build_plan`` so one
validator, one simulator and one comparison table serve all of them.  Entries are imported lazily.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import fields
from typing import Any, Protocol, TypeVar

from gpp_solver.errors import InvalidInputError
from gpp_solver.types import Cluster, Graph, Plan

OptionsT = TypeVar("OptionsT")


class Planner(Protocol):
    def __call__(
        self,
        graph: Graph,
        cluster: Cluster,
        mini_batch_size: int,
        *,
        time_limit: float | None = None,
        progress: bool = False,
        **options: Any,
    ) -> Plan: ...


#: name -> "module:function"
REGISTRY: dict[str, str] = {
    "gpp": "gpp_solver.planners.gpp.planner:plan_gpp",
    "graphpipe": "gpp_solver.planners.graphpipe.planner:plan_graphpipe",
    "pipedream": "gpp_solver.planners.sequential.pipedream:plan_pipedream",
    "pipedream-2bw": "gpp_solver.planners.sequential.pipedream_2bw:plan_pipedream_2bw",
    "piper": "gpp_solver.planners.piper.planner:plan_piper",
    "alpa": "gpp_solver.planners.sequential.alpa:plan_alpa",
    "milp": "gpp_solver.planners.milp.planner:plan_milp",
    "exact": "gpp_solver.planners.exact.planner:plan_exact",
}


def available_planners() -> list[str]:
    """Names whose implementation can be imported."""
    out = []
    for name in REGISTRY:
        try:
            get_planner(name)
        except InvalidInputError:
            continue
        out.append(name)
    return out


def get_planner(name: str) -> Planner:
    """The planner registered as ``name``; an unknown name lists the valid ones."""
    target = REGISTRY.get(name)
    if target is None:
        raise InvalidInputError(f"unknown planner {name!r}; valid planners: {', '.join(REGISTRY)}")
    module, _, attr = target.partition(":")
    try:
        fn: Callable[..., Plan] = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError):
        raise InvalidInputError(f"planner {name!r} is not available in this installation") from None
    return fn


def register(name: str, target: str) -> None:
    """Register (or replace) a planner as ``"module:function"``."""
    REGISTRY[name] = target


def parse_options(planner: str, options_class: type[OptionsT], given: Mapping[str, Any]) -> OptionsT:
    """The one option check: ``given`` as the planner's frozen options dataclass.  An option the
    class has no field for raises :class:`InvalidInputError` naming it and listing the valid ones (a
    misspelt option would otherwise be ignored and the plan would not be what was asked for); a bad
    value raises from the class's own checks."""
    known = [f.name for f in fields(options_class)]  # type: ignore[arg-type]
    unknown = sorted(set(given) - set(known))
    if unknown:
        raise InvalidInputError(
            f"planner {planner!r} has no option {', '.join(map(repr, unknown))}; "
            f"its options: {', '.join(sorted(known)) or 'none'}"
        )
    return options_class(**given)
