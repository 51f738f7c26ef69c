"""The profiler: a PyTorch workload measured into a ``gpp-graph/1`` document, as the trainer runs it
(``gpp_runtime.profile`` is its command line).

The model is traced with torch.fx and its nodes grouped into graph nodes (see
``gpp_runtime.capture.fx_graph``: values the runtime cannot send, tuples and shapes, never sit between two
graph nodes). Each fx node is then run on its own, with the inputs it sees in a full forward
pass of ``sample(micro_batch_size, 0)`` (training mode, like the trainer), with ``--threads`` intra-op threads
(default 1: what each torchrun rank of ``gpp_runtime.train`` uses):

- ``fw_time[i]``: median over ``--repeats`` runs (after ``--warmup`` runs) of the forward at
  micro-batch ``micro_batch_sizes[i]``, summed over the graph node's fx nodes. With ``--rounds R``
  every size and node is swept R times, one sweep after the other, and each node keeps the median
  of its R medians: a stretch of seconds in which the machine runs slower (another process, the
  host) then lands in one round of a node rather than in every run of a contiguous range of
  nodes, which would shift time from one stage of a plan to another. With the time terms (the
  command line's default) a CPU profile replaces these by each node's forward timed inside whole
  forwards (``gpp_runtime.calibration.context``: a node run on its own keeps its weights in the caches);
- ``bw_time[i]``: the same for ``torch.autograd.grad`` of the node's floating outputs (grad of
  ones) with respect to its floating inputs and its parameters. Inputs are fresh copies of
  leaf tensors, so in-place operators (``ReLU(inplace=True)``, ``x += y``) run as in the model;
- ``bw_weight_time[i]``: the weight-gradient part of ``bw_time`` (``docs/zero-bubble.md``), as a
  split backward runs it: after the input gradients (untimed, graph kept), the median time of
  ``torch.autograd.grad`` with respect to the parameters alone; 0 for a node without
  parameters; at most ``bw_time[i]``;
- ``weight_bytes``: bytes of the parameters (and buffers) of the node's modules or attributes. A
  parameter shared by several graph nodes (tied weights, ``gpp_runtime.capture.fx_graph``) is counted once
  in each of them: every stage that holds a copy pays for its weights, gradients and optimizer
  state, which is what the runtime allocates; two users on one stage are counted twice (an
  overestimate of one copy);
- ``output_bytes``: bytes per sample of the tensors other graph nodes read (or the model output);
- ``activation_bytes``: bytes per sample that autograd keeps from the forward to the backward
  pass, measured: the storages saved for backward (``saved_tensors_hooks``) in one training-mode
  forward at the largest micro-batch size, each storage once, charged to the node that produced it
  (``gpp_runtime.capture.saved`` says why; parameters and buffers excluded);
- ``weight_copy_bytes`` (only where not 0): bytes per micro-batch of the copies of parameters
  that the forward saves for the backward, apart from ``activation_bytes``: under autocast, the
  low-precision copies of the weights a matmul or a convolution reads (``gpp_runtime.capture.saved``);
- ``workspace_bytes``: bytes per sample an operator allocates for the moment of its call beyond
  what it keeps (its forward's transient above its output and saved tensors; its backward's peak,
  the gradients it produces included), the largest over the node's fx nodes, measured at every
  micro-batch size (a list, one per size: a transient can be per call, as a CPU convolution's
  unfolded input, and then costs more per sample at a smaller size; ``gpp_runtime.capture.workspace``);
- ``grad_views`` (only where true): a node of one operator whose backward hands two or more of its
  inputs' gradients as views of its output's gradient (``torch.cat`` narrows it), found by running
  that backward once and comparing storages (:func:`_grad_views`).

Optional fields (``docs/formats.md``: fields may be added; readers keep them): every node has
``"time_spread": {"fw": [[min, max], ...], "bw": [[min, max], ...]}``, the fastest and slowest
of the timed runs per micro-batch size (summed over its fx nodes), and ``"fx_nodes"`` when it
merges several fx nodes; the document has ``"profile"``: ``{"device", "device_name", "threads",
"warmup", "repeats", "statistic": "median", "torch"}``, and ``"concurrent": {"processes",
"cores", ...}`` with ``--concurrent N``: N profilers at once, each pinned to its own core, the
median of their medians kept; on a CPU whose cores slow each other down this measures the device
each of N training ranks gets (``runtime/cores.py`` says why, with figures; ``gpp_runtime.profile``
runs them).

A micro-batch size the model cannot run in training mode (BatchNorm at 1 sample per channel) is
refused with a message naming the node. BatchNorm statistics are per micro-batch in a pipeline,
so a plan's training differs from one process on the whole mini-batch: a warning says so.
Every number is finite and non-negative; times are wall-clock seconds (CUDA is synchronised
around each measurement when the model sits on a GPU).
"""

from __future__ import annotations

import logging
import math
import platform
import statistics
import time

import torch

from gpp_solver.errors import InvalidInputError

from .fx_graph import COMPUTE_OPS, ModelGraph, propagate, run_node, trace_workload
from .node_calls import backward_setup, forward_setup, leaf_inputs, node_params, tensors_in
from .precision import Precision
from .precision import precision as as_precision
from .saved import saved_bytes
from .workspace import workspace_bytes

logger = logging.getLogger(__name__)


def _nbytes(tensors) -> int:
    seen, total = set(), 0
    for t in tensors:
        if id(t) not in seen:
            seen.add(id(t))
            total += t.numel() * t.element_size()
    return total


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timings(fn, warmup: int, repeats: int, device: torch.device) -> tuple[float, float, float]:
    """(median, min, max) wall time of ``fn()()`` over ``repeats`` runs after ``warmup`` runs
    (``fn`` prepares, untimed, and returns the callable to time)."""
    times = []
    for i in range(warmup + repeats):
        timed = fn()
        _sync(device)
        t0 = time.perf_counter()
        timed()
        _sync(device)
        if i >= warmup:
            times.append(max(0.0, time.perf_counter() - t0))
    return statistics.median(times), min(times), max(times)


def _weight_bytes(mg: ModelGraph, members) -> int:
    tensors = []
    for node in members:
        if node.op == "call_module":
            mod = mg.gm.get_submodule(node.target)
            tensors += list(mod.parameters()) + list(mod.buffers())
        attrs = [m for m in node.all_input_nodes if m.op == "get_attr"]
        tensors += [t for a in attrs for t in tensors_in(run_node(mg.gm, a, {}))]
    return _nbytes(tensors)


def _batchnorms(model: torch.nn.Module) -> list[str]:
    return [
        name for name, m in model.named_modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm) and m.training
    ]


def _forward_all(mg: ModelGraph, inputs: tuple, micro_batch_size: int) -> dict:
    """Every node's value in a training-mode forward (no grad); refuses a size the model cannot run."""
    if len(inputs) != len(mg.placeholders):
        raise InvalidInputError(f"the model takes {len(mg.placeholders)} inputs but sample() returned {len(inputs)}")
    env: dict = dict(zip(mg.placeholders, inputs))
    with torch.no_grad():
        for n in mg.gm.graph.nodes:
            if n.op in COMPUTE_OPS or n.op == "get_attr":
                try:
                    env[n] = run_node(mg.gm, n, env)
                except Exception as exc:  # noqa: BLE001 - the model's own error, reported by node
                    where = mg.group.get(n, n.name)
                    raise InvalidInputError(
                        f"the model cannot run a micro-batch of {micro_batch_size} in training mode: node "
                        f"{where!r} fails ({type(exc).__name__}: {str(exc).splitlines()[0]}); "
                        "profile only sizes it can run (BatchNorm needs more than one value per "
                        "channel: start --micro-batch-sizes at 2, here and in `gpp plan`)"
                    ) from exc
    return env


def _output_bytes(mg: ModelGraph, members, env: dict, micro_batch_size: int) -> float:
    inside = set(members)
    sent = [n for n in members if n is mg.sink or any(u.op in COMPUTE_OPS and u not in inside for u in n.users)]
    return _nbytes([t for n in sent for t in tensors_in(env[n])]) / micro_batch_size


def device_info(device: torch.device) -> dict:
    """The ``profile`` object's device fields."""
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
    else:
        name = platform.processor() or platform.machine() or "cpu"
    return {"device": device.type, "device_name": name, "threads": torch.get_num_threads(), "torch": torch.__version__}


def profile(
    workload,
    micro_batch_sizes: list[int],
    warmup: int = 2,
    repeats: int = 5,
    name: str = "model",
    rounds: int = 1,
    precision: Precision | str | None = None,
) -> dict:
    """Profile ``workload`` at each micro-batch size and return the gpp-graph/1 document (a dict).

    ``rounds``: sweeps over every size and node, one after the other; each node keeps the median
    over the rounds of its per-round medians (module docstring). Runs with the current
    ``torch.get_num_threads()`` (the CLI sets ``--threads``). ``precision``
    (``gpp_runtime.capture.precision``): every measurement runs under its autocast (a bf16 model's
    cast is the caller's), and ``extra.profile.precision`` records its name."""
    prec = as_precision(precision)
    if (
        not micro_batch_sizes
        or any(b <= 0 for b in micro_batch_sizes)
        or sorted(set(micro_batch_sizes)) != micro_batch_sizes
    ):
        raise InvalidInputError(
            f"--micro-batch-sizes must be strictly increasing positive integers, but got {micro_batch_sizes}"
        )
    if warmup < 0 or repeats < 1 or rounds < 1:
        raise InvalidInputError(
            f"--warmup must be >= 0, --repeats >= 1 and --rounds >= 1, got {warmup}, {repeats}, {rounds}"
        )
    mg = trace_workload(workload)
    device = next((p.device for p in workload.model.parameters()), torch.device("cpu"))
    bns = _batchnorms(mg.gm)
    if bns:
        logger.warning(
            "the model has %d BatchNorm layers in training mode (%s%s): in a pipeline their "
            "statistics are computed per micro-batch, so training differs from one process on "
            "the whole mini-batch (freeze them, e.g. torchvision.ops.FrozenBatchNorm2d, for "
            "equal results)",
            len(bns),
            ", ".join(bns[:3]),
            ", ..." if len(bns) > 3 else "",
        )
    with prec.forward(device):
        timing, sizes, round_totals = _measure(mg, workload, micro_batch_sizes, warmup, repeats, rounds, device)
    nodes = []
    for gid, members in mg.groups:
        nd = {"id": gid}
        spread = {}
        for kind in ("fw", "bw"):
            per_size = list(zip(*[timing[n][kind] for n in members]))  # [(med,min,max) per member]
            nd[f"{kind}_time"] = [float(sum(t[0] for t in ts)) for ts in per_size]
            spread[kind] = [[float(sum(t[1] for t in ts)), float(sum(t[2] for t in ts))] for ts in per_size]
        # the weight-gradient part, at most the whole backward (separate runs: medians may cross)
        w = [float(sum(t[0] for t in ts)) for ts in zip(*[timing[n]["bw_weight"] for n in members])]
        nd["bw_weight_time"] = [min(a, b) for a, b in zip(w, nd["bw_time"])]
        nd.update(
            {
                "weight_bytes": int(_weight_bytes(mg, members)),
                **sizes[gid],
                "extra": {"time_spread": spread},
            }
        )  # gpp-graph/1 extensions go under "extra"
        if len(members) > 1:
            nd["extra"]["fx_nodes"] = [mg.ids[n] for n in members]
        nodes.append(nd)
    for nd in nodes:
        for v in nd["fw_time"] + nd["bw_time"] + nd["workspace_bytes"] + [nd["activation_bytes"], nd["output_bytes"]]:
            assert math.isfinite(v) and v >= 0, (nd["id"], v)
    info = {
        **device_info(device),
        "warmup": warmup,
        "repeats": repeats,
        "rounds": rounds,
        "statistic": "median" if rounds == 1 else "median over rounds of each round's median",
        "round_totals": round_totals,
        "precision": prec.name,
    }
    return {
        "format": "gpp-graph/1",
        "name": name,
        "micro_batch_sizes": list(micro_batch_sizes),
        "nodes": nodes,
        "edges": [{"src": s, "dst": d} for s, d in mg.edges()],
        "extra": {"profile": info},
    }


def _measure(mg: ModelGraph, workload, micro_batch_sizes, warmup: int, repeats: int, rounds: int, device):
    """Per fx node and kind, ``(median, min, max)`` per size over ``rounds`` sweeps; per size, each
    round's summed forward and backward times; per graph node,
    its ``activation_bytes`` and ``output_bytes`` (measured at the largest size) and ``workspace_bytes``
    (at every size)."""
    sizes: dict = {}
    sweeps = []  # per round: node -> kind -> [(median, min, max) per size]
    for r in range(rounds):
        timing = {n: {"fw": [], "bw": [], "bw_weight": []} for n in mg.nodes}
        for micro_batch_size in micro_batch_sizes:
            inputs, _ = workload.sample(micro_batch_size, 0)
            inputs = tuple(x.to(device) for x in inputs)
            env = _forward_all(mg, inputs, micro_batch_size)
            for node in mg.nodes:
                timing[node]["fw"].append(_time_forward(mg, node, env, warmup, repeats, device))
                timing[node]["bw"].append(_time_backward(mg, node, env, warmup, repeats, device))
                timing[node]["bw_weight"].append(_time_backward_weight(mg, node, env, warmup, repeats, device))
            if r == 0:  # a transient can be per call (a CPU convolution's unfolded input): every size
                with torch.enable_grad():
                    workspace = workspace_bytes(mg, env, propagate(mg, inputs), micro_batch_size, device)
                for gid, _members in mg.groups:
                    sizes.setdefault(gid, {"workspace_bytes": []})["workspace_bytes"].append(float(workspace[gid]))
            if r == 0 and micro_batch_size == micro_batch_sizes[-1]:
                kept = saved_bytes(mg, inputs)
                for gid, members in mg.groups:
                    sizes[gid].update(
                        activation_bytes=float(kept.activations[gid] / micro_batch_size),
                        output_bytes=float(_output_bytes(mg, members, env, micro_batch_size)),
                    )
                    if kept.weight_copies[gid]:
                        sizes[gid]["weight_copy_bytes"] = float(kept.weight_copies[gid])
                    if _grad_views(mg, members, env):
                        sizes[gid]["grad_views"] = True
            del env
        sweeps.append(timing)
    # per size, each round's forward + backward over every node: rounds that disagree were measured
    # under interference (gpp_runtime.calibration.quality)
    totals = [
        [float(sum(sw[n][k][i][0] for n in mg.nodes for k in ("fw", "bw"))) for sw in sweeps]
        for i in range(len(micro_batch_sizes))
    ]
    return combine_rounds(sweeps), sizes, totals


def _grad_views(mg: ModelGraph, members, env: dict) -> bool:
    """Whether a graph node of one operator hands two or more of its inputs' gradients as views of
    its output's gradient (one storage, alive until the last of them is consumed: the memory rule's
    ``views_k``), seen by running its backward once on copies of its inputs."""
    if len(members) != 1:
        return False
    with torch.enable_grad():
        local, leaves = leaf_inputs(members[0], env, requires_grad=True)
        if len(leaves) < 2:
            return False
        outs = [t for t in tensors_in(run_node(mg.gm, members[0], local)) if t.is_floating_point() and t.requires_grad]
        if len(outs) != 1:
            return False
        grad = torch.ones_like(outs[0])
        ins = torch.autograd.grad(outs, leaves, [grad], allow_unused=True)
    storage = grad.untyped_storage().data_ptr()
    return sum(1 for g in ins if g is not None and g.untyped_storage().data_ptr() == storage) >= 2


def combine_rounds(sweeps: list[dict]) -> dict:
    """One timing per node, kind and size from several rounds' ``(median, min, max)``: the median
    of the rounds' medians, the fastest and the slowest run of any round."""
    out: dict = {}
    for node in sweeps[0]:
        out[node] = {}
        for kind in sweeps[0][node]:
            per_size = zip(*[sweep[node][kind] for sweep in sweeps])  # per size: one tuple per round
            out[node][kind] = [
                (statistics.median(t[0] for t in ts), min(t[1] for t in ts), max(t[2] for t in ts)) for ts in per_size
            ]
    return out


def _time_forward(mg: ModelGraph, node, env: dict, warmup: int, repeats: int, device):
    """The forward as the trainer runs it: autograd records it (inputs that need grad)."""
    return _timings(forward_setup(mg, node, env), warmup, repeats, device)


def _time_backward_weight(mg: ModelGraph, node, env: dict, warmup: int, repeats: int, device):
    """The weight gradient alone, as a split backward runs it (``gpp_runtime.engine.split_backward``):
    the input gradients first (untimed, graph kept), then ``torch.autograd.grad`` of the outputs
    with respect to the parameters, timed.  A node without parameters takes no time."""
    params = node_params(mg, node, env)
    if not params:
        return 0.0, 0.0, 0.0

    def setup():
        torch.clear_autocast_cache()  # a fresh cast per call, as in forward_setup
        local, leaves = leaf_inputs(node, env, requires_grad=True)
        outs = [t for t in tensors_in(run_node(mg.gm, node, local)) if t.is_floating_point() and t.requires_grad]
        if not outs:
            return lambda: None
        grads = [torch.ones_like(t) for t in outs]
        if leaves:
            torch.autograd.grad(outs, leaves, grads, retain_graph=True, allow_unused=True)
        return lambda: torch.autograd.grad(outs, params, grads, allow_unused=True)

    return _timings(setup, warmup, repeats, device)


def _time_backward(mg: ModelGraph, node, env: dict, warmup: int, repeats: int, device):
    return _timings(backward_setup(mg, node, env), warmup, repeats, device)
