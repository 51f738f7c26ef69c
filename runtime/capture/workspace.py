"""Operators' transient memory (``workspace_bytes``, ``docs/formats.md``): what a node allocates
beyond the activations it keeps and the output it sends, measured at one micro-batch size.

Per fx node, run alone as the profiler times it (``gpp_runtime.capture.node_calls``), with only the
inputs that need grad in the model as leaves that need grad:

- its forward: the peak of live allocated bytes during the call above the bytes live at its start,
  less the bytes still live at its end (its output and what autograd saved): the forward's
  transient workspace (a convolution's reordered input, an unfused operator's intermediates);
- its backward (``torch.autograd.grad``): the peak of live allocated bytes during the call above
  the bytes live at its start: the gradients it produces and its workspace.

A graph node's figure is the largest over its fx nodes (they run one after the other) of the
larger of the two, per sample. Live bytes are those of the allocator: on CUDA
``torch.cuda.max_memory_allocated`` after ``reset_peak_memory_stats``; on CPU the running sum of
the CPU allocator's allocation and free events that ``torch.profiler`` records (``profile_memory``,
as ``gpp_runtime.engine.memory.MemoryMeter`` measures a rank), every call in one profiling session,
each delimited by a ``record_function`` range.
"""

from __future__ import annotations

import bisect
import contextlib
import os
from collections.abc import Callable, Sequence

import torch
from torch._C._profiler import _EventType
from torch.profiler import ProfilerActivity, profile, record_function

from .fx_graph import ModelGraph
from .node_calls import backward_setup, forward_setup, needs_grad

_RANGE = "gpp_workspace"


@contextlib.contextmanager
def quiet_stderr():
    """Silence the profiler's own start/stop lines (written to fd 2 by its C++ side)."""
    try:
        saved = os.dup(2)
    except OSError:
        yield
        return
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def cpu_allocations(prof) -> list[tuple[int, int]]:
    """The CPU allocator's allocation (+bytes) and free (-bytes) events of a finished
    ``torch.profiler`` session, ``(time ns, bytes)`` in time order."""
    events = []
    stack = list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        e = stack.pop()
        if e.tag == _EventType.Allocation and e.extra_fields.device.type == "cpu":
            events.append((e.start_time_ns, e.extra_fields.alloc_size))
        stack.extend(e.children)
    return sorted(events)


def running_bytes(events: Sequence[tuple[int, int]]) -> tuple[int, int]:
    """``(peak, end)`` of the running sum of ``events``' bytes from 0, in their order (peak >= 0)."""
    run = peak = 0
    for _t, n in events:
        run += n
        peak = max(peak, run)
    return peak, run


def _ranges(prof) -> dict[str, tuple[int, int]]:
    """The ``(start, end)`` ns of each of this module's ``record_function`` ranges, by name."""
    out = {}
    stack = list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        e = stack.pop()
        if e.name.startswith(_RANGE):
            out[e.name] = (e.start_time_ns, e.end_time_ns)
        else:
            stack.extend(e.children)
    return out


def transients(calls: Sequence[Callable[[], Callable[[], object]]], device: torch.device) -> list[tuple[int, int]]:
    """Per ``setup`` in ``calls`` (it prepares, unmeasured, and returns the call to measure):
    ``(peak, end)``, the call's peak of live allocated bytes and its bytes live at its end, both
    above the bytes live at its start. The call's result stays alive until its end is counted."""
    if device.type == "cuda":
        out = []
        for setup in calls:
            call = setup()
            torch.cuda.synchronize(device)
            base = torch.cuda.memory_allocated(device)
            torch.cuda.reset_peak_memory_stats(device)
            result = call()
            torch.cuda.synchronize(device)
            out.append((torch.cuda.max_memory_allocated(device) - base, torch.cuda.memory_allocated(device) - base))
            del result, call
        return out
    with quiet_stderr(), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        for i, setup in enumerate(calls):
            call = setup()
            with record_function(f"{_RANGE}:{i}"):
                result = call()
            del result, call
    events = cpu_allocations(prof)
    times = [t for t, _ in events]
    spans = _ranges(prof)
    out = []
    for i in range(len(calls)):
        start, end = spans[f"{_RANGE}:{i}"]
        inside = events[bisect.bisect_left(times, start) : bisect.bisect_right(times, end)]
        out.append(running_bytes(inside))
    return out


def workspace_bytes(mg: ModelGraph, env: dict, env_with_grad: dict, micro_batch_size: int, device) -> dict:
    """Per graph node id, its ``workspace_bytes`` (bytes per sample, module docstring) measured
    with the fx nodes' inputs of ``env`` (a forward of ``micro_batch_size`` samples);
    ``env_with_grad``: the same forward run with autograd, which tells which values need grad."""
    grad_of = needs_grad(env_with_grad)
    calls = []
    for node in mg.nodes:
        calls += [forward_setup(mg, node, env, grad_of), backward_setup(mg, node, env, grad_of)]
    measured = transients(calls, device)
    per_fx = {}
    for k, node in enumerate(mg.nodes):
        (fw_peak, fw_end), (bw_peak, _) = measured[2 * k], measured[2 * k + 1]
        per_fx[node] = max(fw_peak - max(fw_end, 0), bw_peak, 0)
    return {gid: max(per_fx[n] for n in members) / micro_batch_size for gid, members in mg.groups}
