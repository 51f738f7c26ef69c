"""What ``gpp_runtime.profile`` measures beside each node's own times: the time-model terms of a graph.

:func:`profile_with_terms` is ``gpp_runtime.capture.profiler.profile`` plus these terms (the command
line's default; ``--no-time-terms`` leaves them out).

- **Per-node overhead** (``op_overhead``, ``docs/time-terms.md``): the whole model's forward and
  backward as the trainer runs them (one fx ``GraphModule`` call under autograd with the trainer's
  saved-tensor hook, one ``torch.autograd.backward`` from every floating output), less the sum of
  the nodes' own times, per node; both the fastest of their timed runs (a run delayed by another
  process is not overhead). Each node is profiled on its own (an fx interpreter call, a
  ``torch.autograd.grad`` call), so its times carry a per-call cost the trainer does not pay, and
  lack the dispatch the trainer's generated code, autograd graph and hooks do; the difference is
  what every node adds, on average, per forward and per backward, at each profiled size (signed,
  kept in ``extra.profile.op_overhead_per_size``). Where it is negative (a node's own profiling
  call, e.g. a ``torch.autograd.grad`` call per node, costs more than the node adds inside the
  whole stage: about -25 us per node for the backward on this project's 2-vCPU host) it is taken
  off every node's time at that size (never below 0: the format's times are non-negative); the
  graph's ``op_overhead`` is the median over sizes of the positive parts. On a CPU the nodes'
  forward times are first replaced by their times inside whole forwards
  (``gpp_runtime.calibration.context``), so ``op_overhead.fw`` is what the trainer's generated module adds
  to those.
- **Loss** (``loss_fw``/``loss_bw`` per size): the workload's ``loss`` on the model's output and
  target, forward and backward. The trainer runs it on the stage that holds the model's output,
  and a per-node profile never sees it; the profiler adds it to the sink node's times (and keeps
  it in that node's ``extra.loss_time``).
- **Optimizer step** (``optimizer_time_per_byte``): the median time of ``optimizer.step()`` over
  every trainable parameter (gradients set), divided by the graph's weight bytes (what the cost
  model multiplies it by), for the optimizer ``gpp_runtime.train`` uses (``--optimizer``, SGD by
  default; named in ``extra.profile.optimizer``).

- **Split backward** (``split_backward_overhead``, on a CPU): what an order with ``W`` actions adds
  beside the nodes' times, ``gpp_runtime.calibration.split_cost``.

Then, by default, ``gpp_runtime.calibration.insitu`` calibrates the node times (and replaces
``optimizer_time_per_byte``) to a one-stage plan as the runtime trains it.
"""

from __future__ import annotations

import statistics
import time

import torch

from gpp_solver.errors import InvalidInputError

from ..capture.fx_graph import propagate, trace_workload
from ..capture.precision import Precision
from ..capture.precision import precision as as_precision
from ..capture.profiler import profile
from ..engine.verify import make_optimizer
from .context import forward_in_context, use_in_context_forward
from .insitu import add_in_situ
from .split_cost import split_backward_overhead


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _median(fn, warmup: int, repeats: int, device: torch.device, stat=statistics.median) -> float:
    """Median (or ``stat``) wall time of ``fn()()`` (``fn`` prepares untimed and returns the
    callable to time)."""
    times = []
    for i in range(warmup + repeats):
        timed = fn()
        _sync(device)
        t0 = time.perf_counter()
        timed()
        _sync(device)
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    return stat(times)


def _floating(value) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value] if value.is_floating_point() and value.requires_grad else []
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in _floating(v)]
    if isinstance(value, dict):
        return [t for v in value.values() for t in _floating(v)]
    return []


def _pack_hook(params: set[int]):
    """The trainer's saved-tensor hook (``gpp_runtime.engine.executor``): it counts what autograd saves."""
    held = [0]

    def pack(t: torch.Tensor) -> torch.Tensor:
        if t.untyped_storage().data_ptr() not in params:
            held[0] += t.numel() * t.element_size()
        return t

    return pack


def whole_model_times(
    gm: torch.nn.Module, inputs: tuple, warmup: int, repeats: int, device: torch.device
) -> tuple[float, float]:
    """``(forward, backward)`` seconds of the whole model as the trainer runs a stage: the fastest
    of the timed runs, compared with the nodes' fastest runs (``time_spread``), so that a run
    another process delayed does not count as overhead."""
    params = list(gm.parameters())
    ptrs = {p.untyped_storage().data_ptr() for p in params}

    def forward():
        return gm(*inputs)

    def setup_fw():
        return lambda: _run_hooked(forward, ptrs)

    def setup_bw():
        for p in params:
            p.grad = None
        outs = _floating(_run_hooked(forward, ptrs))
        if not outs:
            return lambda: None
        grads = [torch.ones_like(t) for t in outs]
        return lambda: torch.autograd.backward(outs, grads)

    fw = _median(setup_fw, warmup, repeats, device, min)
    bw = _median(setup_bw, warmup, repeats, device, min)
    for p in params:
        p.grad = None
    return fw, bw


def _run_hooked(fn, ptrs: set[int]):
    with torch.autograd.graph.saved_tensors_hooks(_pack_hook(ptrs), lambda t: t):
        return fn()


def loss_times(loss_fn, output, target, warmup: int, repeats: int, device: torch.device) -> tuple[float, float]:
    """``(forward, backward)`` median seconds of ``loss_fn(output, target)`` on a leaf copy of the
    output (its floating tensors require grad, as the stage's output does in the trainer)."""

    def leaf(v):
        if isinstance(v, torch.Tensor) and v.is_floating_point():
            return v.detach().clone().requires_grad_(True)
        if isinstance(v, (tuple, list)):
            return type(v)(leaf(x) for x in v)
        return v

    def setup_fw():
        out = leaf(output)
        return lambda: loss_fn(out, target)

    def setup_bw():
        loss = loss_fn(leaf(output), target)
        return lambda: loss.backward() if isinstance(loss, torch.Tensor) and loss.requires_grad else None

    return _median(setup_fw, warmup, repeats, device), _median(setup_bw, warmup, repeats, device)


def optimizer_seconds(
    model: torch.nn.Module,
    name: str,
    warmup: int,
    repeats: int,
    device: torch.device,
    lr: float = 1e-4,
    momentum: float = 0.0,
) -> float:
    """Median seconds of one ``optimizer.step()`` over the model's trainable parameters (0 without
    any); the parameters are restored afterwards."""
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        return 0.0
    saved = [p.detach().clone() for p in params]
    opt = make_optimizer(params, name, lr, momentum)
    for p in params:
        p.grad = torch.full_like(p, 1e-3)
    t = _median(lambda: opt.step, max(1, warmup), repeats, device)  # Adam's state exists after one step
    with torch.no_grad():
        for p, s in zip(params, saved):
            p.copy_(s)
            p.grad = None
    return t


def overhead_per_node(whole: list[float], summed: list[float], n_nodes: int) -> list[float]:
    """Per size, ``(whole - sum of the nodes) / nodes``: what each node adds (signed)."""
    return [(w - s) / max(1, n_nodes) for w, s in zip(whole, summed)]


def remove_call_cost(nodes: list[dict], kind: str, per_size: list[float]) -> None:
    """Take a negative per-node overhead at a size off every node's ``{kind}_time`` there, and off
    its ``time_spread`` (never below 0). For the backward, also off a measured ``bw_weight_time``
    (timed by its own per-node ``torch.autograd.grad`` call, so it carries the same call cost),
    which stays at most the node's ``bw_time``."""
    for i, v in enumerate(per_size):
        if v < 0:
            for nd in nodes:
                nd[f"{kind}_time"][i] = max(0.0, nd[f"{kind}_time"][i] + v)
                weight = nd.get("bw_weight_time") if kind == "bw" else None
                if weight and weight[i] > 0:
                    weight[i] = min(nd["bw_time"][i], max(0.0, weight[i] + v))
                spread = nd.get("extra", {}).get("time_spread", {}).get(kind)
                if spread:
                    spread[i] = [max(0.0, spread[i][0] + v), max(0.0, spread[i][1] + v)]


def graph_overhead(per_size_fw: list[float], per_size_bw: list[float]) -> dict[str, float]:
    """The graph's ``op_overhead``: per kind, the median over sizes of the positive parts."""
    return {
        "fw": float(statistics.median(max(0.0, v) for v in per_size_fw)),
        "bw": float(statistics.median(max(0.0, v) for v in per_size_bw)),
    }


def profile_with_terms(
    workload,
    micro_batch_sizes: list[int],
    warmup: int = 2,
    repeats: int = 5,
    name: str = "model",
    optimizer: str = "sgd",
    rounds: int = 1,
    in_situ: bool = True,
    precision: Precision | str | None = None,
) -> dict:
    """The profiler's gpp-graph/1 document with the time-model terms (module docstring); with
    ``rounds`` the whole model's fastest run is taken over ``rounds * repeats`` runs, as many as
    each node's. ``in_situ``: then calibrate the node times to a one-stage plan as the runtime
    runs it (``gpp_runtime.calibration.insitu``). ``precision``: every measurement in it (the
    profiler's, the terms' under its autocast, the one-stage plan's as ``GraphPipeline`` trains it)."""
    doc = profile(workload, micro_batch_sizes, warmup, repeats, name=name, rounds=rounds, precision=precision)
    with as_precision(precision).forward(next((p.device for p in workload.model.parameters()), "cpu")):
        add_time_terms(doc, workload, micro_batch_sizes, warmup, repeats * rounds, optimizer)
    if in_situ:
        add_in_situ(doc, workload, micro_batch_sizes, warmup, repeats * rounds, optimizer, precision)
    return doc


def add_time_terms(
    doc: dict, workload, micro_batch_sizes: list[int], warmup: int, repeats: int, optimizer: str = "sgd"
) -> None:
    """Measure and write the graph's op_overhead and optimizer_time_per_byte, and add the loss to
    the sink node of ``doc`` (the profile of ``workload`` at ``micro_batch_sizes``)."""
    mg = trace_workload(workload)
    device = next((p.device for p in workload.model.parameters()), torch.device("cpu"))
    whole, losses, in_context = [], [], []
    ptrs = {p.untyped_storage().data_ptr() for p in mg.gm.parameters()}
    for b in micro_batch_sizes:
        inputs, target = workload.sample(b, 0)
        inputs = tuple(x.to(device) if isinstance(x, torch.Tensor) else x for x in inputs)
        with torch.no_grad():
            out = propagate(mg, inputs)[mg.sink]
        if device.type == "cpu":  # each node's forward where it runs (runtime/calibration/context.py)
            in_context.append(forward_in_context(mg, inputs, warmup, repeats, _pack_hook(ptrs)))
        whole.append(whole_model_times(mg.gm, inputs, warmup, repeats, device))
        tgt = target.to(device) if isinstance(target, torch.Tensor) else target
        try:
            losses.append(loss_times(workload.loss, out, tgt, warmup, repeats, device))
        except Exception as exc:  # noqa: BLE001 - the workload's own loss, reported as such
            raise InvalidInputError(
                f"the workload's loss fails on the model's output at {b} samples ({type(exc).__name__}: "
                f"{str(exc).splitlines()[0] if str(exc) else ''}); --no-time-terms profiles without it"
            ) from exc
    nodes, info = doc["nodes"], doc["extra"]["profile"]
    if in_context:
        use_in_context_forward(nodes, in_context)
    info["forward_times"] = "in-context" if in_context else "isolated"
    per = {}
    for k, kind in enumerate(("fw", "bw")):
        # fastest runs on both sides (whole_model_times)
        summed = [sum(nd["extra"]["time_spread"][kind][i][0] for nd in nodes) for i in range(len(whole))]
        per[kind] = overhead_per_node([w[k] for w in whole], summed, len(nodes))
        remove_call_cost(nodes, kind, per[kind])
    doc["op_overhead"] = graph_overhead(per["fw"], per["bw"])
    info["op_overhead_per_size"] = per
    if device.type == "cpu":  # on a GPU the engine's walks overlap the kernels queued before them
        inputs, _ = workload.sample(micro_batch_sizes[0], 0)
        with torch.enable_grad():
            outs = _floating(mg.gm(*inputs))
        doc["split_backward_overhead"], info["split_backward_overhead"] = split_backward_overhead(outs, len(nodes))
    seconds = optimizer_seconds(mg.gm, optimizer, warmup, repeats, device)
    weight = sum(nd["weight_bytes"] for nd in nodes)
    doc["optimizer_time_per_byte"] = seconds / weight if weight else 0.0
    info["optimizer"] = {"name": optimizer, "seconds": seconds}
    sink = next(nd for nd in nodes if nd["id"] == mg.group[mg.sink])
    loss = {"fw": [t[0] for t in losses], "bw": [t[1] for t in losses]}
    for kind in ("fw", "bw"):
        sink[f"{kind}_time"] = [t + x for t, x in zip(sink[f"{kind}_time"], loss[kind])]
        sink["extra"]["time_spread"][kind] = [
            [lo + x, hi + x] for (lo, hi), x in zip(sink["extra"]["time_spread"][kind], loss[kind])
        ]
    sink["extra"]["loss_time"] = loss
