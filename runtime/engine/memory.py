"""One rank's peak memory in measured steps, the optimizer's state factor, and what a device
holds beside any stage (``runtime_memory``: the libraries' workspaces; ``host_available_memory``).

What is measured (never re-computed from the cost model):

- CUDA: ``torch.cuda.max_memory_allocated`` after ``torch.cuda.reset_peak_memory_stats`` at the
  start of the measured steps: every live tensor byte of the device (the caching allocator's
  allocated bytes; its reserve is not counted);
- CPU: the peak of live tensor bytes of the stage. At the start of the window the bytes the stage
  holds are counted from the real tensors (the stage's parameters, buffers, gradients and the
  state of every optimizer that stepped them, each storage once); during the window every
  allocation and free of the CPU allocator is recorded by ``torch.profiler`` (``profile_memory``)
  and the running sum of their bytes is added. The other stages' weights that the process keeps
  (each rank builds the whole model on CPU) are not the stage's and are not counted, as they would
  not be on its device. Profiling slows the step, so the window is one step by default (``steps``).

The window opens at the start of ``GraphPipeline.step`` number ``first`` (0-based; default 1: the
optimizer's state exists from the first optimizer step on, so step 1 is the steady state) and
closes right after the optimizer step that follows the last measured step (an optimizer that
steps the stage's parameters), else at the start of the next step or when the figures are read
(``GraphPipeline.memory_stats``): the optimizer step of the measured steps is inside it, and the
inputs the caller's loop makes for the next step (host data, which a GPU's memory does not hold)
are not.

Optimizer state factor (what the cost model's ``optimizer_state_factor`` counts): bytes of
weights + gradients + optimizer state per weight byte: SGD 2 (weights, gradients), SGD with
momentum 3 (+ momentum buffer), Adam / AdamW 4 (+ exp_avg, exp_avg_sq), 5 with ``amsgrad``
(+ max_exp_avg_sq). ``state_factor_of`` reads it from the optimizer's class and settings before
it has stepped (None for another optimizer: then only the measurement after its first step says).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch
from torch.profiler import ProfilerActivity, profile

from ..capture.workspace import cpu_allocations, quiet_stderr, running_bytes

_FACTORS = {
    torch.optim.SGD: lambda g: 3.0 if g.get("momentum", 0.0) else 2.0,
    torch.optim.Adam: lambda g: 5.0 if g.get("amsgrad") else 4.0,
    torch.optim.AdamW: lambda g: 5.0 if g.get("amsgrad") else 4.0,
}


def state_factor_of(optimizer: torch.optim.Optimizer) -> float | None:
    """Weights + gradients + state per weight byte that ``optimizer`` will hold (the largest over
        its parameter groups), from its class and settings, unsharded (a ``ShardedOptimizer``: the class it
    shards); None for an optimizer not listed above."""
    rule = _FACTORS.get(getattr(optimizer, "optimizer_class", type(optimizer)))  # a ShardedOptimizer's class
    if rule is None or not optimizer.param_groups:
        return None
    return max(rule(g) for g in optimizer.param_groups)


def storage_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """Bytes of the distinct storages behind ``tensors``."""
    seen: dict[int, int] = {}
    for t in tensors:
        if isinstance(t, torch.Tensor) and t.device.type != "meta":
            s = t.untyped_storage()
            seen[s.data_ptr()] = s.nbytes()
    return sum(seen.values())


def default_memory_step(warmup_steps: int) -> int:
    """The step whose peak is measured by default: a steady step (1 or later: the optimizer's state
    exists), early enough that neither it (on CPU, profiled and slower) nor the start of the next
    one (which processes its profile) is a timed step: ``warmup_steps - 2``, at least 1."""
    return max(1, warmup_steps - 2)


class MemoryMeter:
    """The peak of one rank over steps ``first .. first + steps - 1`` (see the module docstring)."""

    def __init__(self, device: torch.device, first: int | None = 1, steps: int = 1) -> None:
        self.device = device
        self.first = first
        self.steps = max(1, steps)
        self.peak: int | None = None
        self.measured_steps: list[int] = []
        self._open = False
        self._base = 0
        self._prof = None

    def step_starts(self, step: int, resident: Callable[[], Iterable[torch.Tensor]]) -> None:
        """Called at the start of every step: opens the window at ``first``, closes it after."""
        if self.first is None:
            return
        if self._open and step >= self.first + self.steps:
            self.close()
        if not self._open and self.peak is None and self.first <= step < self.first + self.steps:
            self._start(resident)
        if self._open:
            self.measured_steps.append(step)

    def _start(self, resident) -> None:
        self._open = True
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            return
        self._base = storage_bytes(resident())
        self._prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
        older = torch.empty(1)
        with quiet_stderr():
            self._prof.__enter__()
            # freeing a block allocated before the window (not counted: its size is unknown to the
            # profiler) prints the allocator's one-time notice about such blocks here, not mid-step
            del older

    @property
    def measuring(self) -> bool:
        """Whether the window is open."""
        return self._open

    def optimizer_stepped(self, step: int) -> None:
        """Called after an optimizer step of the stage that followed step ``step`` (0-based): after
        the last measured step's, the window closes there, so what the caller's loop does before
        the next step (making the next mini-batch's inputs: host data, not the stage's) is not
        counted; ``zero_grad`` only frees."""
        if self._open and step >= self.first + self.steps - 1:
            self.close()

    def close(self) -> None:
        """End the window (no-op when none is open) and keep its peak."""
        if not self._open:
            return
        self._open = False
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self.peak = int(torch.cuda.max_memory_allocated(self.device))
            return
        with quiet_stderr():
            self._prof.__exit__(None, None, None)
        self.peak = self._base + running_bytes(cpu_allocations(self._prof))[0]
        self._prof = None


def memory_warnings(ranks: list[dict], limit: float | None) -> list[str]:
    """One line per rank whose measured peak (``ranks``: ``memory_stats`` records) is above the
    device memory its plan was made for (``limit``, the cluster's ``memory_bytes``; None: unknown)
    or above 1.05x the cost model's prediction: which rank, and by how much."""
    out = []
    for r in sorted(ranks, key=lambda r: r["rank"]):
        peak, pred = r.get("peak_memory_bytes"), r.get("predicted_peak_memory_bytes")
        if not peak:
            continue
        where = f"rank {r['rank']} (stage {r['stage']}) measured a peak of {peak:,.0f} bytes"
        if limit is not None and peak > limit:
            out.append(
                f"{where}, {peak - limit:,.0f} bytes ({peak / limit - 1:.1%}) over the {limit:,.0f} bytes of "
                "device memory its plan was made for: on a device of that size this step runs out of memory"
            )
        elif pred and peak > 1.05 * pred:
            out.append(f"{where}, {peak / pred:.2f}x the {pred:,.0f} bytes the cost model predicted for its stage")
    return out


def runtime_memory(device: torch.device) -> float:
    """Bytes the libraries keep allocated on ``device`` once a model has trained, whatever the model:
    on CUDA, cuBLAS's workspaces (one per thread that multiplies: the training loop's and autograd's
    backward thread; PyTorch allocates them through its caching allocator, so a rank's
    ``max_memory_allocated`` counts them). Measured as what a linear layer's forward and backward
    leave allocated after ``torch._C._cuda_clearCublasWorkspaces()``; 0 on the CPU."""
    if device.type != "cuda":
        return 0.0
    clear = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
    torch.cuda.synchronize(device)
    if clear is not None:
        clear()
    before = torch.cuda.memory_allocated(device)
    lin = torch.nn.Linear(256, 256, device=device)
    x = torch.randn(64, 256, device=device, requires_grad=True)
    for _ in range(2):
        (lin(x) @ lin.weight).sum().backward()  # addmm and mm forward, mm in the backward thread
    del lin, x
    torch.cuda.synchronize(device)
    return float(max(0, torch.cuda.memory_allocated(device) - before))


def proc_kib(path: str, field: str) -> float:
    """The ``field:`` line of a /proc file in KiB (``MemAvailable`` of /proc/meminfo, ``VmHWM`` of
    /proc/self/status), 0 where unavailable."""
    try:
        with open(path) as f:
            for line in f:
                if line.startswith(field + ":"):
                    return float(line.split()[1])
    except OSError:
        pass
    return 0.0


def host_available_memory() -> float:
    """``MemAvailable`` of /proc/meminfo in bytes (0 where unavailable)."""
    return proc_kib("/proc/meminfo", "MemAvailable") * 1024
