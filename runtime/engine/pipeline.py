"""``GraphPipeline``: a gpp-plan/1 as a library object for the user's own training loop.

Under torchrun, every rank builds the same model (same seed, so the same weights) and calls::

    dist.init_process_group("gloo")                      # or "nccl"
    pipe = gpp_runtime.GraphPipeline(model, "plan.json", loss_fn, example_inputs=(x,))
    opt = pipe.optimizer(torch.optim.Adam, lr=1e-3)      # this rank's stage only (None: no parameters)
    for x, y in loader:                                  # the same mini-batches on every rank
        opt.zero_grad()
        loss = pipe.step(x, target=y)                    # a tensor on the sink's ranks, else None
        opt.step()                                       # fp16: pipe.scaler.step(opt); pipe.scaler.update()

Models that plain ``torch.fx`` cannot trace: pass ``tracing={"leaf_modules": (Block,)}`` (or
``concrete_args``, ``autowrap_functions``, ``tracer``, ``graph_module``; see ``gpp_runtime.capture.tracing``);
where fx fails, ``torch.export`` of ``example_inputs`` is tried.

Conventions:

- ``step(*inputs, target=...)`` takes the whole mini-batch (``plan.mini_batch_size`` rows) on
  every rank; each rank slices the samples its stage's chunks need. It runs the plan's schedule
  once, sums the gradients of data-parallel replicas (bucketed all-reduce; ``allreduce_overlap``:
  overlapping the last backward, the default on NCCL, or after it, the default on gloo, as the
  cost model prices it) and of tied weights, and returns the mini-batch loss on the ranks of the stage that
  holds the model's output (``None`` elsewhere), like ``torch.distributed.pipelining``.
- Loss: with ``loss_reduction="mean"`` (default) ``loss_fn(output, target)`` must return the mean
  over the samples it is given; with ``"sum"`` the sum. Either way the gradients after ``step``
  equal those of ``loss_fn(model(*inputs), target)`` on the whole mini-batch in one process. The
  first step checks the claim on the sink's first chunk (``gpp_runtime.engine.loss_check``: the
  loss of the chunk repeated twice must be equal for a mean, double for a sum, and follow from
  the losses of its two halves; on synthetic outputs of the same shape and dtype with a wide
  spread across rows, the loss of the rows must follow from those of two parts and of every
  single row) and, once the step is done, raises ``InvalidInputError`` on every rank naming
  ``loss_fn`` and the mismatch. A loss over the whole batch (a centering by the batch mean, a
  normalisation over the batch, in-batch negatives such as CLIP's contrastive loss) cannot be
  computed per micro-batch and is refused the same way, also on one-row micro-batches.
- Precision: ``precision="float32"`` (default), ``"bf16-autocast"``, ``"fp16-autocast"`` or
  ``"bf16-model"`` (``gpp_runtime.capture.precision``): each forward and the loss run under the
  precision's autocast, and values cross stages in the dtypes that forward produces (traced in it
  when the pipeline is built). Step the optimizer through ``pipe.scaler.step(opt)`` then
  ``pipe.scaler.update()`` on every rank (``opt`` None where a stage has no parameters): that is
  ``opt.step()``, except with fp16, where every rank unscales and all step or none does
  (``gpp_runtime.engine.loss_scale``). A ``torch.autocast`` of the caller's around ``step`` or the
  constructor is refused in one line (pass ``precision=`` instead).
- A non-finite loss is returned as it is: the caller judges it (``gpp_runtime.train`` stops).
- Gradients accumulate into ``.grad`` like plain autograd: zero them before each step.
- ``parameters()`` / ``named_parameters()`` / ``state_dict()`` are this rank's stage under the
  original model's qualified names (``text.0.weight``); a weight tied across stages keeps its
  first name in the model on every stage that holds a copy.
- Optimizer: ``pipe.optimizer(torch.optim.Adam, lr=...)`` builds this stage's and declares it; a
  stage whose plan shards the optimizer state over its replicas (``"zero": 1``) gets a
  ``ShardedOptimizer`` (``gpp_runtime.engine.zero``: each replica steps its part, then the parts
  are all-gathered; its ``state_dict()`` is a collective of the stage's replicas), and refuses an
  optimizer built over ``parameters()`` by hand.
- Memory: the planner's memory model charges ``optimizer_state_factor`` bytes per weight byte
  (weights + gradients + optimizer state: SGD 2, SGD with momentum 3, Adam 4; the cluster
  default 4.0). ``use_optimizer(opt)`` before the first step states at once when the optimizer's
  factor differs from the plan's (a larger one warns, ``strict_optimizer_state=True`` raises);
  without it the same check runs before the optimizer's first step, and after it the pipeline
  measures what the optimizer really holds.
- ``memory_stats()``: this rank's measured peak memory over step ``memory_step`` (0-based, default
  1; ``memory_steps`` steps from there; ``gpp_runtime.engine.memory`` says how CPU and CUDA measure)
  beside the plan's prediction for its stage under the optimizer really used. Read it after the
  measured step's ``optimizer.step()``. At the start of the step after the measured one every rank
  sends its record to rank 0, which warns of each rank whose peak is above the device memory of
  the constructor's ``cluster`` or above 1.05x its prediction, naming the rank and the excess.
- Dropout draws one reproducible stream per (seed, step, chunk, node) (``gpp_runtime.capture.dropout``).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import weakref

import torch
import torch.distributed as dist
from torch.optim.optimizer import register_optimizer_step_post_hook

from gpp_solver.cost import order_memory, stage_weight_bytes
from gpp_solver.errors import InvalidInputError
from gpp_solver.formats.cluster import as_cluster
from gpp_solver.formats.graph import as_graph

from ..capture.device_move import move_module
from ..capture.precision import precision as as_precision
from ..lowering.actions import group_actions
from ..lowering.posting import posting, send_releases
from .executor import StageExecutor
from .grad_sync import GradSync
from .loss_check import LossRefused
from .loss_scale import LossScaler
from .memory import MemoryMeter, memory_warnings, storage_bytes
from .metrics import Recorder
from .optimizer_state import OptimizerStateCheck
from .p2p import MODES, P2P, lower_transport_threads
from .stage_setup import build
from .zero import ShardedOptimizer

logger = logging.getLogger(__name__)


def _process_group() -> tuple[int, int, str]:
    """(rank, world size, backend) of the initialised default process group."""
    if not dist.is_available() or not dist.is_initialized():
        raise InvalidInputError(
            "GraphPipeline needs an initialised process group (torch.distributed.init_process_group under torchrun)"
        )
    return dist.get_rank(), dist.get_world_size(), dist.get_backend()


def _device_of(device, backend: str) -> torch.device:
    """The device given, else cuda:LOCAL_RANK with NCCL and the CPU with another backend."""
    if device is None:
        device = (
            torch.device(f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}") if backend == "nccl" else torch.device("cpu")
        )
    return torch.device(device)


def _refuse_autocast(device: torch.device, where: str) -> None:
    """InvalidInputError when a ``torch.autocast`` is on for ``device``'s type or the CPU: the
    pipeline runs its forwards in its own ``precision`` (an autocast around ``step`` would change
    the dtypes its values cross stages in, behind its back)."""
    for kind in dict.fromkeys((device.type, "cpu")):
        if torch.is_autocast_enabled(kind):
            dtype = str(torch.get_autocast_dtype(kind)).removeprefix("torch.")
            raise InvalidInputError(
                f"{where} ran under torch.autocast({kind!r}, dtype={dtype}): GraphPipeline runs each "
                "forward in its own precision; build it with precision='bf16-autocast' (or "
                "'fp16-autocast') and call step() outside torch.autocast"
            )


def _close_memory_window(ref):
    """An optimizer step post-hook (held weakly by the pipeline ``ref``): after an optimizer that
    steps the pipeline's parameters, ``MemoryMeter.optimizer_stepped`` for the step just run."""

    def hook(optimizer, _args, _kwargs):
        pipe = ref()
        if pipe is None or not pipe._steps_run or not pipe.memory.measuring:
            return
        mine = {id(p) for p in pipe.module.parameters()}
        if any(id(p) in mine for g in optimizer.param_groups for p in g["params"]):
            pipe.memory.optimizer_stepped(pipe._steps_run - 1)

    return hook


def _p2p_mode(p2p: str, backend: str) -> str:
    """The posting of sends/receives: ``auto`` is batched with NCCL, eager with another backend."""
    if p2p == "auto":
        p2p = "batched" if backend == "nccl" else "eager"
    if p2p not in MODES:
        raise InvalidInputError(f"p2p must be 'auto' or one of {MODES}, got {p2p!r}")
    return p2p


class GraphPipeline:
    """This rank's stage of a planned graph pipeline (see the module docstring)."""

    def __init__(
        self,
        model: torch.nn.Module,
        plan,
        loss_fn,
        example_inputs,
        device=None,
        *,
        loss_reduction: str = "mean",
        optimizer_state_factor: float | None = None,
        strict_optimizer_state: bool = False,
        seed: int = 0,
        p2p: str = "auto",
        lookahead: int = 2,
        timeout: float = 60.0,
        bucket_cap_mb: float = 25.0,
        tracing: dict | None = None,
        emulate_allreduce=None,
        allreduce_overlap: bool | None = None,
        memory_step: int | None = 1,
        memory_steps: int = 1,
        graph=None,
        cluster=None,
        precision: str = "float32",
        _setup=None,
    ) -> None:
        self.rank, world, backend = _process_group()
        self._backend = backend
        if loss_reduction not in ("mean", "sum"):
            raise InvalidInputError(f"loss_reduction must be 'mean' or 'sum', got {loss_reduction!r}")
        self.device = _device_of(device, backend)
        _refuse_autocast(self.device, "GraphPipeline()")
        self.precision = as_precision(precision)
        if _setup is not None and _setup.precision != self.precision:
            raise InvalidInputError(
                f"the setup was traced in precision {_setup.precision.name!r}, not {self.precision.name!r}"
            )
        p2p = _p2p_mode(p2p, backend)
        setup = _setup or build(
            plan,
            model,
            example_inputs,
            self.rank,
            world,
            p2p_mode=p2p,
            lookahead=lookahead,
            rendezvous=backend == "nccl",
            tracing=tracing,
            precision=self.precision,
        )
        self.setup = setup
        self.plan = setup.plan
        self.stage = setup.stage
        self.module = move_module(setup.program.module, self.device)  # its graph's baked-in devices too
        self.module.train()
        self.optimizer_state = OptimizerStateCheck(
            self.rank,
            self.module.parameters,
            optimizer_state_factor if optimizer_state_factor is not None else setup.optimizer_state_factor,
            strict_optimizer_state,
            shards=self.stage.data_parallel if self.stage.zero else 1,
        )
        self._graph = as_graph(graph) if graph is not None else None
        self._cluster = as_cluster(cluster) if cluster is not None else None
        self._steps_run = 0
        self._memory_checked = False
        self.memory = MemoryMeter(self.device, memory_step, memory_steps)
        self._memory_hook = register_optimizer_step_post_hook(_close_memory_window(weakref.ref(self)))
        self.rng_step = 0  # dropout stream position: steps run so far (restore it when resuming)
        self._local_to_name = self._original_names()
        dp_group, tied = self._groups()
        self.dp_group = dp_group  # this stage's data-parallel replicas (None: one)
        self._tied_params = [p for _g, ps in tied for p in ps]
        self.comm = P2P(self.device, timeout, p2p)
        self.rec = Recorder(rank=self.rank, stage=self.stage.id)
        overlap = backend == "nccl" if allreduce_overlap is None else bool(allreduce_overlap)
        self.grad_sync = self._make_grad_sync(dp_group, tied, bucket_cap_mb, emulate_allreduce, overlap)
        #: the pipeline's loss scale (fp16-autocast; disabled otherwise): ``gpp_runtime.engine.loss_scale``
        self.scaler = LossScaler(self.parameters, self.device, enabled=self.precision.scaled)
        self.sink_group = dp_group if setup.program.holds_sink else None
        self.executor = self._make_executor(loss_fn, loss_reduction, lookahead, seed)
        lower_transport_threads(backend)  # after the groups are made: each has its own thread
        dist.barrier()  # the first collective of the world group: every rank joins before any p2p

    def _original_names(self) -> dict[str, str]:
        """The stage module's parameter and buffer names -> their qualified names in the original model."""
        names = {}
        for n, t in list(self.module.named_parameters(remove_duplicate=False)) + list(
            self.module.named_buffers(remove_duplicate=False)
        ):
            names[n] = self.setup.names.get(id(t), n)
        return names

    def _groups(self):
        """Process groups, created on every rank in the same order: data-parallel, then tied."""
        dp_group = None
        for s in self.plan.stages:
            if len(s.devices) > 1:
                g = dist.new_group(list(s.devices))
                if s.id == self.stage.id:
                    dp_group = g
        by_name = dict(self.named_parameters())
        tied = []
        made: dict[tuple[int, ...], object] = {}
        for name, sids in self.setup.tied:
            ranks = tuple(sorted(r for s in self.plan.stages if s.id in sids for r in s.devices))
            if ranks not in made:
                made[ranks] = dist.new_group(list(ranks))
            if self.stage.id in sids:
                tied.append((made[ranks], [by_name[name]]))
        if tied:
            logger.info("weights tied across stages: %s", ", ".join(n for n, _ in self.setup.tied))
        return dp_group, tied

    def _make_grad_sync(self, dp_group, tied, bucket_cap_mb: float, emulate_allreduce, overlap: bool) -> GradSync:
        """The gradient sums of this stage: over its data-parallel replicas (bucketed) and over the
        stages that hold a copy of a tied weight."""
        params = [p for _n, p in self.named_parameters()]
        # emulated devices only (gpp_runtime.emulate): (plan, stage) -> seconds the all-reduce takes
        emulated = emulate_allreduce(self.plan, self.stage) if emulate_allreduce is not None else None
        return GradSync(
            params,
            dp_group,
            tied,
            self.comm,
            int(bucket_cap_mb * 2**20),
            self.rec,
            emulate_seconds=emulated,
            overlap=overlap,
            fold_last=self.setup.program.holds_sink,
        )

    def _make_executor(self, loss_fn, loss_reduction: str, lookahead: int, seed: int) -> StageExecutor:
        """The executor of this rank's actions of the plan's schedule."""
        return StageExecutor(
            self.setup.program,
            self.stage,
            self.setup.replica,
            self.rank,
            self.setup.actions[self.rank],
            self.setup.meta,
            loss_fn,
            self.plan.mini_batch_size,
            self.device,
            self.comm,
            self.rec,
            loss_reduction=loss_reduction,
            lookahead=lookahead,
            seed=seed,
            grad_sync=self.grad_sync,
            precision=self.precision,
            loss_scale=self.scaler.get_scale,
            releases=send_releases(
                {r: posting(group_actions(a), self.comm.mode, lookahead) for r, a in self.setup.actions.items()},
                self.rank,
            ),
        )

    # -- the user's API ------------------------------------------------------------------------
    def step(self, *inputs, target=None):
        """Run one mini-batch of the plan's schedule; the loss on the sink's ranks, else None.

        The loss is returned as computed, also when it is not finite (NaN or inf): judging it is
        the caller's (``gpp_runtime.train`` stops there). At the first step ``loss_fn`` is checked
        (the module docstring); a refusal raises ``InvalidInputError`` (``LossRefused``) on every
        rank once the step is done, the refusing rank's with the reason.
        """
        _refuse_autocast(self.device, "step()")
        inputs, target = self.precision.cast(tuple(inputs)), self.precision.cast(target)
        for i, x in enumerate(inputs):
            if isinstance(x, torch.Tensor) and x.shape[0] != self.plan.mini_batch_size:
                raise InvalidInputError(
                    f"step() input {i} has {x.shape[0]} rows but the plan's "
                    f"mini-batch size is {self.plan.mini_batch_size}"
                )
        if self.executor.program.holds_sink and target is None:
            raise InvalidInputError(f"rank {self.rank} holds the model's output: step() needs target=")
        self.memory.step_starts(self._steps_run, self._resident)
        if self.memory.peak is not None and not self._memory_checked:
            self._check_memory()
        loss = self.executor.run_step(inputs, target, self.rng_step)
        # each replica holds its samples' part of the loss: summed in the gradients' last
        # all-reduce where it can ride there, else on its own
        fold = loss is not None and self.sink_group is not None and self.grad_sync.can_fold(loss)
        self.grad_sync.finish(self.stage.id, extra=loss if fold else None)
        self.rng_step += 1
        self._steps_run += 1
        if loss is not None and self.sink_group is not None and not fold:
            dist.all_reduce(loss, group=self.sink_group)
        if self.executor.defer_refusal:
            self._agree_on_loss()
        return loss

    def _agree_on_loss(self) -> None:
        """After the first step, every rank learns whether a rank of the sink refused ``loss_fn``
        (one small all-reduce) and raises if one did: no rank waits on a peer that stopped."""
        ex = self.executor
        ex.defer_refusal = False  # a later refusal (a check not conclusive at the first step) raises at once
        world = dist.get_world_size()
        device = self.device if self._backend == "nccl" else torch.device("cpu")
        flag = torch.tensor([self.rank if ex.refusal else world], dtype=torch.int64, device=device)
        dist.all_reduce(flag, op=dist.ReduceOp.MIN)
        origin = int(flag.item())
        if origin < world:
            msg = ex.refusal or f"loss_fn was refused by rank {origin} at the first step (its error says why)"
            ex.refusal = None
            raise LossRefused(msg, origin)

    def named_parameters(self):
        """(qualified name in the original model, parameter) of this rank's stage, each once."""
        seen = set()
        for n, p in self.module.named_parameters(remove_duplicate=False):
            if id(p) not in seen:
                seen.add(id(p))
                yield self._local_to_name[n], p

    def optimizer(self, optimizer_class=torch.optim.Adam, **settings) -> torch.optim.Optimizer | None:
        """This stage's optimizer, declared (``use_optimizer``): ``optimizer_class(parameters(),
        **settings)``, or where the plan's stage shards the optimizer state over its replicas
        (``"zero": 1``) a ``ShardedOptimizer`` of that class over this replica's part
        (``gpp_runtime.engine.zero``); None for a stage without parameters."""
        params = list(self.parameters())
        if not params:
            return None
        if self.stage.zero:
            if self._tied_params:
                raise InvalidInputError(
                    f"stage {self.stage.id} holds a weight tied to another stage, whose copies must stay equal: "
                    "zero 1 (its optimizer state sharded) is not supported there; plan it with zero 0"
                )
            opt = ShardedOptimizer(params, optimizer_class, self.dp_group, **settings)
        else:
            opt = optimizer_class(params, **settings)
        self.use_optimizer(opt)
        return opt

    def use_optimizer(self, optimizer: torch.optim.Optimizer) -> float | None:
        """Declare the optimizer that steps this stage (``OptimizerStateCheck.use_optimizer``)."""
        return self.optimizer_state.use_optimizer(optimizer)

    @property
    def measured_state_factor(self) -> float | None:
        """Weights + gradients + optimizer state per weight byte, measured after the first step."""
        return self.optimizer_state.measured_state_factor

    def close(self) -> None:
        """Remove the optimizer hooks (the pipeline stays usable)."""
        self.optimizer_state.close()
        self._memory_hook.remove()

    def parameters(self):
        for _n, p in self.named_parameters():
            yield p

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Parameters and buffers of this rank's stage under the original model's names."""
        out = {}
        for n, t in self.module.state_dict(keep_vars=False).items():
            out.setdefault(self._local_to_name.get(n, n), t)
        return out

    def load_state_dict(self, state: dict, strict: bool = True) -> None:
        """Load what ``state_dict`` returned (names of the original model)."""
        want = {self._local_to_name.get(n, n) for n in self.module.state_dict()}
        missing, unexpected = want - set(state), set(state) - want
        if strict and (missing or unexpected):
            raise InvalidInputError(
                f"stage {self.stage.id} state: missing {sorted(missing)[:5]}, unexpected {sorted(unexpected)[:5]}"
            )
        local = {
            n: state[self._local_to_name.get(n, n)]
            for n in self.module.state_dict()
            if self._local_to_name.get(n, n) in state
        }
        self.module.load_state_dict(local, strict=strict)

    def train(self, mode: bool = True) -> GraphPipeline:
        self.module.train(mode)
        return self

    def eval(self) -> GraphPipeline:
        return self.train(False)

    # -- memory -------------------------------------------------------------------------------------
    def _resident(self):
        """The tensors this stage keeps between steps: parameters, buffers, gradients, optimizer state."""
        params = list(self.module.parameters())
        yield from params
        yield from self.module.buffers()
        yield from (p.grad for p in params if p.grad is not None)
        mine = {id(p) for p in params}
        for opt in self.optimizer_state.optimizers():
            if isinstance(opt, ShardedOptimizer):
                yield from opt.state_tensors()
                continue
            for p, st in opt.state.items():
                if id(p) in mine:
                    yield from (v for v in st.values() if isinstance(v, torch.Tensor))

    def predicted_peak_memory(self) -> float | None:
        """The cost model's memory of this rank's stage for the optimizer in use: with the
        constructor's ``graph`` and ``cluster``, ``order_memory`` of the plan's stage on that cluster
        with the optimizer's state factor; else the plan's ``memory_bytes + (used - planned factor) *
        W_S``, ``W_S`` the graph's weight bytes of the stage (without a graph: of its parameters and
        buffers); None when the plan states no memory for the stage (a plan written by hand)."""
        stage = self.plan.stage(self.stage.id)
        check = self.optimizer_state
        used = check.priced_factor()
        if self._graph is not None and self._cluster is not None:
            cluster = dataclasses.replace(self._cluster, optimizer_state_factor=used)
            return order_memory(self._graph, cluster, stage, stage.schedule.order, self.plan.stages)
        if stage.predicted.memory_bytes <= 0:
            return None
        if self._graph is not None:
            weights = stage_weight_bytes(self._graph, stage)
        else:
            weights = storage_bytes(list(self.module.parameters()) + list(self.module.buffers()))
        return stage.predicted.memory_bytes + (check.held(used) - check.held(check.plan_state_factor)) * weights

    def _check_memory(self) -> None:
        """Once the measured step has run (every rank closes its window at the same step): every
        rank's peak to rank 0, which warns of each rank above its plan's device memory (the
        constructor's ``cluster``) or above 1.05x the prediction (``memory.memory_warnings``)."""
        self._memory_checked = True
        stats = self.memory_stats()
        everyone = [None] * dist.get_world_size()
        dist.all_gather_object(everyone, stats)
        if self.rank == 0:
            limit = self._cluster.memory_bytes if self._cluster is not None else None
            for line in memory_warnings(everyone, limit):
                logger.warning("memory: %s", line)

    def memory_stats(self) -> dict:
        """``{"rank", "stage", "peak_memory_bytes", "predicted_peak_memory_bytes"}`` of this rank; the
        measured peak is None until the measured step has run (reading it ends the measurement)."""
        self.memory.close()
        return {
            "rank": self.rank,
            "stage": self.stage.id,
            "peak_memory_bytes": self.memory.peak,
            "predicted_peak_memory_bytes": self.predicted_peak_memory(),
        }
