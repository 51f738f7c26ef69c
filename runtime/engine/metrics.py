"""Per-rank timing records and the run summary rank 0 prints / writes.

Each rank records events (compute actions, waits, all-reduce, optimizer) with wall-clock
timestamps and, per step, the step's start/end and its busy (compute) time. Rank 0 gathers the
records and derives:

- samples/s after the warm-up steps: ``mini_batch_size * steps / (last step end - first timed
  step start)``, ends and starts taken over all ranks; ``seconds_per_step`` is that wall time divided by the
  timed steps: the throughput figure.
- ``step_seconds`` (``gpp_runtime.train``, one per step, warm-up included): each step's own span,
  from the first rank's start to the last rank's end. Ranks are not synchronised between steps:
  a rank whose stage finishes early starts the next step while others still finish this one, so
  consecutive spans overlap and their mean exceeds ``seconds_per_step`` by that overlap (12% and 22%
  on the examples' 2- and 3-rank CPU plans over 20 steps). Use ``step_seconds`` for one step's latency and
  its spread, ``seconds_per_step`` for throughput;
- bubble fraction per stage: ``1 - compute time / step wall time`` per rank, averaged over the
  timed steps and the stage's replicas (waiting for messages counts as idle);
- peak memory per rank: the measured peak (``gpp_runtime.engine.memory``: CUDA ``max_memory_allocated``,
  CPU the peak of the stage's live tensor bytes) beside the plan's prediction; on CPU also the
  runtime's count of bytes saved for backward (``saved_tensors_hooks``, parameters excluded) and
  the process's peak RSS;
- measured vs predicted stage time per sample (compute per step / mini_batch_size vs
  ``stages[].predicted``);
- a Chrome trace of all ranks (``pid`` = rank, timestamps in microseconds).
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass, field

from .memory import proc_kib


@dataclass
class Recorder:
    """Events and per-step figures of one rank."""

    rank: int
    stage: int
    events: list[tuple[str, float, float, str]] = field(default_factory=list)
    steps: list[tuple[int, float, float, float]] = field(default_factory=list)  # step, t0, t1, busy
    busy: float = 0.0

    def event(self, name: str, t0: float, t1: float, cat: str) -> None:
        self.events.append((name, t0, t1, cat))
        if cat == "compute":
            self.busy += t1 - t0

    def step_done(self, step: int, t0: float, t1: float) -> None:
        """Close a step: its compute time is what ``event`` accumulated since the last call."""
        self.steps.append((step, t0, t1, self.busy))
        self.busy = 0.0


def peak_rss_bytes() -> int:
    """The process's peak resident set size (VmHWM), 0 where /proc is unavailable."""
    return int(proc_kib("/proc/self/status", "VmHWM")) * 1024


def summarize(records: list[dict], stages: list[dict], mini_batch_size: int, warmup: int) -> dict:
    """Combine the gathered per-rank dicts into the run's metrics (see the module docstring:
    ``seconds_per_step`` is the timed steps' wall time over all ranks divided by their count, not
    the mean of the per-step spans, which overlap)."""
    timed = [[s for s in r["steps"] if s[0] >= min(x[0] for x in r["steps"]) + warmup] for r in records]
    out: dict = {"mini_batch_size": mini_batch_size, "warmup_steps": warmup}
    if all(timed) and timed[0]:
        t_start = min(s[1] for t in timed for s in t)
        t_end = max(s[2] for t in timed for s in t)
        n = len(timed[0])
        out["timed_steps"] = n
        out["seconds_per_step"] = (t_end - t_start) / n
        out["samples_per_second"] = mini_batch_size * n / (t_end - t_start) if t_end > t_start else None
    per_stage = []
    for st in stages:
        recs = [(r, t) for r, t in zip(records, timed) if r["stage"] == st["id"]]
        bubbles = [1 - s[3] / (s[2] - s[1]) for _r, t in recs for s in t if s[2] > s[1]]
        busy = [s[3] for _r, t in recs for s in t]
        row = {
            "stage": st["id"],
            "ranks": [r["rank"] for r, _ in recs],
            "bubble_fraction": statistics.mean(bubbles) if bubbles else None,
            "measured_time_per_sample": statistics.mean(busy) / mini_batch_size if busy else None,
            "predicted_time_per_sample": st.get("predicted_time_per_sample"),
            "peak_memory": {r["rank"]: r["memory"] for r, _ in recs},
        }
        per_stage.append(row)
    out["stages"] = per_stage
    out["losses"] = records[0].get("losses", [])
    return out


def chrome_trace(records: list[dict]) -> dict:
    """Merge every rank's events into one Chrome trace document."""
    t0 = min((e[1] for r in records for e in r["events"]), default=0.0)
    ev = []
    for r in records:
        ev.append(
            {
                "ph": "M",
                "name": "process_name",
                "pid": r["rank"],
                "args": {"name": f"rank {r['rank']} (stage {r['stage']})"},
            }
        )
        for name, a, b, cat in r["events"]:
            ev.append(
                {
                    "ph": "X",
                    "name": name,
                    "cat": cat,
                    "pid": r["rank"],
                    "tid": 0,
                    "ts": (a - t0) * 1e6,
                    "dur": max(0.0, (b - a) * 1e6),
                }
            )
    return {"traceEvents": ev, "displayTimeUnit": "ms"}


def format_summary(m: dict) -> str:
    """A few human-readable lines for rank 0's log."""
    lines = []
    if m.get("samples_per_second"):
        lines.append(
            f"throughput: {m['samples_per_second']:.1f} samples/s, "
            f"{m['seconds_per_step'] * 1e3:.2f} ms/step over {m['timed_steps']} steps "
            f"(after {m['warmup_steps']} warm-up)"
        )
    for s in m["stages"]:
        pred = s["predicted_time_per_sample"]
        meas = s["measured_time_per_sample"]
        mem = ", ".join(
            f"rank {k}: " + ", ".join(f"{n}={_size(v)}" for n, v in d.items() if v is not None)
            for k, d in s["peak_memory"].items()
        )
        lines.append(
            f"stage {s['stage']} ranks {s['ranks']}: bubble "
            + (f"{s['bubble_fraction']:.1%}" if s["bubble_fraction"] is not None else "n/a")
            + (f", measured {meas * 1e6:.1f} us/sample" if meas is not None else "")
            + (f", predicted {pred * 1e6:.1f} us/sample" if pred is not None else "")
            + f"; peak memory {mem}"
        )
    if m.get("losses"):
        lines.append(f"loss (mean per sample): first {m['losses'][0]:.6g}, last {m['losses'][-1]:.6g}")
    return "\n".join(lines)


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def write_json(path: str, doc: dict) -> None:
    with open(path, "w") as f:
        json.dump(doc, f, indent=1)
