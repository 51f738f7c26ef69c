"""Profile a PyTorch workload into a ``gpp-graph/1`` JSON, measuring what the trainer runs.

    python -m runtime.profile --model examples.two_branch:workload --batch-sizes 1,2,4,8 -o graph.json

The model is traced with torch.fx and its nodes grouped into graph nodes (see
``runtime.capture.fx_graph``: values the runtime cannot send, tuples and shapes, never sit between two
graph nodes). Each fx node is then run on its own, with the inputs it sees in a full forward
pass of ``sample(b, 0)`` (training mode, like the trainer), with ``--threads`` intra-op threads
(default 1: what each torchrun rank of ``runtime.train`` uses):

- ``fw_time[i]``: median over ``--repeats`` runs (after ``--warmup`` runs) of the forward at
  micro-batch ``micro_batch_sizes[i]``, summed over the graph node's fx nodes;
- ``bw_time[i]``: the same for ``torch.autograd.grad`` of the node's floating outputs (grad of
  ones) with respect to its floating inputs and its parameters. Inputs are fresh copies of
  leaf tensors, so in-place operators (``ReLU(inplace=True)``, ``x += y``) run as in the model;
- ``weight_bytes``: bytes of the parameters (and buffers) of the node's modules or attributes. A
  parameter shared by several graph nodes (tied weights, ``runtime.capture.fx_graph``) is counted once
  in each of them: every stage that holds a copy pays for its weights, gradients and optimizer
  state, which is what the runtime allocates; two users on one stage are counted twice (an
  overestimate of one copy);
- ``output_bytes``: bytes per sample of the tensors other graph nodes read (or the model output);
- ``activation_bytes`` (the rule): bytes per sample of the node's floating-point tensor inputs plus
  its floating-point tensor outputs, i.e. what a typical op saves for backward (its inputs) plus
  the output that stays alive until the consumer's backward. Measured at the largest batch size.

The time-model terms (``runtime.profile_terms`` says how each is measured; ``--no-time-terms``
leaves them out): the graph's ``op_overhead`` (what each node adds per forward and per backward
when the trainer runs the whole stage), ``optimizer_time_per_byte`` (``--optimizer``, as
``runtime.train``'s), and the workload's loss, forward and backward, added to the sink node's
times (kept in its ``extra.loss_time``): the trainer runs the loss on the stage holding the sink.

Optional fields (``spec/formats.md``: fields may be added; readers keep them): every node has
``"time_spread": {"fw": [[min, max], ...], "bw": [[min, max], ...]}``, the fastest and slowest
of the timed runs per micro-batch size (summed over its fx nodes), and ``"fx_nodes"`` when it
merges several fx nodes; the document has ``"profile"``: ``{"device", "device_name", "threads",
"warmup", "repeats", "statistic": "median", "torch"}``, and ``"concurrent": {"processes",
"cores", ...}`` with ``--concurrent N``: N profilers at once, each pinned to its own core, the
median of their medians kept; on a CPU whose cores slow each other down this measures the device
each of N training ranks gets (``runtime/cores.py`` says why, with figures).

A micro-batch size the model cannot run in training mode (BatchNorm at 1 sample per channel) is
refused with a message naming the node. BatchNorm statistics are per micro-batch in a pipeline,
so a plan's training differs from one process on the whole mini-batch: a warning says so.
Every number is finite and non-negative; times are wall-clock seconds (CUDA is synchronised
around each measurement when the model sits on a GPU).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import operator
import os
import platform
import signal
import statistics
import sys
import time

import torch

from gpp_solver.errors import InvalidInputError
from . import cores
from . import profile_terms
from .capture.fx_graph import COMPUTE_OPS, ModelGraph, load_workload, run_node, trace_workload

logger = logging.getLogger(__name__)


def _tensors(value) -> list[torch.Tensor]:
    """The tensors inside a value (a tensor, or nested tuples/lists/dicts of them)."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in _tensors(v)]
    if isinstance(value, dict):
        return [t for v in value.values() for t in _tensors(v)]
    return []


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
        tensors += [t for a in attrs for t in _tensors(run_node(mg.gm, a, {}))]
    return _nbytes(tensors)


def _batchnorms(model: torch.nn.Module) -> list[str]:
    return [name for name, m in model.named_modules()
            if isinstance(m, torch.nn.modules.batchnorm._BatchNorm) and m.training]


def _forward_all(mg: ModelGraph, inputs: tuple, b: int) -> dict:
    """Every node's value in a training-mode forward (no grad); refuses a size the model cannot run."""
    if len(inputs) != len(mg.placeholders):
        raise InvalidInputError(
            f"the model takes {len(mg.placeholders)} inputs but sample() returned {len(inputs)}")
    env: dict = dict(zip(mg.placeholders, inputs))
    with torch.no_grad():
        for n in mg.gm.graph.nodes:
            if n.op in COMPUTE_OPS or n.op == "get_attr":
                try:
                    env[n] = run_node(mg.gm, n, env)
                except Exception as exc:  # noqa: BLE001 - the model's own error, reported by node
                    where = mg.group.get(n, n.name)
                    raise InvalidInputError(
                        f"the model cannot run a micro-batch of {b} in training mode: node "
                        f"{where!r} fails ({type(exc).__name__}: {str(exc).splitlines()[0]}); "
                        "profile only sizes it can run (BatchNorm needs more than one value per "
                        "channel: start --batch-sizes at 2, and plan with --micro-batch-sizes)") from exc
    return env


def _activation_bytes(mg: ModelGraph, members, env: dict, b: int) -> float:
    inside = set(members)
    ins, outs = [], []
    for n in members:
        ins += [t for m in n.all_input_nodes if m.op != "get_attr" and m not in inside
                for t in _tensors(env[m]) if t.is_floating_point()]
        if not any(u in inside and u.target is operator.getitem for u in n.users):
            outs += [t for t in _tensors(env[n]) if t.is_floating_point()]
    return _nbytes(ins + outs) / b


def _output_bytes(mg: ModelGraph, members, env: dict, b: int) -> float:
    inside = set(members)
    sent = [n for n in members if n is mg.sink or any(u.op in COMPUTE_OPS and u not in inside
                                                       for u in n.users)]
    return _nbytes([t for n in sent for t in _tensors(env[n])]) / b


def device_info(device: torch.device) -> dict:
    """The ``profile`` object's device fields."""
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
    else:
        name = platform.processor() or platform.machine() or "cpu"
    return {"device": device.type, "device_name": name, "threads": torch.get_num_threads(),
            "torch": torch.__version__}


def profile(workload, batch_sizes: list[int], warmup: int = 2, repeats: int = 5,
            name: str = "model", *, time_terms: bool = True, optimizer: str = "sgd") -> dict:
    """Profile ``workload`` at each batch size and return the gpp-graph/1 document (a dict);
    ``time_terms``: also the graph's op_overhead, optimizer step and the loss (module docstring).

    Runs with the current ``torch.get_num_threads()`` (the CLI sets ``--threads``)."""
    if not batch_sizes or any(b <= 0 for b in batch_sizes) or sorted(set(batch_sizes)) != batch_sizes:
        raise InvalidInputError(
            f"--batch-sizes must be strictly increasing positive integers, but got {batch_sizes}")
    if warmup < 0 or repeats < 1:
        raise InvalidInputError(f"--warmup must be >= 0 and --repeats >= 1, got {warmup}, {repeats}")
    mg = trace_workload(workload)
    device = next((p.device for p in workload.model.parameters()), torch.device("cpu"))
    bns = _batchnorms(mg.gm)
    if bns:
        logger.warning(
            "the model has %d BatchNorm layers in training mode (%s%s): in a pipeline their "
            "statistics are computed per micro-batch, so training differs from one process on "
            "the whole mini-batch (freeze them, e.g. torchvision.ops.FrozenBatchNorm2d, for "
            "equal results)", len(bns), ", ".join(bns[:3]), ", ..." if len(bns) > 3 else "")
    timing = {n: {"fw": [], "bw": []} for n in mg.nodes}
    act_bytes: dict = {}
    out_bytes: dict = {}
    terms: dict = {"whole": [], "loss": []}
    for b in batch_sizes:
        inputs, target = workload.sample(b, 0)
        inputs = tuple(x.to(device) for x in inputs)
        env = _forward_all(mg, inputs, b)
        for node in mg.nodes:
            timing[node]["fw"].append(_time_forward(mg, node, env, warmup, repeats, device))
            timing[node]["bw"].append(_time_backward(mg, node, env, warmup, repeats, device))
        if time_terms:
            terms["whole"].append(profile_terms.whole_model_times(mg.gm, inputs, warmup, repeats, device))
            tgt = target.to(device) if isinstance(target, torch.Tensor) else target
            try:
                terms["loss"].append(profile_terms.loss_times(workload.loss, env[mg.sink], tgt, warmup, repeats,
                                                              device))
            except Exception as exc:  # noqa: BLE001 - the workload's own loss, reported as such
                raise InvalidInputError(
                    f"the workload's loss fails on the model's output at {b} samples ({type(exc).__name__}: "
                    f"{str(exc).splitlines()[0] if str(exc) else ''}); --no-time-terms profiles without it") from exc
        if b == batch_sizes[-1]:
            for gid, members in mg.groups:
                act_bytes[gid] = _activation_bytes(mg, members, env, b)
                out_bytes[gid] = _output_bytes(mg, members, env, b)
    nodes = []
    for gid, members in mg.groups:
        nd = {"id": gid}
        spread = {}
        for kind in ("fw", "bw"):
            per_size = list(zip(*[timing[n][kind] for n in members]))  # [(med,min,max) per member]
            nd[f"{kind}_time"] = [float(sum(t[0] for t in ts)) for ts in per_size]
            spread[kind] = [[float(sum(t[1] for t in ts)), float(sum(t[2] for t in ts))]
                            for ts in per_size]
        nd.update({"weight_bytes": int(_weight_bytes(mg, members)),
                   "activation_bytes": float(act_bytes[gid]),
                   "output_bytes": float(out_bytes[gid]),
                   "extra": {"time_spread": spread}})  # gpp-graph/1 extensions go under "extra"
        if len(members) > 1:
            nd["extra"]["fx_nodes"] = [mg.ids[n] for n in members]
        nodes.append(nd)
    for nd in nodes:
        for v in nd["fw_time"] + nd["bw_time"] + [nd["activation_bytes"], nd["output_bytes"]]:
            assert math.isfinite(v) and v >= 0, (nd["id"], v)
    info = {**device_info(device), "warmup": warmup, "repeats": repeats, "statistic": "median"}
    doc = {"format": "gpp-graph/1", "name": name, "micro_batch_sizes": list(batch_sizes),
           "nodes": nodes, "edges": [{"src": s, "dst": d} for s, d in mg.edges()],
           "extra": {"profile": info}}
    if time_terms:
        _add_time_terms(doc, terms, mg, workload, optimizer, warmup, repeats, device)
    return doc


def _add_time_terms(doc: dict, terms: dict, mg: ModelGraph, workload, optimizer: str, warmup: int,
                    repeats: int, device) -> None:
    """The graph's op_overhead and optimizer_time_per_byte; the loss added to the sink node."""
    nodes, info = doc["nodes"], doc["extra"]["profile"]
    per = {}
    for k, kind in enumerate(("fw", "bw")):
        # fastest runs on both sides (profile_terms.whole_model_times)
        summed = [sum(nd["extra"]["time_spread"][kind][i][0] for nd in nodes) for i in range(len(terms["whole"]))]
        per[kind] = profile_terms.overhead_per_node([w[k] for w in terms["whole"]], summed, len(nodes))
        profile_terms.remove_call_cost(nodes, kind, per[kind])
    doc["op_overhead"] = profile_terms.graph_overhead(per["fw"], per["bw"])
    info["op_overhead_per_size"] = per
    seconds = profile_terms.optimizer_seconds(mg.gm, optimizer, warmup, repeats, device)
    weight = sum(nd["weight_bytes"] for nd in nodes)
    doc["optimizer_time_per_byte"] = seconds / weight if weight else 0.0
    info["optimizer"] = {"name": optimizer, "seconds": seconds}
    sink = next(nd for nd in nodes if nd["id"] == mg.group[mg.sink])
    loss = {"fw": [t[0] for t in terms["loss"]], "bw": [t[1] for t in terms["loss"]]}
    for kind in ("fw", "bw"):
        sink[f"{kind}_time"] = [t + x for t, x in zip(sink[f"{kind}_time"], loss[kind])]
        sink["extra"]["time_spread"][kind] = [[lo + x, hi + x] for (lo, hi), x in
                                              zip(sink["extra"]["time_spread"][kind], loss[kind])]
    sink["extra"]["loss_time"] = loss


def _leaf_inputs(node, env: dict, requires_grad: bool) -> tuple[dict, list[torch.Tensor]]:
    """A fresh environment for ``node``'s inputs: copies of its tensor inputs (floating ones
    cloned from a leaf that needs grad, so an in-place operator may modify them) and the leaves."""
    local: dict = {}
    leaves: list[torch.Tensor] = []
    for m in node.all_input_nodes:
        v = env[m]
        if m.op == "get_attr":
            local[m] = v
        elif isinstance(v, torch.Tensor):
            t = v.detach().clone()
            if requires_grad and t.is_floating_point():
                t.requires_grad_(True)
                leaves.append(t)
                t = t.clone()  # not a leaf: in-place operators are allowed on it
            local[m] = t
        else:
            local[m] = v
    return local, leaves


def _params(mg: ModelGraph, node, env: dict) -> list[torch.Tensor]:
    params = []
    if node.op == "call_module":
        params = [p for p in mg.gm.get_submodule(node.target).parameters() if p.requires_grad]
    return params + [t for m in node.all_input_nodes if m.op == "get_attr"
                     for t in _tensors(env[m]) if t.requires_grad]


def _time_forward(mg: ModelGraph, node, env: dict, warmup: int, repeats: int, device):
    """The forward as the trainer runs it: autograd records it (inputs that need grad)."""
    def setup():
        local, _ = _leaf_inputs(node, env, requires_grad=True)
        return lambda: run_node(mg.gm, node, local)
    return _timings(setup, warmup, repeats, device)


def _time_backward(mg: ModelGraph, node, env: dict, warmup: int, repeats: int, device):
    params = _params(mg, node, env)

    def setup():
        local, leaves = _leaf_inputs(node, env, requires_grad=True)
        outs = [t for t in _tensors(run_node(mg.gm, node, local))
                if t.is_floating_point() and t.requires_grad]
        wrt = leaves + params
        if not outs or not wrt:
            return lambda: None
        grads = [torch.ones_like(t) for t in outs]
        return lambda: torch.autograd.grad(outs, wrt, grads, allow_unused=True)
    return _timings(setup, warmup, repeats, device)


def main(argv: list[str] | None = None) -> int:
    """CLI entry point; returns the exit code (0 ok, 2 bad input)."""
    ap = argparse.ArgumentParser(prog="python -m runtime.profile", description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="MODULE:FUNCTION returning a workload")
    ap.add_argument("--batch-sizes", default="1,2,4,8", help="comma-separated micro-batch sizes")
    ap.add_argument("--warmup", type=int, default=2, help="untimed runs before timing (default 2)")
    ap.add_argument("--repeats", type=int, default=5, help="timed runs; the median is kept (default 5)")
    ap.add_argument("--threads", type=int, default=1,
                    help="intra-op threads, as each trainer rank uses (default 1, like torchrun)")
    ap.add_argument("--concurrent", type=int, default=1,
                    help="N profilers at once, each pinned to its own core; the median is kept "
                         "(default 1: one unpinned process; see runtime/cores.py)")
    ap.add_argument("--name", default=None, help="graph name (default: the FUNCTION spec)")
    ap.add_argument("--optimizer", choices=("sgd", "adam"), default="sgd",
                    help="the optimizer whose step is timed (runtime.train's --optimizer; default sgd)")
    ap.add_argument("--no-time-terms", action="store_true",
                    help="leave out op_overhead, optimizer_time_per_byte and the loss (node times only)")
    ap.add_argument("-o", "--output", required=True)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        sizes = [int(s) for s in args.batch_sizes.split(",") if s.strip()]
    except ValueError:
        print(f"error: --batch-sizes must be integers, but got {args.batch_sizes!r}", file=sys.stderr)
        return 2
    if args.threads < 1:
        print(f"error: --threads must be >= 1, got {args.threads}", file=sys.stderr)
        return 2
    worker = cores.worker_index()
    if args.concurrent != 1 and worker is None:
        try:
            doc = cores.profile_concurrent(sys.argv[1:] if argv is None else list(argv), args.concurrent,
                                           args.output)
        except InvalidInputError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        return _write(doc, args.output)
    if worker is not None:
        cores.pin(worker[0])
    threads = torch.get_num_threads()
    torch.set_num_threads(args.threads)
    try:
        torch.manual_seed(0)
        wl = load_workload(args.model)
        doc = profile(wl, sizes, args.warmup, args.repeats, name=args.name or args.model,
                      time_terms=not args.no_time_terms, optimizer=args.optimizer)
        if worker is not None:  # keep this core busy until every worker has finished
            _write(doc, args.output)
            signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
            cores.busy_loop(wl, sizes[-1])
    except InvalidInputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    finally:
        torch.set_num_threads(threads)
    return _write(doc, args.output)


def _write(doc: dict, output: str) -> int:
    tmp = f"{output}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=1)
    os.replace(tmp, output)  # a concurrent worker's parent waits for the file to appear whole
    logger.info("wrote %s: %d nodes, %d edges", output, len(doc["nodes"]), len(doc["edges"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
