"""Everything a rank prepares before joining the process group, identically on every rank.

Read the plan, build the workload (after ``torch.manual_seed(0)``, so every rank starts from the
same weights), trace the model, match the plan's node ids, cut this rank's stage module, find
each transferred value's per-sample shape and dtype (one forward pass in eval mode, no grad),
lower the orders to per-rank actions and dry-run them. Any problem is an ``InvalidInputError``
(exit code 2) raised before a single message is sent.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from gpp_solver.errors import InvalidInputError, InvalidPlanError
from runtime.actions import Action, TransferSpec, dry_run, lower
from runtime.checkpoint import fingerprint
from runtime.fx_graph import ModelGraph, load_workload, propagate, trace_workload
from runtime.fx_split import StageProgram, assign_nodes, build_stage, transfers
from runtime.plan_io import Plan, StagePlan, load_plan


@dataclass(frozen=True)
class RankSetup:
    """What one rank runs: its stage, replica index, module, actions and message metadata."""

    plan: Plan
    workload: object
    graph: ModelGraph
    stage: StagePlan
    replica: int
    program: StageProgram
    actions: dict[int, list[Action]]
    meta: dict[str, tuple[tuple[int, ...], torch.dtype]]
    fingerprint: str


def value_meta(mg: ModelGraph, workload, plan: Plan, values: set[str]) -> dict:
    """Per-sample shape and dtype of each transferred value, from a small eval-mode forward."""
    inputs, _ = workload.sample(plan.mini_batch_size, 0)
    rows = min(2, plan.mini_batch_size)
    inputs = tuple(x[:rows] for x in inputs)
    model = workload.model
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            env = propagate(mg, inputs)
    finally:
        model.train(was_training)
    meta = {}
    for n in mg.nodes:
        vid = mg.ids[n]
        if vid not in values:
            continue
        v = env[n]
        if not isinstance(v, torch.Tensor):
            raise InvalidPlanError(
                f"node {vid!r} crosses a stage boundary but its value is a {type(v).__name__}, "
                "not a tensor; put it in the stage of its consumer")
        if v.dim() == 0 or v.shape[0] != rows:
            raise InvalidPlanError(
                f"node {vid!r} crosses a stage boundary but its value (shape {tuple(v.shape)}) has "
                "no leading batch dimension")
        meta[vid] = (tuple(v.shape[1:]), v.dtype)
    return meta


def prepare(plan_path: str, model_spec: str, rank: int, world: int) -> RankSetup:
    """Build this rank's setup; InvalidInputError (exit 2) on any mismatch or deadlock."""
    plan = load_plan(plan_path)
    if plan.world_size != world:
        raise InvalidPlanError(
            f"the plan uses {plan.world_size} devices but {world} ranks were started "
            f"(torchrun --nproc-per-node {plan.world_size})")
    torch.manual_seed(0)
    wl = load_workload(model_spec)
    mg = trace_workload(wl)
    assign = assign_nodes(mg, plan)
    trs = transfers(mg, assign, plan)
    meta = value_meta(mg, wl, plan, {t.value for t in trs})
    specs = [TransferSpec(t.value, t.src, t.dst, t.index, grad=meta[t.value][1].is_floating_point)
             for t in trs]
    actions = lower(plan, specs)
    dry_run(plan, actions)
    stage = plan.stage_of_rank(rank)
    program = build_stage(mg, assign, stage.id)
    if not isinstance(program.module, torch.nn.Module):
        raise InvalidInputError(f"stage {stage.id} could not be built")
    return RankSetup(plan=plan, workload=wl, graph=mg, stage=stage,
                     replica=stage.devices.index(rank), program=program, actions=actions,
                     meta=meta, fingerprint=fingerprint(plan, mg))
