"""Each node's forward timed inside the whole model's forward, on a CPU (``gpp_runtime.profile``'s default).

The profiler times every node on its own (``gpp_runtime.capture.profiler``): the node runs again and
again on the same inputs, so its weights and inputs stay in the core's caches. Inside a training
step they do not: every other node has run in between. On this project's 2-vCPU host (32 MiB of
L3 shared by every tenant) the difference is not a constant per node, and it moves time between
stages. Resnet18 (float64, 32x32 images, 2 samples), split by GraphPipe after ``layer3.1.relu``
(46 nodes, 21 MB of weights, then 23 nodes, 68 MB: ``layer4`` and the head):

- the nodes timed on their own: forward 8.9 and 7.0 ms (+ 3.2 and 1.6 ms of per-node overhead);
- the same nodes timed one by one inside whole forwards: 11.7 and 9.8 ms;
- the two-stage pipeline's traces (docs/results.md, *Forward times in context*): stage forwards
  of 10.5-11.3 and 9.4-10.3 ms a micro-batch. The isolated profile put the second stage's forward 25% low and made
  the pipeline's slower stage the faster one.

So on a CPU the forward times of the profile are replaced by these: the model runs node by node
(the fx graph's order, grad enabled, the trainer's saved-tensor hook) ``warmup + repeats`` times,
each fx node's forward timed in place, and each graph node keeps the median (and fastest and
slowest, its ``time_spread``) over the runs of the sum over its fx nodes. Under autocast each
run starts with autocast's cache of weight casts empty: the trainer opens an autocast region per
micro-batch's forward, so a node that reads a weight first pays its cast in every forward. The
backward keeps the per-node profile. On a GPU nothing is replaced: a node timed inside the forward would need a
synchronisation per node, which changes what it times. ``extra.profile.forward_times`` names the
method used.
"""

from __future__ import annotations

import statistics
import time

import torch

from ..capture.fx_graph import COMPUTE_OPS, ModelGraph, run_node


def forward_in_context(
    mg: ModelGraph, inputs: tuple, warmup: int, repeats: int, pack
) -> dict[str, tuple[float, float, float]]:
    """Per graph node, ``(median, fastest, slowest)`` seconds of its forward over ``repeats`` whole
    forwards (after ``warmup``), each fx node timed where it runs; ``pack`` is the saved-tensor
    hook the forwards run under (the trainer's)."""
    runs: list[dict[str, float]] = []
    for i in range(warmup + repeats):
        per: dict[str, float] = {gid: 0.0 for gid, _ in mg.groups}
        env: dict = dict(zip(mg.placeholders, inputs))
        torch.clear_autocast_cache()  # each forward casts its weights anew, as each micro-batch's does
        with torch.enable_grad(), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            for n in mg.gm.graph.nodes:
                if n.op == "get_attr":
                    env[n] = run_node(mg.gm, n, env)
                elif n.op in COMPUTE_OPS:
                    t0 = time.perf_counter()
                    env[n] = run_node(mg.gm, n, env)
                    if n in mg.group:
                        per[mg.group[n]] += time.perf_counter() - t0
        del env
        if i >= warmup:
            runs.append(per)
    return {
        gid: (statistics.median(r[gid] for r in runs), min(r[gid] for r in runs), max(r[gid] for r in runs))
        for gid, _ in mg.groups
    }


def use_in_context_forward(nodes: list[dict], per_size: list[dict[str, tuple[float, float, float]]]) -> None:
    """Write the in-context forward times (one :func:`forward_in_context` result per profiled size)
    into the graph's ``nodes``: ``fw_time`` and ``extra.time_spread.fw``."""
    for nd in nodes:
        nd["fw_time"] = [float(t[nd["id"]][0]) for t in per_size]
        nd.setdefault("extra", {}).setdefault("time_spread", {})["fw"] = [
            [float(t[nd["id"]][1]), float(t[nd["id"]][2])] for t in per_size
        ]
