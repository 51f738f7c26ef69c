"""Everything a rank prepares before its first message, identically on every rank.

Read the plan, trace the model, rewrite its dropout nodes (``gpp_runtime.capture.dropout``), match the
plan's node ids, validate the plan as ``gpp validate`` does (``gpp_runtime.lowering.plan_check``), cut every stage's module, find each transferred value's structure, per-sample
shapes and dtypes (one forward pass in eval mode, in the pipeline's precision, on the first rows of the example
inputs), find parameters shared by several stages (by tensor identity), lower the orders to
per-rank actions and prove them deadlock-free (``dry_run``, and ``check_rendezvous`` for the
posting NCCL uses). Any problem is an ``InvalidInputError`` (exit code 2) raised before a
single message is sent. The workload as training runs it (:class:`TrainWorkload`: the dtype
applied, the loss as the mean over the mini-batch) is prepared here too.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
import torch.utils._pytree as pytree

from gpp_solver.errors import DeadlockError, InvalidInputError
from gpp_solver.formats.cluster import load_cluster
from gpp_solver.formats.graph import load_graph
from gpp_solver.types import Plan, Stage

from ..capture.dropout import per_chunk
from ..capture.fx_graph import ModelGraph, load_workload, propagate, restore_training, set_training, trace
from ..capture.precision import Precision
from ..capture.precision import precision as as_precision
from ..lowering.actions import RankAction, TransferSpec, dry_run, lower
from ..lowering.fx_split import StageProgram, assign_nodes, build_stage, transfers
from ..lowering.plan_check import check_plan, check_world
from ..lowering.plan_io import optimizer_state_factor, read_plan, stage_of_rank
from ..lowering.posting import check_rendezvous
from .checkpoint import fingerprint
from .p2p import ValueMeta, describe


@dataclass(frozen=True)
class RankSetup:
    """What one rank runs: its stage, replica index, module, actions and message metadata.

    ``names`` maps ``id(tensor)`` of every parameter and buffer of the model to its qualified
    name in the original model (the first name of a tied tensor); ``tied`` lists, per parameter
    used by more than one stage, its name and the ids of those stages.
    """

    plan: Plan
    graph: ModelGraph
    stage: Stage
    replica: int
    program: StageProgram
    actions: dict[int, list[RankAction]]
    meta: dict[str, ValueMeta]
    fingerprint: str
    names: dict[int, str]
    tied: tuple[tuple[str, tuple[int, ...]], ...]
    #: the plan's recorded optimizer_state_factor, else ``--cluster``'s, else 4.0
    optimizer_state_factor: float
    #: the precision the value dtypes were traced in (``gpp_runtime.capture.precision``)
    precision: Precision


def value_meta(
    mg: ModelGraph, example_inputs: tuple, plan: Plan, values: set[str], prec: Precision | None = None
) -> dict[str, ValueMeta]:
    """Structure, per-sample shapes and dtypes of each transferred value, from a small eval-mode
    forward in the precision the pipeline trains in (under its autocast: the dtypes it sends).
    Gradients stay enabled: modules with an inference fast path (``nn.TransformerEncoderLayer``
    in eval mode without grad) return other dtypes under autocast than the path training takes."""
    rows = min(2, plan.mini_batch_size, *(int(x.shape[0]) for x in example_inputs))
    inputs = tuple(x[:rows] for x in example_inputs)
    modes = set_training(mg.gm, False)
    ctx = prec.forward(inputs[0].device) if prec is not None and inputs else contextlib.nullcontext()
    try:
        with torch.enable_grad(), ctx:
            env = propagate(mg, inputs)
    finally:
        restore_training(modes)
    return {mg.ids[n]: describe(env[n], rows, f"node {mg.ids[n]!r}") for n in mg.nodes if mg.ids[n] in values}


def _check_inputs(example_inputs, mg: ModelGraph) -> tuple:
    if isinstance(example_inputs, torch.Tensor):
        example_inputs = (example_inputs,)
    if not isinstance(example_inputs, (tuple, list)) or not all(
        isinstance(x, torch.Tensor) and x.dim() >= 1 for x in example_inputs
    ):
        raise InvalidInputError("example_inputs must be a tuple of tensors with a leading batch dimension")
    if len(example_inputs) != len(mg.placeholders):
        raise InvalidInputError(
            f"the model's forward takes {len(mg.placeholders)} inputs but example_inputs has {len(example_inputs)}"
        )
    return tuple(example_inputs)


def build(
    plan,
    model: torch.nn.Module,
    example_inputs,
    rank: int,
    world: int,
    p2p_mode: str = "eager",
    lookahead: int = 2,
    rendezvous: bool = False,
    graph_path: str | None = None,
    cluster_path: str | None = None,
    tracing: dict | None = None,
    precision: str | Precision | None = None,
) -> RankSetup:
    """Build this rank's setup from a model; InvalidInputError (exit 2) on any mismatch or deadlock.

    ``plan``: a path, a gpp-plan/1 document or a :class:`Plan`. The posting order is proved
    deadlock-free with rendezvous sends (``check_rendezvous``) in the ``batched`` mode and
    whenever ``rendezvous`` is set (NCCL).  ``tracing``: hooks of
    :func:`gpp_runtime.capture.tracing.trace_module` (``leaf_modules``, ``concrete_args``, ``tracer``, ...).
    ``precision`` (``gpp_runtime.capture.precision``): a ``bf16-model`` casts ``model`` (in place)
    and the example inputs; the dtypes of transferred values are traced in it."""
    prec = as_precision(precision)
    plan = read_plan(plan)
    check_world(plan, world)
    graph = load_graph(graph_path) if graph_path else None
    cluster = load_cluster(cluster_path) if cluster_path else None
    mg, example_inputs = _trace(prec.cast_model(model), prec.cast(example_inputs), tracing)
    assign = assign_nodes(mg, plan)
    deadlock = _validate(plan, mg, graph, cluster)
    trs = transfers(mg, assign, plan)
    meta = value_meta(mg, example_inputs, plan, {t.value for t in trs}, prec)
    specs = [TransferSpec(t.value, t.src, t.dst, t.index, grad=meta[t.value].has_grad) for t in trs]
    actions = lower(plan, specs)
    dry_run(plan, actions)
    if deadlock is not None:  # gpp's simulator waits for whole micro-batches: it refuses more
        raise deadlock
    if p2p_mode == "batched" or rendezvous:
        check_rendezvous(plan, actions, p2p_mode, lookahead)
    stage = stage_of_rank(plan, rank)
    programs = {s.id: build_stage(mg, assign, s.id) for s in plan.stages}
    names, tied = _parameter_names(model, programs)
    return RankSetup(
        plan=plan,
        graph=mg,
        stage=stage,
        replica=stage.devices.index(rank),
        program=programs[stage.id],
        actions=actions,
        meta=meta,
        fingerprint=fingerprint(plan, mg),
        names=names,
        tied=tied,
        optimizer_state_factor=optimizer_state_factor(
            plan, cluster.optimizer_state_factor if cluster is not None else None
        ),
        precision=prec,
    )


def _trace(model: torch.nn.Module, example_inputs, tracing: dict | None) -> tuple[ModelGraph, tuple]:
    """The traced model with per-chunk dropout, and the example inputs checked against it."""
    if isinstance(example_inputs, torch.Tensor):
        example_inputs = (example_inputs,)
    mg = trace(model, tuple(example_inputs) if isinstance(example_inputs, (tuple, list)) else None, **(tracing or {}))
    per_chunk(mg.gm, mg.ids)
    return mg, _check_inputs(example_inputs, mg)


def _validate(plan: Plan, mg: ModelGraph, graph, cluster) -> DeadlockError | None:
    """``gpp validate``'s checks; a deadlock is returned, to be shown with the runtime's own grid
    once the runtime's dry run has had its say."""
    try:
        check_plan(plan, mg, graph, cluster)
    except DeadlockError as exc:
        return exc
    return None


def _parameter_names(model: torch.nn.Module, programs: dict[int, StageProgram]):
    """Qualified name of every parameter and buffer by ``id``, and the parameters several stages use."""
    names = {id(t): n for n, t in model.named_parameters()}
    names.update({id(t): n for n, t in model.named_buffers() if id(t) not in names})
    users: dict[int, list[int]] = {}
    for sid, prog in programs.items():
        for p in prog.module.parameters():  # deduplicated within a stage
            users.setdefault(id(p), []).append(sid)
    tied = tuple(sorted((names.get(pid, "?"), tuple(sids)) for pid, sids in users.items() if len(sids) > 1))
    return names, tied


def prepare(plan_path: str, model_spec: str):
    """Read the plan and load the workload (:func:`seeded_workload`); returns (plan, workload).
    InvalidInputError (exit 2) on bad input; the world size is checked by :func:`build`."""
    return read_plan(plan_path), seeded_workload(model_spec)


def seeded_workload(model_spec: str):
    """The workload ``MODULE:FUNCTION`` made after ``torch.manual_seed(0)``, so every rank (and the
    one-process reference of ``--verify``) starts from the same weights."""
    torch.manual_seed(0)
    return load_workload(model_spec)


class TrainWorkload:
    """The workload with the dtype applied; ``loss`` is the workload's mean loss as is, or its
    summed loss divided by the mini-batch size (so gradients are those of the mean)."""

    def __init__(self, wl, dtype, mini_batch_size: int) -> None:
        self.model = wl.model.to(dtype) if dtype is not None else wl.model
        self._wl, self._dtype, self.mini_batch_size = wl, dtype, mini_batch_size
        self.raw = wl
        self.reduction = getattr(wl, "loss_reduction", "sum")
        self.emulate_allreduce = getattr(wl, "emulate_allreduce", None)  # gpp_runtime.emulate only
        if self.reduction not in ("sum", "mean"):
            raise InvalidInputError(f"the workload's loss_reduction must be 'sum' or 'mean', got {self.reduction!r}")

    def sample(self, rows: int, step: int):
        inputs, target = self._wl.sample(rows, step)
        if self._dtype is None:
            return tuple(inputs), target
        cast = lambda t: t.to(self._dtype) if isinstance(t, torch.Tensor) and t.is_floating_point() else t  # noqa: E731
        return tuple(cast(x) for x in inputs), pytree.tree_map(cast, target)

    def loss(self, output, target):
        loss = self._wl.loss(output, target)
        return loss if self.reduction == "mean" else loss / self.mini_batch_size
