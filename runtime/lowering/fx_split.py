"""Cut the traced model into one ``fx.GraphModule`` per plan stage.

A stage module's inputs are, in this order, the model inputs (placeholders) its nodes read
directly, then the values of producer nodes in other stages (topological order). Its outputs are
the values of its nodes that other stages read (topological order), then the model output if the
stage holds the sink. The modules share their parameters with the full model they came from; a
parameter used by several stages (tied weights) is kept equal by ``gpp_runtime.engine.grad_sync``.
A value computed from the model inputs alone (``input_derived``: an attention mask, positions) is
recomputed by every stage that reads it, from the model inputs, instead of being sent; a
received value that an in-place operator may modify is listed in ``copied_inputs``: the executor
copies it first (a received value is a leaf that needs grad, which no in-place op may modify).
"""

from __future__ import annotations

import operator
from dataclasses import dataclass

import torch.fx as fx

from gpp_solver.errors import InvalidPlanError
from gpp_solver.types import Plan

from ..capture.fx_graph import COMPUTE_OPS, ModelGraph, input_derived


@dataclass(frozen=True)
class Transfer:
    """The value of producer node ``value`` (stage ``src``) read by nodes of stage ``dst``."""

    value: str
    src: int
    dst: int
    index: int  # topological index of the producer, orders messages deterministically


@dataclass(frozen=True)
class StageProgram:
    """A stage's module and the meaning of its positional inputs and of its output tuple.

    ``inputs``: ``("input", k)`` = model input k, ``("act", id)`` = value of node ``id``.
    ``outputs``: ``("act", id)`` = value of node ``id`` sent to other stages, ``("output", "")``
    = the model output.
    """

    stage_id: int
    module: fx.GraphModule
    inputs: tuple[tuple[str, object], ...]
    outputs: tuple[tuple[str, str], ...]
    #: ids of the received values an in-place operator of the stage may modify
    #: (:func:`modified_in_place`): the executor passes the module a copy of each
    copied_inputs: frozenset[str] = frozenset()

    @property
    def holds_sink(self) -> bool:
        return any(k == "output" for k, _ in self.outputs)


def assign_nodes(mg: ModelGraph, plan: Plan) -> dict[fx.Node, int]:
    """Map every compute fx node to the stage of its graph node; InvalidPlanError on any id mismatch."""
    by_id: dict[str, list[fx.Node]] = {}
    for gid, members in mg.groups:
        by_id[gid] = list(members)
    assign: dict[fx.Node, int] = {}
    for s in plan.stages:
        for nid in s.nodes:
            if nid not in by_id:
                known = ", ".join(list(by_id)[:12]) + (" ..." if len(by_id) > 12 else "")
                raise InvalidPlanError(
                    f"plan/model mismatch: stage {s.id} lists node {nid!r}, which is not a node of "
                    f"the model (its nodes: {known})"
                )
            for n in by_id[nid]:
                assign[n] = s.id
    for n in mg.nodes:
        if n not in assign:
            raise InvalidPlanError(f"plan/model mismatch: model node {mg.group[n]!r} is in no stage of the plan")
    return assign


def transfers(mg: ModelGraph, assign: dict[fx.Node, int], plan: Plan) -> list[Transfer]:
    """Every (producer node, consumer stage) pair across a stage boundary; checks plan edges (C2)."""
    out: list[Transfer] = []
    seen = set()
    plan_edges = set(plan.edges)
    topo = {n: i for i, n in enumerate(mg.nodes)}
    derived = input_derived(mg.gm)
    for n in mg.nodes:
        for m in mg.compute_inputs(n):
            src, dst = assign[m], assign[n]
            if src == dst or (m, dst) in seen or m in derived:
                continue
            if (src, dst) not in plan_edges:
                raise InvalidPlanError(
                    f"plan `edges` lacks [{src}, {dst}], needed by graph edge {mg.group[m]!r} -> {mg.group[n]!r}"
                )
            seen.add((m, dst))
            out.append(Transfer(value=mg.ids[m], src=src, dst=dst, index=topo[m]))
    out.sort(key=lambda t: (t.index, t.dst))
    return out


_INPLACE_FUNCS = {
    operator.iadd,
    operator.isub,
    operator.imul,
    operator.itruediv,
    operator.iand,
    operator.ior,
    operator.ixor,
    operator.setitem,
}


def _in_place(mg: ModelGraph, node: fx.Node) -> bool:
    """Whether ``node`` may modify its first input in place (``ReLU(inplace=True)``, ``F.relu(x,
    inplace=True)``, ``x.add_(y)``, ``x += y``, ``x[i] = y``, an ATen overload that writes its first
    argument)."""
    if node.kwargs.get("inplace") is True:
        return True
    if node.op == "call_module":
        return getattr(mg.gm.get_submodule(node.target), "inplace", False) is True
    if node.op == "call_method":
        return str(node.target).endswith("_") and not str(node.target).startswith("_")
    if node.op != "call_function":
        return False
    if node.target in _INPLACE_FUNCS:
        return True
    schema = getattr(node.target, "_schema", None)
    if schema is not None and schema.arguments:
        alias = schema.arguments[0].alias_info
        return bool(alias is not None and alias.is_write)
    name = getattr(node.target, "__name__", "")
    return name.endswith("_") and not name.startswith("_") or name.startswith("__i")


def _fresh(mg: ModelGraph, node: fx.Node) -> bool:
    """Whether ``node``'s output is surely a new tensor, never a view of its inputs: a call of a
    module with parameters of its own (a convolution, a linear layer, a norm)."""
    if node.op != "call_module":
        return False
    return any(True for _ in mg.gm.get_submodule(node.target).parameters(recurse=False))


def modified_in_place(mg: ModelGraph, value: fx.Node, local: set[fx.Node]) -> bool:
    """Whether a node of ``local`` may modify ``value`` in place: an in-place operator whose first
    input is ``value`` or may be a view of it (anything computed from it by a node that is not
    :func:`_fresh`). Conservative: ``x + 1`` counts as a possible view."""
    alias = {value}
    for n in mg.nodes:  # topological
        if n not in local or n is value or not any(a in alias for a in n.all_input_nodes):
            continue
        first = n.args[0] if n.args else None
        if _in_place(mg, n) and (first in alias or (first is None and n.all_input_nodes[0] in alias)):
            return True
        if not _fresh(mg, n):
            alias.add(n)
    return False


def build_stage(mg: ModelGraph, assign: dict[fx.Node, int], sid: int) -> StageProgram:
    """The GraphModule of stage ``sid`` (see the module docstring for its signature)."""
    mine = [n for n in mg.nodes if assign[n] == sid]
    mine_set = set(mine)
    derived = input_derived(mg.gm)
    local = set(mine_set)  # mine, and the input-derived values of other stages it recomputes
    todo = [m for n in mine for m in mg.compute_inputs(n) if m not in mine_set and m in derived]
    while todo:
        m = todo.pop()
        if m not in local:
            local.add(m)
            todo += [x for x in mg.compute_inputs(m) if x not in local]
    g = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    inputs: list[tuple[str, object]] = []
    for k, ph in enumerate(mg.placeholders):
        if any(u in local for u in ph.users):
            env[ph] = g.placeholder(ph.name)
            inputs.append(("input", k))
    external = []
    for n in mg.nodes:
        if n not in local and any(u in local for u in n.users):
            external.append(n)
    copied = []
    for n in external:
        env[n] = g.placeholder(f"act_{n.name}")
        inputs.append(("act", mg.ids[n]))
        if modified_in_place(mg, n, local):
            # a received value is a leaf that needs grad: the executor hands the module a copy
            copied.append(mg.ids[n])
    for n in mg.gm.graph.nodes:
        if n.op == "get_attr" and any(u in local for u in n.users):
            env[n] = g.node_copy(n, lambda x: env[x])
        elif n in local:
            env[n] = g.node_copy(n, lambda x: env[x])
    outputs: list[tuple[str, str]] = []
    out_vals = []
    for n in mine:
        if n not in derived and any(u.op in COMPUTE_OPS and u not in mine_set for u in n.users):
            outputs.append(("act", mg.ids[n]))
            out_vals.append(env[n])
    if mg.sink in mine_set:
        outputs.append(("output", ""))
        out_vals.append(env[mg.sink])
    g.output(tuple(out_vals))
    module = fx.GraphModule(mg.gm, g, class_name=f"Stage{sid}")
    return StageProgram(
        stage_id=sid, module=module, inputs=tuple(inputs), outputs=tuple(outputs), copied_inputs=frozenset(copied)
    )
