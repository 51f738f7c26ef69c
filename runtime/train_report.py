"""Rank 0's report of a finished ``runtime.train`` run: every rank's record (step times, memory,
trace events, losses) and stage parameters gathered, the metrics summary, and the ``--json`` line.

``runtime.train``'s module docstring says what each field of the ``--json`` line means; its
names (``JSON_FIELDS``) are a contract read from outside.
"""

from __future__ import annotations

import dataclasses
import json

import torch
import torch.distributed as dist

from .engine import metrics
from .engine.pipeline import GraphPipeline
from .lowering.plan_io import predicted_time_per_sample

#: the fields of the ``{"gpp_runtime": {...}}`` line ``--json`` prints, in order
JSON_FIELDS = (
    "mini_batch_size",
    "warmup_steps",
    "timed_steps",
    "seconds_per_step",
    "samples_per_second",
    "step_seconds",
    "losses",
    "predicted_iteration_seconds",
    "ranks",
)


@dataclasses.dataclass(frozen=True)
class Gathered:
    """What rank 0 holds after the gather."""

    #: one record per rank, in rank order (``rank_record``)
    records: list[dict]
    #: every stage's parameters under the original model's names (replica 0 of each stage)
    params: dict[str, torch.Tensor]
    #: names of tied weights whose copies differ across stages
    tied_mismatch: list[str]


def rank_record(pipe: GraphPipeline, rank: int, device: torch.device, losses: list[float], events: bool) -> dict:
    """This rank's steps, memory (measured and predicted), trace events (when ``events``) and,
    on the sink's ranks, the per-step losses."""
    setup, rec = pipe.setup, pipe.rec
    stats = pipe.memory_stats()
    mem = {"peak": stats["peak_memory_bytes"], "predicted": stats["predicted_peak_memory_bytes"]}
    if device.type != "cuda":
        mem.update(saved_activations=pipe.executor.saved_peak, rss=metrics.peak_rss_bytes())
    return {
        "rank": rank,
        "stage": setup.stage.id,
        "steps": rec.steps,
        "memory": mem,
        "memory_stats": stats,
        "events": rec.events if events else [],
        "losses": losses if setup.program.holds_sink else None,
    }


def gather(pipe: GraphPipeline, rank: int, device: torch.device, losses: list[float], events: bool) -> Gathered | None:
    """Every rank's record and parameters on rank 0 (a collective: every rank calls it); None on
    the other ranks."""
    mine = rank_record(pipe, rank, device, losses, events)
    params = {k: v.detach().cpu() for k, v in pipe.named_parameters()} if pipe.setup.replica == 0 else {}
    gathered = [None] * dist.get_world_size() if rank == 0 else None
    dist.gather_object((mine, params), gathered, dst=0)
    dist.barrier()  # every transfer of the gather is done before any rank tears down its group
    if rank != 0:
        return None
    all_params: dict[str, torch.Tensor] = {}
    tied_bad = []
    for g in gathered:
        for k, v in g[1].items():
            if k in all_params and not torch.equal(all_params[k], v):
                tied_bad.append(k)
            all_params.setdefault(k, v)
    return Gathered(records=[g[0] for g in gathered], params=all_params, tied_mismatch=tied_bad)


def summarize(records: list[dict], plan, warmup_steps: int, first_step: int) -> dict:
    """The metrics summary (``runtime.engine.metrics.summarize``) with the losses, the first step
    run, the plan's predicted iteration time, every rank's memory and each step's seconds; ``{}``
    when no step ran."""
    if not records[0]["steps"]:
        return {}
    stages = [{"id": s.id, "predicted_time_per_sample": predicted_time_per_sample(s)} for s in plan.stages]
    m = metrics.summarize(records, stages, plan.mini_batch_size, warmup_steps)
    m["losses"] = next((r["losses"] for r in records if r["losses"] is not None), [])
    m["first_step"] = first_step
    m["predicted_iteration_seconds"] = plan.predicted.iteration_time
    m["ranks"] = sorted((r["memory_stats"] for r in records), key=lambda x: x["rank"])
    m["step_seconds"] = step_seconds(records)
    return m


def step_seconds(records: list[dict]) -> list[float]:
    """Each step's span over all ranks, the first rank's start to the last rank's end; spans of
    consecutive steps overlap (``runtime.train``'s module docstring)."""
    by_step: dict[int, list] = {}
    for r in records:
        for st, t0, t1, _busy in r["steps"]:
            by_step.setdefault(st, []).append((t0, t1))
    return [max(e for _s, e in v) - min(s for s, _e in v) for _k, v in sorted(by_step.items())]


def json_line(m: dict) -> str:
    """The ``--json`` line: ``{"gpp_runtime": {...}}`` with the ``JSON_FIELDS`` of summary ``m``."""
    return json.dumps({"gpp_runtime": {k: m.get(k) for k in JSON_FIELDS}})
