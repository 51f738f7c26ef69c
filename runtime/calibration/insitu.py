"""In-situ calibration: the node times scaled so that a one-stage plan costs what the runtime runs.

Each node is profiled on its own (``gpp_runtime.capture.profiler``), and the whole model's forward and
backward through its fx module (``gpp_runtime.calibration.terms``) give the per-node overhead. Neither is
what ``gpp_runtime.train`` runs: the stage executor (saved-tensor hook, chunk slicing, the loss, the
sends), the step around it (the batch sampled, gradients zeroed, the optimizer), and the machine as
it is while a trainer holds a micro-batch's activations rather than a node's. Measured on this
project's 2-vCPU host, the node-by-node sum missed the one-device plans by -16% (googlenet) to +47%
(a 13-node two-tower at 2.7 ms): medians of isolated nodes run 15-40% above their fastest runs,
which the executor's run matches, and a small model pays a fixed cost per action.

So the profiler ends by training the model itself: at each profiled size ``b`` a one-stage plan of
every node (mini-batch ``b``, one micro-batch, one device) runs in ``gpp_runtime.GraphPipeline`` on a
process group of one rank, ``warmup`` steps and then ``rounds * repeats`` timed steps (more
while they have lasted less than ``MIN_SECONDS``) as ``gpp_runtime.train`` runs them (zero the
gradients, sample the batch, ``step``, ``optimizer.step()``). On a CPU the sizes take ``TURNS``
turns, each running a third of every size's steps: a slow stretch of the machine (a few seconds on this
project's 2-vCPU host, one core at a time) lands in one turn of one size, and the median over the
size's steps outvotes it; run size after size, it made one concurrent profiler's size 1.5x slower
than the other's, and the merged node times (the mean of two) 25% slower. Per size, from the
step's recorded actions (medians over the timed steps):

- ``k_fw(b) = (F(b) - N * op_overhead.fw) / sum_v fw_time_v(b)`` and every node's ``fw_time`` at
  ``b`` (its ``time_spread`` too) is multiplied by it; the same for the backward (and a measured
  ``bw_weight_time``). The one-stage plan's forward at ``b`` is then exactly ``F(b)``; a stage of a
  larger plan gets the nodes' share of it;
- ``optimizer.step()`` is timed on its own in each step (on CUDA between two events on the
  stream, with no synchronisation before it that ``gpp_runtime.train`` would not do), the median
  over the sizes (the same weight bytes at each); the rest of the step (the median step less
  ``F + B`` and the optimizer step: the step's own work) is fitted over the sizes as
  ``fixed + per_sample * b`` (:func:`rest_fit`): the batch is sampled whole on every rank, a cost that grows with the
  mini-batch (a two-stage MLP at 128 samples: 0.8 ms of rest at 1 sample, 1.8 ms at 128). The
  optimizer step per weight byte becomes ``optimizer_time_per_byte``, ``per_sample`` the graph's
  ``step_time_per_sample`` and ``fixed`` its ``step_time_fixed``: every rank runs the loop
  around its stage's actions whatever its share of the weights (BERT tiny: 0.08 ms of optimizer
  and 0.22 ms of the rest a step, which a term per weight byte gave a two-stage plan's ranks at
  half). (Fitted with the optimizer inside the rest, two noisy sizes could put all of it in the
  slope and leave 0 for the optimizer.)
- the timed steps take turns between the step above and one whose gradients are zeroed in place
  rather than set to None, so that its backward sums into ``.grad`` as every micro-batch of a
  runtime step after the first does: the median, over every such step of every size, of its
  backward less the backward of the step just before it (at least 0), over the model's weight
  bytes, is the graph's ``grad_accumulation_time_per_byte``
  (resnet18 in float64 on one core of this project's 2-vCPU host: 4-5 ms a step for 89 MB of
  weights, as the runtime's two-micro-batch steps showed in their traces).

The factors, the measured times and the step's rest are kept in ``extra.profile.in_situ``.
Calibration needs a process group of its own (gloo, one rank, an in-memory store); where one is
already initialised (a profile under torchrun), or where the runtime refuses to train the model
(a loss over the whole batch, which it cannot split into micro-batches), it is skipped with a
warning and ``extra.profile.in_situ.skipped`` says why: the node times stay as profiled.
"""

from __future__ import annotations

import logging
import statistics
import time
from dataclasses import replace

import torch
import torch.distributed as dist

from gpp_solver.errors import InvalidInputError
from gpp_solver.formats.cluster import v100_cluster
from gpp_solver.formats.graph import as_graph
from gpp_solver.plan.build import StageSpec, build_plan
from gpp_solver.types import SearchInfo, Status

from ..capture.tracing import workload_hooks
from ..engine.pipeline import GraphPipeline
from ..engine.stage_setup import TrainWorkload
from ..engine.verify import make_optimizer

logger = logging.getLogger(__name__)

#: timed steps per size run for this long at least (a 2 ms step's 15 runs would time 30 ms of a
#: machine whose speed moves over seconds), and no more steps than this
MIN_SECONDS = 0.5
MAX_STEPS = 2000
#: turns over the sizes (each runs a share of the steps and of ``MIN_SECONDS``)
TURNS = 3


def one_stage_plan(doc: dict, b: int):
    """The one-device, one-stage plan of every node of ``doc`` at mini-batch ``b`` (one micro-batch)."""
    graph = as_graph(doc)
    cluster = replace(v100_cluster(1), memory_bytes=float(2**62))
    spec = StageSpec(nodes=tuple(n.id for n in graph.nodes), devices=(0,), micro_batch_size=b)
    return build_plan(graph, cluster, [spec], b, planner="in-situ", search=SearchInfo(0.0, Status.FEASIBLE))


class _LocalGroup:
    """A gloo process group of one rank for the calibration; nothing where one exists already."""

    def __enter__(self) -> bool:
        self.made = False
        if dist.is_initialized():
            return False
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        self.made = True
        return True

    def __exit__(self, *exc) -> None:
        if self.made:
            dist.destroy_process_group()


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class _OptimizerClock:
    """The optimizer step's time from where it starts: on CUDA between two events on the stream (its
    kernels, after the backward's, with no synchronisation that ``gpp_runtime.train`` does not do); on
    a CPU the wall clock."""

    def __init__(self, device: torch.device) -> None:
        self.events = None
        self.t0 = self.t1 = time.perf_counter()
        if device.type == "cuda":
            self.events = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
            self.events[0].record()

    def stop(self) -> None:
        """Right after the optimizer step (its kernels queued)."""
        self.t1 = time.perf_counter()
        if self.events is not None:
            self.events[1].record()

    def seconds(self) -> float:
        """After the step's synchronisation."""
        if self.events is None:
            return self.t1 - self.t0
        return self.events[0].elapsed_time(self.events[1]) / 1e3


def measure(
    workload, doc: dict, sizes: list[int], warmup: int, steps: int, optimizer: str, precision: str | None = None
) -> list[dict]:
    """Per size: ``{"size", "fw", "bw", "step", "rest"}`` medians (seconds) over ``steps`` timed
    steps of the one-stage plan as ``gpp_runtime.train`` runs it (more while they have lasted under
    ``MIN_SECONDS``), in ``TURNS`` turns over the sizes on a CPU: a slow stretch of the machine
    lands in one turn of a size, which the median over the size's steps outvotes."""
    # the plan's memory figures and the tracing's fallbacks were said (or mean nothing) here
    quiet = [logging.getLogger(n) for n in ("gpp_runtime.engine", "gpp_runtime.capture", "gpp_runtime.lowering")]
    levels = [q.level for q in quiet]
    for q in quiet:
        q.setLevel(logging.ERROR)
    runs: list[_SizeRun] = []
    try:
        for b in sizes:  # one at a time: a size that fails to build still closes the ones before it
            runs.append(_SizeRun(workload, doc, b, optimizer, precision))
        # turns were measured on CPU ranks only; a GPU keeps one block per size (the only GPU
        # profile with turns, CLIP on an H200, came out 40% slower than the lease before it)
        turns = TURNS if all(run.pipe.device.type == "cpu" for run in runs) else 1
        per_turn = -(-steps // turns)
        for turn in range(turns):
            for run in runs:
                run.steps(warmup if turn == 0 else 1, per_turn, MIN_SECONDS / turns)
        return [run.result() for run in runs]
    finally:
        for run in runs:
            run.pipe.close()
        for q, level in zip(quiet, levels):
            q.setLevel(level)


class _SizeRun:
    """The one-stage plan of one size of :func:`measure`, and its timed steps so far."""

    def __init__(self, workload, doc: dict, b: int, optimizer: str, precision: str | None = None) -> None:
        self.b = b
        self.wl = wl = TrainWorkload(workload, None, b)
        example, _ = wl.sample(max(2, b), 0)  # traced as the profiler traces it (one row specialises an export)
        device = next((p.device for p in wl.model.parameters()), torch.device("cpu"))
        wl.model.to("cpu")  # built as gpp_runtime.train builds it: traced on the CPU, moved by the pipeline
        self.pipe = GraphPipeline(
            wl.model,
            one_stage_plan(doc, b),
            wl.loss,
            example,
            device,
            loss_reduction=wl.reduction,
            memory_step=None,
            tracing=workload_hooks(workload),
            precision=precision or "float32",
        )
        self.opt = make_optimizer(self.pipe.parameters(), optimizer, 1e-4, 0.0)
        self.fw: list[float] = []
        self.bw: list[float] = []
        self.step_t: list[float] = []
        self.opt_t: list[float] = []
        self.bw_acc: list[float] = []
        self.pairs: list[float] = []
        self.step = 0

    def steps(self, warmup: int, steps: int, min_seconds: float) -> None:
        """``warmup`` untimed steps, then ``steps`` timed ones (more while under ``min_seconds``).

        The timed steps take turns: one as gpp_runtime.train runs a single micro-batch (gradients set
        to None: the backward's gradients become .grad), then one whose backward sums into
        gradients already there (zeroed in place), as every micro-batch of a step after its first
        does."""
        pipe, opt, wl, b = self.pipe, self.opt, self.wl, self.b
        accumulate = opt is not None
        began = time.perf_counter()  # of the timed steps: the end of the last warm-up step
        done = timed = 0
        while timed % 2 or timed < 2 * steps or (time.perf_counter() - began < min_seconds and timed < 2 * MAX_STEPS):
            summed = accumulate and done >= warmup and timed % 2 == 1
            n0 = len(pipe.rec.events)
            _sync(pipe.device)
            t0 = time.perf_counter()
            if opt is not None:
                opt.zero_grad(set_to_none=not summed)
            inputs, target = wl.sample(b, self.step)
            pipe.step(*inputs, target=target)
            clock = _OptimizerClock(pipe.device)  # no synchronisation before it: the step runs as trained
            pipe.scaler.step(opt)  # opt.step(), as gpp_runtime.train steps (fp16: unscaled first)
            pipe.scaler.update()
            clock.stop()
            _sync(pipe.device)
            t1 = time.perf_counter()
            done += 1
            self.step += 1
            if done <= warmup:
                began = t1
                continue
            timed += 1 if accumulate else 2
            ev = pipe.rec.events[n0:]
            backward = sum(e[2] - e[1] for e in ev if e[3] == "compute" and e[0].startswith("B"))
            if summed:
                self.bw_acc.append(backward)
                self.pairs.append(backward - self.bw[-1])  # beside the step just before it: the machine as it was
                continue
            self.fw.append(sum(e[2] - e[1] for e in ev if e[3] == "compute" and e[0].startswith("F")))
            self.bw.append(backward)
            self.step_t.append(t1 - t0)
            self.opt_t.append(clock.seconds())

    def result(self) -> dict:
        f, g, s = (statistics.median(x) for x in (self.fw, self.bw, self.step_t))
        out = {"size": self.b, "fw": f, "bw": g, "step": s, "rest": max(0.0, s - f - g), "steps": len(self.step_t)}
        out["optimizer"] = statistics.median(self.opt_t)  # optimizer.step() alone, timed in the step
        if self.bw_acc:  # the backward summing into .grad, and each one less the backward before it
            out["bw_accumulating"] = statistics.median(self.bw_acc)
            out["accumulation_pairs"] = self.pairs
        return out


def _scale(nd: dict, kind: str, i: int, k: float) -> None:
    nd[f"{kind}_time"][i] *= k
    if kind == "bw" and nd.get("bw_weight_time"):
        nd["bw_weight_time"][i] = min(nd["bw_time"][i], nd["bw_weight_time"][i] * k)
    spread = nd.get("extra", {}).get("time_spread", {}).get(kind)
    if spread:
        spread[i] = [spread[i][0] * k, spread[i][1] * k]


def calibrate(doc: dict, measured: list[dict]) -> dict:
    """Scale ``doc``'s node times per size and kind to the measured one-stage forward and backward,
    and set ``optimizer_time_per_byte`` from the step's rest (module docstring); returns the record
    kept in ``extra.profile.in_situ``."""
    nodes = doc["nodes"]
    n = len(nodes)
    overhead = doc.get("op_overhead", {"fw": 0.0, "bw": 0.0})
    index = {b: i for i, b in enumerate(doc["micro_batch_sizes"])}
    factors = {"fw": [], "bw": []}
    for m in measured:
        i = index[m["size"]]
        for kind in ("fw", "bw"):
            summed = sum(nd[f"{kind}_time"][i] for nd in nodes)
            target = m[kind] - n * overhead[kind]
            k = target / summed if summed > 0 and target > 0 else 1.0
            for nd in nodes:
                _scale(nd, kind, i, k)
            factors[kind].append(k)
    # optimizer.step() is timed on its own (the same weight bytes at every size: the median over the
    # sizes); the rest of the step less it is fitted: a part per sample and a part per step
    optimizer = statistics.median(m.get("optimizer", 0.0) for m in measured)
    other = [max(0.0, m["rest"] - m.get("optimizer", 0.0)) for m in measured]
    fixed, per_sample = rest_fit([m["size"] for m in measured], other)
    weight = sum(nd["weight_bytes"] for nd in nodes)
    if weight > 0:
        doc["optimizer_time_per_byte"] = optimizer / weight
    for key, value in (("step_time_per_sample", per_sample), ("step_time_fixed", fixed)):
        doc.pop(key, None)
        if value > 0:
            doc[key] = value
    record = {
        "measured": measured,
        "scale": factors,
        "rest_fit": {"fixed": fixed, "per_sample": per_sample, "optimizer": optimizer},
        "what": "gpp_runtime.calibration.insitu",
    }
    pairs = [x for m in measured for x in m.get("accumulation_pairs", ())]
    if pairs and weight > 0:
        # what summing into .grad adds to a backward: the same bytes at every size, so the median of
        # every pair's difference over all sizes (the smaller sizes' backwards, shorter, vary less)
        extra = max(0.0, float(statistics.median(pairs)))
        doc.pop("grad_accumulation_time_per_byte", None)
        if extra > 0:
            doc["grad_accumulation_time_per_byte"] = extra / weight
        record["accumulation"] = {"pairs": len(pairs), "seconds": extra}
    return record


def rest_fit(sizes: list[int], rest: list[float]) -> tuple[float, float]:
    """``(fixed, per_sample)`` of ``rest(b) = fixed + per_sample * b`` over the profiled sizes: the
    median of the slopes between pairs of sizes (Theil-Sen: one slow step spoils a few pairs, not
    the fit), at least 0, and the median of ``rest - per_sample * b``, at least 0. One size: all
    of it fixed."""
    slopes = [
        (rest[j] - rest[i]) / (sizes[j] - sizes[i])
        for i in range(len(sizes))
        for j in range(i + 1, len(sizes))
        if sizes[j] != sizes[i]
    ]
    per_sample = max(0.0, float(statistics.median(slopes))) if slopes else 0.0
    fixed = max(0.0, float(statistics.median(r - per_sample * b for b, r in zip(sizes, rest))))
    return fixed, per_sample


def add_in_situ(
    doc: dict, workload, sizes: list[int], warmup: int, steps: int, optimizer: str, precision: str | None = None
) -> None:
    """Measure and apply the in-situ calibration to ``doc`` (module docstring), the one-stage plan
    trained in ``precision`` (``GraphPipeline``'s)."""
    info = doc["extra"]["profile"]
    with _LocalGroup() as ours:
        if not ours:
            logger.warning("a process group is already initialised: the in-situ calibration is skipped")
            info["in_situ"] = {"skipped": "a process group was already initialised"}
            return
        try:
            measured = measure(workload, doc, sizes, warmup, steps, optimizer, precision)
        except (InvalidInputError, RuntimeError) as exc:  # e.g. a loss over the whole batch, refused per chunk
            why = (str(exc).splitlines() or [type(exc).__name__])[0]
            logger.warning("the in-situ calibration could not train the model (%s): node times kept as profiled", why)
            info["in_situ"] = {"skipped": f"the one-stage plan did not train: {why}"}
            return
    info["in_situ"] = calibrate(doc, measured)
