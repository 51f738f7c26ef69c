"""Per-stage checkpoints: parameters, optimizer state, step and a (plan, model) fingerprint.

Replica 0 of each stage writes ``DIR/stage{id}-step{N}.pt`` (``N`` = steps completed) through a
temporary name and ``os.replace``, and keeps its two newest files: a stage can run at most one
step ahead of another (the pipeline's messages tie them together), so the newest step that every
stage has is always on disk. ``--resume`` loads that step (``torch.load(weights_only=True)``) and
refuses a checkpoint whose fingerprint differs from the current plan and model.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re

import torch

from gpp_solver.errors import InvalidInputError
from runtime.fx_graph import ModelGraph
from runtime.plan_io import Plan

logger = logging.getLogger(__name__)

_NAME = re.compile(r"^stage(\d+)-step(\d+)\.pt$")


def fingerprint(plan: Plan, mg: ModelGraph) -> str:
    """SHA-256 of what a checkpoint depends on: the plan's stages and the model's structure."""
    doc = {
        "mini_batch_size": plan.mini_batch_size,
        "stages": [[s.id, list(s.nodes), list(s.devices), s.micro_batch_size] for s in plan.stages],
        "graph": str(mg.gm.graph),
        "params": [[n, list(p.shape), str(p.dtype)] for n, p in mg.gm.named_parameters()],
    }
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()


def save(directory: str, stage_id: int, step: int, fp: str, module: torch.nn.Module,
         optimizer: torch.optim.Optimizer | None) -> str:
    """Write one stage's checkpoint after ``step`` completed steps; returns its path."""
    os.makedirs(directory, exist_ok=True)
    state = {"step": step, "fingerprint": fp,
             "params": {k: v.detach().cpu() for k, v in module.state_dict().items()},
             "optimizer": optimizer.state_dict() if optimizer is not None else {}}
    path = os.path.join(directory, f"stage{stage_id}-step{step}.pt")
    tmp = f"{path}.tmp{os.getpid()}"
    torch.save(state, tmp)
    os.replace(tmp, path)
    for old in _steps(directory).get(stage_id, [])[:-2]:
        try:
            os.remove(os.path.join(directory, f"stage{stage_id}-step{old}.pt"))
        except OSError:
            pass
    return path


def _steps(directory: str) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    if not os.path.isdir(directory):
        return out
    for name in os.listdir(directory):
        m = _NAME.match(name)
        if m:
            out.setdefault(int(m.group(1)), []).append(int(m.group(2)))
    return {k: sorted(v) for k, v in out.items()}


def latest_common_step(directory: str, stage_ids: list[int]) -> int | None:
    """The newest step for which every stage has a checkpoint, or None."""
    steps = _steps(directory)
    common = None
    for sid in stage_ids:
        have = set(steps.get(sid, []))
        common = have if common is None else common & have
    return max(common) if common else None


def load(directory: str, stage_id: int, step: int, fp: str, module: torch.nn.Module,
         optimizer: torch.optim.Optimizer | None, device: torch.device) -> None:
    """Restore one stage; InvalidInputError if the checkpoint is from another plan or model."""
    path = os.path.join(directory, f"stage{stage_id}-step{step}.pt")
    try:
        state = torch.load(path, map_location=device, weights_only=True)
    except Exception as exc:  # noqa: BLE001 - unpickling errors of many kinds
        raise InvalidInputError(f"cannot load checkpoint {path!r}: {exc}") from exc
    if state.get("fingerprint") != fp:
        raise InvalidInputError(
            f"checkpoint {path!r} was written for another plan or model (fingerprint mismatch); "
            "refusing to resume from it")
    module.load_state_dict(state["params"])
    if optimizer is not None and state["optimizer"]:
        optimizer.load_state_dict(state["optimizer"])
