"""The model as an operator graph: torch.fx tracing, node ids, graph nodes and edges.

Shared by the profiler (which writes the graph JSON) and the trainer (which matches a plan's
node ids against the model), so that both name the nodes the same way:

- every compute fx node has a unique *value name* (``ids``): a ``call_module`` node is named by
  the module's qualified name (``"branch0.fc1"``; a module called again is named by its fx node
  name), a ``call_function`` / ``call_method`` node by its fx node name (``"cat"``, ``"add_1"``);
- *graph nodes* (the JSON's nodes, what a plan assigns to stages) are groups of fx nodes
  (``group``): a node whose value the runtime cannot send (a tuple such as
  ``nn.MultiheadAttention``'s output, a ``size()`` of an activation, shape arithmetic, a tensor
  whose leading dimension is not the batch: GPT-2's ``(batch * sequence, width)`` views) is merged
  with every node that reads it (unless it is computed from the model inputs alone: every stage
  that needs such a value recomputes it, see ``input_derived``), a node nothing reads
  (``torch._assert``) with the nodes it reads, so no stage boundary can fall on such a value and
  the graph stays connected; the nodes that read one buffer or constant attribute are one
  group. A parameter that needs grad and is read by several nodes (a GPT-2 head tied to the
  embedding: after ``torch.export`` one ``get_attr`` read by the embedding lookup and by the
  head's matmul) is *shared*, not merged and not an edge: each node keeps its own reference, a
  plan may put them on different stages, and the runtime sums the parameter's gradient over the
  stages holding a copy (``gpp_runtime.engine.grad_sync``). A group is named after its first module call,
  else its last tensor-valued node. Most groups hold one fx node;
- placeholders (the model inputs), ``get_attr`` nodes and the output node are not graph nodes:
  placeholders feed their consumers, a ``get_attr`` belongs to the node that reads it, and the
  model output is the value of the output node's argument (the *sink*).

Tracing (``gpp_runtime.capture.tracing``) uses ``torch.fx`` with the workload's optional hooks; modules of
``torch.nn`` are leaves, user modules are traced through.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import operator
import os
import sys
from dataclasses import dataclass

import networkx as nx
import torch
import torch.fx as fx

from gpp_solver.errors import InvalidInputError

from .device_move import move_module
from .third_party import prepare_third_party
from .tracing import trace_module, workload_graph_module

logger = logging.getLogger(__name__)

COMPUTE_OPS = ("call_module", "call_function", "call_method")


@dataclass(frozen=True)
class ModelGraph:
    """A traced model with the project's node ids.

    ``nodes`` are the compute fx nodes in topological order, ``ids`` maps each to its value name,
    ``group`` maps each to its graph node id, ``groups`` lists ``(graph node id, fx nodes)`` in
    topological order, ``sink`` is the compute node whose value the model returns.
    """

    gm: fx.GraphModule
    nodes: tuple[fx.Node, ...]
    ids: dict
    sink: fx.Node
    placeholders: tuple[fx.Node, ...]
    group: dict
    groups: tuple[tuple[str, tuple[fx.Node, ...]], ...]

    def id_of(self, node: fx.Node) -> str:
        return self.ids[node]

    def compute_inputs(self, node: fx.Node) -> list[fx.Node]:
        """The compute nodes (not placeholders / attributes) whose values ``node`` reads."""
        return [m for m in node.all_input_nodes if m.op in COMPUTE_OPS]

    def edges(self) -> list[tuple[str, str]]:
        """Graph edges ``(src id, dst id)`` between groups, deduplicated, in topological order."""
        out: list[tuple[str, str]] = []
        seen = set()
        for _, members in self.groups:
            for n in members:
                for m in self.compute_inputs(n):
                    e = (self.group[m], self.group[n])
                    if e[0] != e[1] and e not in seen:
                        seen.add(e)
                        out.append(e)
        return out


def _value_names(nodes) -> dict:
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
    return ids


def _is_tensor_valued(n: fx.Node, values: dict | None) -> bool:
    if values is not None and n in values:
        return isinstance(values[n], torch.Tensor)
    # no example values: a node read only through getitem is a tuple
    return not (n.users and all(u.op == "call_function" and u.target is operator.getitem for u in n.users))


def _sendable(n: fx.Node, values: dict | None, rows: int | None) -> bool:
    """A tensor whose leading dimension is the batch (what ``gpp_runtime.engine.p2p`` sends and slices):
    not a ``(batch * sequence, width)`` view or a parameter's transpose."""
    if values is None or n not in values or rows is None:
        return _is_tensor_valued(n, values)
    v = values[n]
    return isinstance(v, torch.Tensor) and v.dim() >= 1 and v.shape[0] == rows


_RANDOM = ("dropout", "rand", "bernoulli", "normal", "multinomial")


def input_derived(gm: fx.GraphModule) -> set[fx.Node]:
    """Compute nodes whose value depends only on model inputs and constants (no parameter that
    needs grad, no module call, no random op): an attention mask, positions, a shape. A stage
    that reads one recomputes it from the model inputs instead of receiving it."""
    out: set[fx.Node] = set()
    for n in gm.graph.nodes:
        if n.op not in COMPUTE_OPS or n.op == "call_module":
            continue
        if any(r in str(getattr(n.target, "__name__", n.target)).lower() for r in _RANDOM):
            continue
        ok = True
        for m in n.all_input_nodes:
            if m.op == "placeholder" or m in out:
                continue
            if m.op == "get_attr":
                val = run_node(gm, m, {})
                if not (isinstance(val, torch.Tensor) and val.requires_grad):
                    continue
            ok = False
            break
        if ok:
            out.add(n)
    return out


def _trainable(gm: fx.GraphModule, attr: fx.Node) -> bool:
    """Whether a ``get_attr`` node reads a parameter that needs grad."""
    val = run_node(gm, attr, {})
    return isinstance(val, torch.Tensor) and val.requires_grad


# complexity: one branch per kind of fx value that cannot cross stages (tuples, sizes, asserts, tied weights)
def _groups(nodes, ids, sink, values, rows=None):  # noqa: C901, PLR0912, PLR0915
    """Union of fx nodes into graph nodes (module docstring), cycles of groups contracted."""
    parent = {n: n for n in nodes}

    def find(x):
        while parent[x] is not x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    def union(a, b):
        ra, rb = find(a), find(b)
        if ra is not rb:
            parent[rb] = ra

    node_set = set(nodes)
    gm = nodes[0].graph.owning_module
    derived = input_derived(gm)
    for a in (n for n in nodes[0].graph.nodes if n.op == "get_attr"):
        if _trainable(gm, a):
            continue  # a parameter read by several ops is shared (tied), not merged
        users = [u for u in a.users if u in node_set]  # a buffer or constant read by several ops
        for u in users[1:]:
            union(users[0], u)
    for n in nodes:
        users = [u for u in n.users if u in node_set]
        if users and not _sendable(n, values, rows) and n not in derived:
            for u in users:
                union(n, u)
        elif not users and n is not sink:
            producers = [m for m in n.all_input_nodes if m in node_set]
            for m in producers or [sink]:
                union(n, m)
    # groups connected to nothing that leads to the sink (dead code) join the sink's group
    q = nx.DiGraph()
    q.add_nodes_from({find(n) for n in nodes})
    q.add_edges_from(
        (find(m), find(n)) for n in nodes for m in n.all_input_nodes if m in node_set and find(m) is not find(n)
    )
    for comp in list(nx.weakly_connected_components(q)):
        if find(sink) not in comp:
            for c in comp:
                union(sink, c)
    # contract cycles among groups (a shape read early and used late, say)
    q = nx.DiGraph()
    q.add_nodes_from({find(n) for n in nodes})
    q.add_edges_from(
        (find(m), find(n)) for n in nodes for m in n.all_input_nodes if m in node_set and find(m) is not find(n)
    )
    if not nx.is_directed_acyclic_graph(q):
        for comp in nx.strongly_connected_components(q):
            comp = list(comp)
            for c in comp[1:]:
                union(comp[0], c)
    order = {n: i for i, n in enumerate(nodes)}
    members: dict = {}
    for n in nodes:
        members.setdefault(find(n), []).append(n)
    q = nx.DiGraph()
    q.add_nodes_from(members)
    q.add_edges_from(
        (find(m), find(n)) for n in nodes for m in n.all_input_nodes if m in node_set and find(m) is not find(n)
    )
    groups = []
    for root in nx.lexicographical_topological_sort(q, key=lambda r: order[members[r][0]]):
        ms = members[root]
        head = next((n for n in ms if n.op == "call_module"), None)
        if head is None:
            head = next((n for n in reversed(ms) if _is_tensor_valued(n, values)), ms[-1])
        groups.append((ids[head], tuple(ms)))
    group = {n: gid for gid, ms in groups for n in ms}
    return group, tuple(groups)


def model_graph(gm: fx.GraphModule, example_inputs: tuple | None = None) -> ModelGraph:
    """Name ``gm``'s nodes and group them; ``example_inputs`` tell which values are tensors."""
    nodes = tuple(n for n in gm.graph.nodes if n.op in COMPUTE_OPS)
    if not nodes:
        raise InvalidInputError("the traced model has no operator node")
    ids = _value_names(nodes)
    out_node = next(n for n in gm.graph.nodes if n.op == "output")
    ret = out_node.args[0]
    if isinstance(ret, (tuple, list)) and len(ret) == 1:  # torch.export's flat outputs
        ret = ret[0]
    if not isinstance(ret, fx.Node) or ret.op not in COMPUTE_OPS:
        raise InvalidInputError(
            f"the model's forward must return one tensor computed by an operator, but it returns {ret!r}"
        )
    placeholders = tuple(n for n in gm.graph.nodes if n.op == "placeholder")
    values = rows = None
    if example_inputs is not None:  # two rows, as the runtime describes what crosses (value_meta)
        example_inputs = tuple(x[:2] if isinstance(x, torch.Tensor) and x.dim() else x for x in example_inputs)
        rows = next((int(x.shape[0]) for x in example_inputs if isinstance(x, torch.Tensor) and x.dim()), None)
        values = _example_values(gm, nodes, ids, ret, placeholders, example_inputs)
    group, groups = _groups(nodes, ids, ret, values, rows)
    merged = [g for g in groups if len(g[1]) > 1]
    if merged:
        logger.debug("merged %d groups of fx nodes that hold unsendable values", len(merged))
    return ModelGraph(gm=gm, nodes=nodes, ids=ids, sink=ret, placeholders=placeholders, group=group, groups=groups)


def _example_values(gm, nodes, ids, sink, placeholders, inputs) -> dict:
    pre = ModelGraph(
        gm=gm,
        nodes=nodes,
        ids=ids,
        sink=sink,
        placeholders=placeholders,
        group={n: ids[n] for n in nodes},
        groups=tuple((ids[n], (n,)) for n in nodes),
    )
    modes = set_training(gm, False)
    try:
        with torch.no_grad():
            return propagate(pre, inputs)
    finally:
        restore_training(modes)


def set_training(gm: torch.nn.Module, mode: bool) -> dict:
    """``gm.train(mode)`` without calling it (torch.export's modules refuse ``train``/``eval``);
    returns every module's previous mode for :func:`restore_training`."""
    modes = {m: m.training for m in gm.modules()}
    for m in modes:
        m.training = mode
    return modes


def restore_training(modes: dict) -> None:
    for m, mode in modes.items():
        m.training = mode


def trace(model: torch.nn.Module, example_inputs: tuple | None = None, **hooks) -> ModelGraph:
    """Trace ``model`` (hooks as in :func:`gpp_runtime.capture.tracing.trace_module`) and name its nodes."""
    n_inputs = None if example_inputs is None else len(example_inputs)
    return model_graph(trace_module(model, n_inputs=n_inputs, example_inputs=example_inputs, **hooks), example_inputs)


def trace_workload(workload) -> ModelGraph:
    """Trace ``workload.model`` with the workload's hooks, grouping by the values of
    ``workload.sample(2, 0)`` (eval mode, no grad). A model on a GPU is traced on the CPU, as
    ``gpp_runtime.train`` traces it, and the graph moved back (``gpp_runtime.capture.device_move``)."""
    inputs, _ = workload.sample(2, 0)
    inputs = tuple(inputs)
    device = next((p.device for p in workload.model.parameters()), torch.device("cpu"))
    if device.type == "cpu":
        gm = workload_graph_module(workload, inputs)
    else:  # traced on the CPU as gpp_runtime.train traces it (torch.export's graph depends on the device)
        workload.model.to("cpu")
        try:
            gm = workload_graph_module(workload, inputs)
        finally:
            workload.model.to(device)
        gm = move_module(gm, device)
    return model_graph(gm, tuple(x.to(device) if isinstance(x, torch.Tensor) else x for x in inputs))


def load_workload(spec: str):
    """Import ``MODULE:FUNCTION`` (or ``path/to/file.py:FUNCTION``, loaded from the file with its
    directory first on ``sys.path``, as torchrun runs a script) and call it; InvalidInputError
    naming what is wrong. torchvision, timm and transformers import next to a CPU-only torch
    (``gpp_runtime.capture.third_party``) before the module is loaded."""
    if ":" not in spec:
        raise InvalidInputError(f"--model must be MODULE:FUNCTION (or path/to/file.py:FUNCTION), but got {spec!r}")
    mod_name, fn_name = spec.rsplit(":", 1)
    prepare_third_party()
    try:
        mod = _import_file(mod_name) if mod_name.endswith(".py") else importlib.import_module(mod_name)
    except ImportError as exc:
        hint = ""
        if ("/" in mod_name or os.sep in mod_name) and not mod_name.endswith(".py"):
            hint = (
                f" (a module name is dotted, e.g. {mod_name.replace(os.sep, '.').replace('/', '.')!r}; "
                "a file is path/to/file.py:FUNCTION)"
            )
        raise InvalidInputError(f"cannot import module {mod_name!r}: {exc}{hint}") from exc
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


def _import_file(path: str):
    """The module defined by the Python file ``path`` (ImportError when there is none)."""
    file = os.path.abspath(path)
    if not os.path.isfile(file):
        raise ImportError(f"no such file {file}")
    folder = os.path.dirname(file)
    if folder not in sys.path:
        sys.path.insert(0, folder)
    name = os.path.splitext(os.path.basename(file))[0]
    spec = importlib.util.spec_from_file_location(name, file)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    try:
        spec.loader.exec_module(mod)
    except BaseException:
        del sys.modules[name]
        raise
    return mod


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
        raise InvalidInputError(f"the model takes {len(mg.placeholders)} inputs but sample() returned {len(inputs)}")
    for n in mg.gm.graph.nodes:
        if n.op in COMPUTE_OPS or n.op == "get_attr":
            env[n] = run_node(mg.gm, n, env)
    return env
