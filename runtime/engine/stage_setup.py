"""Everything a rank prepares before its first message, identically on every rank.

Read the plan, trace the model, rewrite its dropout nodes (``runtime.capture.dropout``), match the
plan's node ids, validate the plan as ``gpp validate`` does (``runtime.lowering.plan_check``), cut every stage's module, find each transferred value's structure, per-sample
shapes and dtypes (one forward pass in eval mode, no grad, on the first rows of the example
inputs), find parameters shared by several stages (by tensor identity), lower the orders to
per-rank actions and prove them deadlock-free (``dry_run``, and ``check_rendezvous`` for the
posting NCCL uses). Any problem is an ``InvalidInputError`` (exit code 2) raised before a
single message is sent.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from gpp_solver.errors import DeadlockError, InvalidInputError, InvalidPlanError
from ..capture.dropout import per_chunk
from ..lowering.actions import Action, TransferSpec, dry_run, lower
from ..lowering.posting import check_rendezvous
from .checkpoint import fingerprint
from ..capture.fx_graph import ModelGraph, load_workload, propagate, restore_training, set_training, trace
from ..lowering.fx_split import StageProgram, assign_nodes, build_stage, transfers
from .p2p import ValueMeta, describe
from ..lowering.plan_check import check_plan
from ..lowering.plan_io import Plan, StagePlan, load_plan, parse_plan


@dataclass(frozen=True)
class RankSetup:
    """What one rank runs: its stage, replica index, module, actions and message metadata.

    ``names`` maps ``id(tensor)`` of every parameter and buffer of the model to its qualified
    name in the original model (the first name of a tied tensor); ``tied`` lists, per parameter
    used by more than one stage, its name and the ids of those stages.
    """

    plan: Plan
    graph: ModelGraph
    stage: StagePlan
    replica: int
    program: StageProgram
    actions: dict[int, list[Action]]
    meta: dict[str, ValueMeta]
    fingerprint: str
    names: dict[int, str]
    tied: tuple[tuple[str, tuple[int, ...]], ...]


def value_meta(mg: ModelGraph, example_inputs: tuple, plan: Plan, values: set[str]) -> dict[str, ValueMeta]:
    """Structure and per-sample shapes of each transferred value, from a small eval-mode forward."""
    rows = min(2, plan.mini_batch_size, *(int(x.shape[0]) for x in example_inputs))
    inputs = tuple(x[:rows] for x in example_inputs)
    modes = set_training(mg.gm, False)
    try:
        with torch.no_grad():
            env = propagate(mg, inputs)
    finally:
        restore_training(modes)
    return {mg.ids[n]: describe(env[n], rows, f"node {mg.ids[n]!r}") for n in mg.nodes if mg.ids[n] in values}


def load_plan_any(plan) -> Plan:
    """A Plan from a path, a parsed document or a Plan."""
    if isinstance(plan, Plan):
        return plan
    if isinstance(plan, dict):
        return parse_plan(plan)
    if isinstance(plan, str) or hasattr(plan, "__fspath__"):
        return load_plan(str(plan))
    raise InvalidPlanError(f"plan must be a path, a gpp-plan/1 dict or a Plan, not {type(plan).__name__}")


def _check_inputs(example_inputs, mg: ModelGraph) -> tuple:
    if isinstance(example_inputs, torch.Tensor):
        example_inputs = (example_inputs,)
    if not isinstance(example_inputs, (tuple, list)) or not all(
            isinstance(x, torch.Tensor) and x.dim() >= 1 for x in example_inputs):
        raise InvalidInputError("example_inputs must be a tuple of tensors with a leading batch dimension")
    if len(example_inputs) != len(mg.placeholders):
        raise InvalidInputError(f"the model's forward takes {len(mg.placeholders)} inputs but "
                                f"example_inputs has {len(example_inputs)}")
    return tuple(example_inputs)


def build(plan, model: torch.nn.Module, example_inputs, rank: int, world: int,
          p2p_mode: str = "eager", lookahead: int = 2, rendezvous: bool = False,
          graph_path: str | None = None, cluster_path: str | None = None,
          tracing: dict | None = None) -> RankSetup:
    """Build this rank's setup from a model; InvalidInputError (exit 2) on any mismatch or deadlock.

    The posting order is proved deadlock-free with rendezvous sends (``check_rendezvous``) in the
    ``batched`` mode and whenever ``rendezvous`` is set (NCCL).  ``tracing``: hooks of
    :func:`runtime.capture.tracing.trace_module` (``leaf_modules``, ``concrete_args``, ``tracer``, ...)."""
    plan = load_plan_any(plan)
    if plan.world_size != world:
        raise InvalidPlanError(
            f"the plan uses {_count(plan.world_size, 'device')} but {_count(world, 'rank')} "
            f"{'was' if world == 1 else 'were'} started "
            f"(torchrun --nproc-per-node {plan.world_size})")
    if isinstance(example_inputs, torch.Tensor):
        example_inputs = (example_inputs,)
    mg = trace(model, tuple(example_inputs) if isinstance(example_inputs, (tuple, list)) else None,
               **(tracing or {}))
    per_chunk(mg.gm, mg.ids)
    example_inputs = _check_inputs(example_inputs, mg)
    assign = assign_nodes(mg, plan)
    trs = transfers(mg, assign, plan)
    try:  # structure first; a deadlock is shown below with the runtime's own grid
        check_plan(plan, mg, graph_path, cluster_path)
        deadlock = None
    except DeadlockError as exc:
        deadlock = exc
    meta = value_meta(mg, example_inputs, plan, {t.value for t in trs})
    specs = [TransferSpec(t.value, t.src, t.dst, t.index, grad=meta[t.value].has_grad) for t in trs]
    actions = lower(plan, specs)
    dry_run(plan, actions)
    if deadlock is not None:  # gpp's simulator waits for whole micro-batches: it refuses more
        raise deadlock
    if p2p_mode == "batched" or rendezvous:
        check_rendezvous(plan, actions, p2p_mode, lookahead)
    stage = plan.stage_of_rank(rank)
    programs = {s.id: build_stage(mg, assign, s.id) for s in plan.stages}
    names = {id(t): n for n, t in model.named_parameters()}
    names.update({id(t): n for n, t in model.named_buffers() if id(t) not in names})
    users: dict[int, list[int]] = {}
    for sid, prog in programs.items():
        for p in prog.module.parameters():  # deduplicated within a stage
            users.setdefault(id(p), []).append(sid)
    tied = tuple((names.get(pid, "?"), tuple(sids)) for pid, sids in users.items() if len(sids) > 1)
    tied = tuple(sorted(tied))
    return RankSetup(plan=plan, graph=mg, stage=stage, replica=stage.devices.index(rank),
                     program=programs[stage.id], actions=actions, meta=meta,
                     fingerprint=fingerprint(plan, mg), names=names, tied=tied)


def _count(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def prepare(plan_path: str, model_spec: str, rank: int, world: int):
    """Load the plan and a workload module (after ``torch.manual_seed(0)``, so every rank starts
    from the same weights); returns (plan, workload). InvalidInputError (exit 2) on bad input."""
    plan = load_plan(plan_path)
    if plan.world_size != world:
        raise InvalidPlanError(
            f"the plan uses {_count(plan.world_size, 'device')} but {_count(world, 'rank')} "
            f"{'was' if world == 1 else 'were'} started "
            f"(torchrun --nproc-per-node {plan.world_size})")
    torch.manual_seed(0)
    return plan, load_workload(model_spec)
