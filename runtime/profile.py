"""Profile a PyTorch workload into a ``gpp-graph/1`` JSON.

    python -m runtime.profile --model examples.two_branch:workload --batch-sizes 1,2,4,8 -o graph.json

The model is traced with torch.fx (see ``runtime.fx_graph`` for how nodes are named). Each node is
then run on its own, with the inputs it sees in a full forward pass of ``sample(b, 0)``:

- ``fw_time[i]``: median over ``--repeats`` runs (after ``--warmup`` runs) of the node's forward at
  micro-batch ``micro_batch_sizes[i]``;
- ``bw_time[i]``: median time of ``torch.autograd.grad`` of the node's floating outputs (grad of
  ones) with respect to its floating inputs and its parameters;
- ``weight_bytes``: bytes of the parameters (and buffers) of the node's module or attributes;
- ``output_bytes``: bytes per sample of the node's tensor outputs;
- ``activation_bytes`` (the rule): bytes per sample of the node's floating-point tensor inputs plus
  its floating-point tensor outputs, i.e. what a typical op saves for backward (its inputs) plus
  the output that stays alive until the consumer's backward. Measured at the largest batch size.

Every number is finite and non-negative; times are clamped at 0 and are wall-clock seconds
(CUDA is synchronised around each measurement when the model sits on a GPU).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import statistics
import sys
import time

import torch

from gpp_solver.errors import InvalidInputError
from runtime.fx_graph import ModelGraph, load_workload, propagate, run_node, trace

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
    return sum(t.numel() * t.element_size() for t in tensors)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _median_time(fn, warmup: int, repeats: int, device: torch.device) -> float:
    """Median wall time of ``fn()``; ``fn`` may return a callable to time instead (backward)."""
    times = []
    for i in range(warmup + repeats):
        timed = fn()
        _sync(device)
        t0 = time.perf_counter()
        timed()
        _sync(device)
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    return max(0.0, statistics.median(times))


def _weight_bytes(mg: ModelGraph, node) -> int:
    if node.op == "call_module":
        mod = mg.gm.get_submodule(node.target)
        return _nbytes(list(mod.parameters()) + list(mod.buffers()))
    attrs = [m for m in node.all_input_nodes if m.op == "get_attr"]
    return _nbytes([t for a in attrs for t in _tensors(run_node(mg.gm, a, {}))])


def profile(workload, batch_sizes: list[int], warmup: int = 2, repeats: int = 5,
            name: str = "model") -> dict:
    """Profile ``workload`` at each batch size and return the gpp-graph/1 document (a dict)."""
    if not batch_sizes or any(b <= 0 for b in batch_sizes) or sorted(set(batch_sizes)) != batch_sizes:
        raise InvalidInputError(
            f"--batch-sizes must be strictly increasing positive integers, but got {batch_sizes}")
    mg = trace(workload.model)
    device = next((p.device for p in workload.model.parameters()), torch.device("cpu"))
    fw = {n: [] for n in mg.nodes}
    bw = {n: [] for n in mg.nodes}
    act_bytes: dict = {}
    out_bytes: dict = {}
    for b in batch_sizes:
        inputs, _ = workload.sample(b, 0)
        inputs = tuple(x.to(device) for x in inputs)
        with torch.no_grad():
            env = propagate(mg, inputs)
        for node in mg.nodes:
            fw[node].append(_time_forward(mg, node, env, warmup, repeats, device))
            bw[node].append(_time_backward(mg, node, env, warmup, repeats, device))
            if b == batch_sizes[-1]:
                ins = [t for m in node.all_input_nodes if m.op != "get_attr"
                       for t in _tensors(env[m]) if t.is_floating_point()]
                outs = _tensors(env[node])
                act_bytes[node] = _nbytes(ins + [t for t in outs if t.is_floating_point()]) / b
                out_bytes[node] = _nbytes(outs) / b
    nodes = []
    for node in mg.nodes:
        nodes.append({
            "id": mg.ids[node],
            "fw_time": [float(t) for t in fw[node]],
            "bw_time": [float(t) for t in bw[node]],
            "weight_bytes": int(_weight_bytes(mg, node)),
            "activation_bytes": float(act_bytes[node]),
            "output_bytes": float(out_bytes[node]),
        })
    for nd in nodes:
        for v in nd["fw_time"] + nd["bw_time"] + [nd["activation_bytes"], nd["output_bytes"]]:
            assert math.isfinite(v) and v >= 0, (nd["id"], v)
    return {"format": "gpp-graph/1", "name": name, "micro_batch_sizes": list(batch_sizes),
            "nodes": nodes, "edges": [{"src": s, "dst": d} for s, d in mg.edges()]}


def _leaf_inputs(node, env: dict, requires_grad: bool) -> tuple[dict, list[torch.Tensor]]:
    """A fresh environment for ``node``'s inputs: detached clones, floating ones needing grad."""
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
            local[m] = t
        else:
            local[m] = v
    return local, leaves


def _time_forward(mg: ModelGraph, node, env: dict, warmup: int, repeats: int, device) -> float:
    local, _ = _leaf_inputs(node, env, requires_grad=False)

    def setup():
        def run():
            with torch.no_grad():
                run_node(mg.gm, node, local)
        return run
    return _median_time(setup, warmup, repeats, device)


def _time_backward(mg: ModelGraph, node, env: dict, warmup: int, repeats: int, device) -> float:
    params = []
    if node.op == "call_module":
        params = [p for p in mg.gm.get_submodule(node.target).parameters() if p.requires_grad]
    params += [t for m in node.all_input_nodes if m.op == "get_attr"
               for t in _tensors(env[m]) if t.requires_grad]

    def setup():
        local, leaves = _leaf_inputs(node, env, requires_grad=True)
        outs = [t for t in _tensors(run_node(mg.gm, node, local))
                if t.is_floating_point() and t.requires_grad]
        wrt = leaves + params
        if not outs or not wrt:
            return lambda: None
        grads = [torch.ones_like(t) for t in outs]
        return lambda: torch.autograd.grad(outs, wrt, grads, allow_unused=True)
    return _median_time(setup, warmup, repeats, device)


def main(argv: list[str] | None = None) -> int:
    """CLI entry point; returns the exit code (0 ok, 2 bad input)."""
    ap = argparse.ArgumentParser(prog="python -m runtime.profile", description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="MODULE:FUNCTION returning a workload")
    ap.add_argument("--batch-sizes", default="1,2,4,8", help="comma-separated micro-batch sizes")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--name", default=None, help="graph name (default: the FUNCTION spec)")
    ap.add_argument("-o", "--output", required=True)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        sizes = [int(s) for s in args.batch_sizes.split(",") if s.strip()]
    except ValueError:
        print(f"error: --batch-sizes must be integers, but got {args.batch_sizes!r}", file=sys.stderr)
        return 2
    try:
        torch.manual_seed(0)
        wl = load_workload(args.model)
        doc = profile(wl, sizes, args.warmup, args.repeats, name=args.name or args.model)
    except InvalidInputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    with open(args.output, "w") as f:
        json.dump(doc, f, indent=1)
    logger.info("wrote %s: %d nodes, %d edges", args.output, len(doc["nodes"]), len(doc["edges"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
