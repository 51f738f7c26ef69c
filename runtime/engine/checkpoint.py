"""Per-stage checkpoints: parameters, optimizer state, step and a (plan, model) fingerprint.

Replica 0 of each stage writes ``DIR/stage{id}-step{N}.pt`` (``N`` = steps completed) through a
temporary name, ``fsync`` and ``os.replace`` (then an fsync of the directory), removes stale
temporaries of earlier crashed writers, and keeps its two newest files: a stage can run at most
one step ahead of another (the pipeline's messages tie them together), so the newest step that
every stage has is always on disk. ``--resume`` loads that step (``torch.load(weights_only=True)``),
checks its structure (a dict with ``step``, ``fingerprint``, ``params``, ``optimizer``; with
fp16, ``loss_scale``) and
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
from gpp_solver.types import Plan

from ..capture.fx_graph import ModelGraph

logger = logging.getLogger(__name__)

_NAME = re.compile(r"^stage(\d+)-step(\d+)\.pt$")
_TMP = re.compile(r"^stage(\d+)-step(\d+)\.pt\.tmp\d+$")


def fingerprint(plan: Plan, mg: ModelGraph) -> str:
    """SHA-256 of what a checkpoint depends on: the plan's stages and the model's structure."""
    doc = {
        "mini_batch_size": plan.mini_batch_size,
        "stages": [
            [s.id, list(s.nodes), list(s.devices), s.micro_batch_size] + ([s.zero] if s.zero else [])
            for s in plan.stages
        ],
        "graph": str(mg.gm.graph),
        "params": [[n, list(p.shape), str(p.dtype)] for n, p in mg.gm.named_parameters()],
    }
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()


def save(
    directory: str,
    stage_id: int,
    step: int,
    fp: str,
    params: dict,
    optimizer_state: dict,
    loss_scale: dict | None = None,
) -> str:
    """Write one stage's checkpoint after ``step`` completed steps; returns its path. ``loss_scale``:
    the fp16 loss scaler's state (``LossScaler.state_dict``), kept under ``loss_scale``."""
    os.makedirs(directory, exist_ok=True)
    for name in os.listdir(directory):  # temporaries of a writer that crashed
        m = _TMP.match(name)
        if m and int(m.group(1)) == stage_id:
            try:
                os.remove(os.path.join(directory, name))
            except OSError:
                pass
    state = {
        "step": step,
        "fingerprint": fp,
        "params": {k: v.detach().cpu() for k, v in params.items()},
        "optimizer": optimizer_state or {},
    }
    if loss_scale is not None:
        state["loss_scale"] = loss_scale
    path = os.path.join(directory, f"stage{stage_id}-step{step}.pt")
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    try:
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError:
        pass
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


def load(directory: str, stage_id: int, step: int, fp: str, device: torch.device) -> dict:
    """One stage's checkpoint, checked; InvalidInputError if unreadable, malformed or foreign."""
    path = os.path.join(directory, f"stage{stage_id}-step{step}.pt")
    try:
        state = torch.load(path, map_location=device, weights_only=True)
    except Exception as exc:  # noqa: BLE001 - unpickling errors of many kinds
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise InvalidInputError(f"cannot load checkpoint {path!r}: {first}") from exc
    if not isinstance(state, dict):
        raise InvalidInputError(f"checkpoint {path!r} holds a {type(state).__name__}, not a checkpoint dict")
    missing = [k for k in ("step", "fingerprint", "params", "optimizer") if k not in state]
    if missing:
        raise InvalidInputError(f"checkpoint {path!r} lacks {', '.join(missing)}")
    if not isinstance(state["params"], dict) or not all(isinstance(v, torch.Tensor) for v in state["params"].values()):
        raise InvalidInputError(f"checkpoint {path!r}: `params` must map names to tensors")
    if not isinstance(state["optimizer"], dict):
        raise InvalidInputError(f"checkpoint {path!r}: `optimizer` must be a dict")
    if state.get("fingerprint") != fp:
        raise InvalidInputError(
            f"checkpoint {path!r} was written for another plan or model (fingerprint mismatch); "
            "refusing to resume from it"
        )
    if state["step"] != step:
        raise InvalidInputError(f"checkpoint {path!r} says step {state['step']!r}, its name says {step}")
    return state
