"""The model as an operator graph: torch.fx tracing, node ids and graph edges.

Shared by the profiler (which writes the graph JSON) and the trainer (which matches a plan's
node ids against the model), so that both name the nodes the same way:

- ``call_module`` node: the module's qualified name (``"branch0.fc1"``); if the same module is
  called more than once, every call after the first is named by its fx node name instead;
- ``call_function`` / ``call_method`` node: the fx node name (``"cat"``, ``"add_1"``);
- placeholders (the model inputs), ``get_attr`` nodes and the output node are not graph nodes:
  placeholders feed their consumers, a ``get_attr`` belongs to the node that reads it, and the
  model output is the value of the output node's argument (the *sink*).

Tracing uses the default ``torch.fx.Tracer``: modules of ``torch.nn`` (Linear, LayerNorm, ReLU,
MultiheadAttention, ...) are leaves; user modules are traced through.
"""

from __future__ import annotations

import importlib
import logging
from dataclasses import dataclass

import torch
import torch.fx as fx

from gpp_solver.errors import InvalidInputError

logger = logging.getLogger(__name__)

COMPUTE_OPS = ("call_module", "call_function", "call_method")


@dataclass(frozen=True)
class ModelGraph:
    """A traced model with the project's node ids.

    ``nodes`` are the compute fx nodes in topological order, ``ids`` maps each to its id,
    ``sink`` is the compute node whose value the model returns.
    """

    gm: fx.GraphModule
    nodes: tuple[fx.Node, ...]
    ids: dict
    sink: fx.Node
    placeholders: tuple[fx.Node, ...]

    def id_of(self, node: fx.Node) -> str:
        return self.ids[node]

    def compute_inputs(self, node: fx.Node) -> list[fx.Node]:
        """The compute nodes (not placeholders / attributes) whose values ``node`` reads."""
        return [m for m in node.all_input_nodes if m.op in COMPUTE_OPS]

    def edges(self) -> list[tuple[str, str]]:
        """Graph edges ``(src id, dst id)``, deduplicated, in topological order of ``dst``."""
        out: list[tuple[str, str]] = []
        seen = set()
        for n in self.nodes:
            for m in self.compute_inputs(n):
                e = (self.ids[m], self.ids[n])
                if e not in seen:
                    seen.add(e)
                    out.append(e)
        return out


def trace(model: torch.nn.Module) -> ModelGraph:
    """Trace ``model`` with torch.fx and name its nodes; InvalidInputError if it cannot."""
    try:
        gm = fx.symbolic_trace(model)
    except Exception as exc:  # noqa: BLE001 - fx raises many kinds
        raise InvalidInputError(f"torch.fx cannot trace the model: {type(exc).__name__}: {exc}") from exc
    nodes = tuple(n for n in gm.graph.nodes if n.op in COMPUTE_OPS)
    if not nodes:
        raise InvalidInputError("the traced model has no operator node")
    ids: dict[fx.Node, str] = {}
    used_targets: set[str] = set()
    for n in nodes:
        if n.op == "call_module" and n.target not in used_targets:
            ids[n] = str(n.target)
            used_targets.add(str(n.target))
        else:
            ids[n] = n.name
    if len(set(ids.values())) != len(ids):  # a module name equal to an fx node name: rare
        seen: set[str] = set()
        for n in nodes:
            if ids[n] in seen:
                ids[n] = f"{ids[n]}@{n.name}"
            seen.add(ids[n])
    out_node = next(n for n in gm.graph.nodes if n.op == "output")
    ret = out_node.args[0]
    if not isinstance(ret, fx.Node) or ret.op not in COMPUTE_OPS:
        raise InvalidInputError(
            "the model's forward must return one tensor computed by an operator, "
            f"but it returns {ret!r}")
    placeholders = tuple(n for n in gm.graph.nodes if n.op == "placeholder")
    return ModelGraph(gm=gm, nodes=nodes, ids=ids, sink=ret, placeholders=placeholders)


def load_workload(spec: str):
    """Import ``MODULE:FUNCTION`` and call it; InvalidInputError naming what is wrong."""
    if ":" not in spec:
        raise InvalidInputError(f"--model must be MODULE:FUNCTION, but got {spec!r}")
    mod_name, fn_name = spec.split(":", 1)
    try:
        mod = importlib.import_module(mod_name)
    except ImportError as exc:
        raise InvalidInputError(f"cannot import module {mod_name!r}: {exc}") from exc
    fn = getattr(mod, fn_name, None)
    if not callable(fn):
        raise InvalidInputError(f"module {mod_name!r} has no function {fn_name!r}")
    wl = fn()
    for attr in ("model", "sample", "loss"):
        if not hasattr(wl, attr):
            raise InvalidInputError(f"workload {spec!r} lacks the attribute {attr!r}")
    if not isinstance(wl.model, torch.nn.Module):
        raise InvalidInputError(f"workload {spec!r}: model is not a torch.nn.Module")
    return wl


def run_node(gm: fx.GraphModule, node: fx.Node, env: dict):
    """Execute one fx node with argument values looked up in ``env`` (node -> value)."""
    args = fx.node.map_arg(node.args, lambda m: env[m])
    kwargs = fx.node.map_arg(node.kwargs, lambda m: env[m])
    if node.op == "call_module":
        return gm.get_submodule(node.target)(*args, **kwargs)
    if node.op == "call_function":
        return node.target(*args, **kwargs)
    if node.op == "call_method":
        self_obj, *rest = args
        return getattr(self_obj, node.target)(*rest, **kwargs)
    if node.op == "get_attr":
        obj = gm
        for part in str(node.target).split("."):
            obj = getattr(obj, part)
        return obj
    raise ValueError(f"cannot run fx node of op {node.op!r}")


def propagate(mg: ModelGraph, inputs: tuple) -> dict:
    """Run the whole model node by node, returning every node's value (placeholders included)."""
    env: dict = {}
    for ph, x in zip(mg.placeholders, inputs):
        env[ph] = x
    if len(inputs) != len(mg.placeholders):
        raise InvalidInputError(
            f"the model takes {len(mg.placeholders)} inputs but sample() returned {len(inputs)}")
    for n in mg.gm.graph.nodes:
        if n.op in COMPUTE_OPS or n.op == "get_attr":
            env[n] = run_node(mg.gm, n, env)
    return env
