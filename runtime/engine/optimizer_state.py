"""The optimizer-state check of a ``GraphPipeline`` stage (``GraphPipeline.optimizer_state``).

The plan's memory figures assume ``optimizer_state_factor`` bytes of weights + gradients +
optimizer state per weight byte. The optimizer that really steps the stage is compared with that
factor twice: when it is declared (``use_optimizer``, else just before its first step), from its
class and settings (``memory.state_factor_of``); and after its first step (``check_optimizer``),
from the state it really holds. A larger factor warns, or raises ``InvalidInputError`` with
``strict_optimizer_state``; a smaller one says that the plan priced more optimizer state than this optimizer holds.
"""

from __future__ import annotations

import logging
import weakref

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

from gpp_solver.errors import InvalidInputError

from .memory import state_factor_of
from .zero import ShardedOptimizer

logger = logging.getLogger(__name__)


def _tensor_bytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


class OptimizerStateCheck:
    """The optimizer-state accounting of one rank's stage (a ``GraphPipeline`` holds one):
    ``parameters`` returns the stage's parameters; the hooks it registers hold it weakly."""

    def __init__(self, rank: int, parameters, optimizer_state_factor: float, strict: bool, shards: int = 1) -> None:
        self.rank = rank
        self.shards = shards  # the replicas the stage's optimizer state is sharded over (zero 1), else 1
        self.parameters = parameters
        # the factor the plan's memory figures assume: given, else the plan's record (or 4.0)
        self.optimizer_state_factor = optimizer_state_factor
        self.strict_optimizer_state = strict
        self.measured_state_factor: float | None = None
        self.used_state_factor: float | None = None  # of the optimizer in use, once known
        self._optimizers: list = []  # weak references to the optimizers that step this stage
        # every optimizer that steps this stage's parameters is declared before its first step and
        # measured after it
        self._hook = register_optimizer_step_post_hook(_make_state_check(weakref.ref(self)))
        self._pre_hook = register_optimizer_step_pre_hook(_make_first_use(weakref.ref(self)))

    def optimizers(self):
        """The optimizers seen stepping this stage (still alive)."""
        return [opt for ref in self._optimizers if (opt := ref()) is not None]

    def close(self) -> None:
        """Remove the optimizer hooks."""
        self._hook.remove()
        self._pre_hook.remove()

    @property
    def plan_state_factor(self) -> float:
        """The optimizer_state_factor the plan was priced with (the constructor's, else the plan's record)."""
        return float(self.optimizer_state_factor)

    def held(self, factor: float) -> float:
        """Bytes per weight byte a replica holds with an optimizer of unsharded ``factor``: the
        factor itself, or with the state sharded over the stage's replicas ``2 + (factor - 2) / d``."""
        return factor if self.shards == 1 else 2.0 + max(factor - 2.0, 0.0) / self.shards

    def priced_factor(self) -> float:
        """The unsharded optimizer_state_factor of the optimizer in use, for the cost model: from
        its class, else from its measured state (unsharded), else the plan's."""
        if self.used_state_factor is not None:
            return self.used_state_factor
        if self.measured_state_factor is not None:
            return 2.0 + (self.measured_state_factor - 2.0) * self.shards
        return self.plan_state_factor

    def _is_inner(self, optimizer) -> bool:
        """Whether ``optimizer`` is the part's optimizer of a ``ShardedOptimizer`` already declared."""
        return any(isinstance(o, ShardedOptimizer) and o.inner is optimizer for o in self.optimizers())

    def use_optimizer(self, optimizer: torch.optim.Optimizer) -> float | None:
        """Declare the optimizer that steps this stage; states at once (warns when larger, raises
        with ``strict_optimizer_state``) when its state factor differs from the plan's. A stage
        whose plan shards the optimizer state (zero 1) takes a ``ShardedOptimizer`` only
        (``GraphPipeline.optimizer`` builds it)."""
        if any(r() is optimizer for r in self._optimizers) or self._is_inner(optimizer):
            return self.used_state_factor
        if self.shards > 1 and not isinstance(optimizer, ShardedOptimizer):
            raise InvalidInputError(
                f"rank {self.rank}: the plan shards this stage's optimizer state over its {self.shards} replicas "
                f"(zero 1) but a {type(optimizer).__name__} over the whole stage steps it; build it with "
                f"pipe.optimizer(torch.optim.{type(optimizer).__name__}, ...)"
            )
        self._optimizers.append(weakref.ref(optimizer))
        factor = state_factor_of(optimizer)
        if factor is None:
            return None
        self.used_state_factor = factor
        planned = self.plan_state_factor
        if factor > planned * 1.01:
            msg = (
                f"{type(optimizer).__name__} holds {factor:g} bytes of weights, gradients and state per "
                f"weight byte but the plan was priced with optimizer_state_factor={planned:g}: the plan "
                f"may not fit device memory; plan again with optimizer_state_factor {factor:g}"
            )
            if self.strict_optimizer_state:
                raise InvalidInputError(msg)
            if self.rank == 0:
                logger.warning("%s", msg)
        elif factor < planned * 0.99 and self.rank == 0:
            logger.info(
                "%s holds %g bytes of weights, gradients and state per weight byte, the plan "
                "assumed optimizer_state_factor %g: the plan priced more optimizer state than it holds",
                type(optimizer).__name__,
                factor,
                planned,
            )
        return factor

    def check_optimizer(self, optimizer: torch.optim.Optimizer) -> float | None:
        """Bytes of weights + gradients + optimizer state per weight byte on this stage; warns
        (or raises, strict) when above the factor the plan assumed. None without parameters."""
        mine = {id(p): p for p in self.parameters()}
        weights = sum(_tensor_bytes(p) for p in mine.values())
        if not weights:
            return None
        state = 0
        if isinstance(optimizer, ShardedOptimizer):
            state = optimizer.state_bytes()
        else:
            for group in optimizer.param_groups:
                for p in group["params"]:
                    if id(p) in mine:
                        state += sum(
                            _tensor_bytes(v)
                            for v in optimizer.state.get(p, {}).values()
                            if isinstance(v, torch.Tensor) and v.dim() > 0
                        )
        grads = sum(_tensor_bytes(p) for p in mine.values())
        factor = (weights + grads + state) / weights
        self.measured_state_factor = factor
        used = self.used_state_factor
        if used is not None and abs(factor - self.held(used)) <= 0.01 * factor:
            return factor  # as stated before the first step (use_optimizer)
        planned = self.held(self.plan_state_factor)
        if factor > planned * 1.01:
            msg = (
                f"rank {self.rank}: {type(optimizer).__name__} holds {factor:.2f} bytes of weights, "
                f"gradients and state per weight byte, but the plan's memory model assumed {planned:.2f} "
                f"(optimizer_state_factor={self.plan_state_factor:g}, 4.0 = fp32 Adam); the plan "
                f"may not fit device memory: plan again with a cluster whose "
                f"optimizer_state_factor is {factor:.2f}"
            )
            if self.strict_optimizer_state:
                raise InvalidInputError(msg)
            logger.warning("%s", msg)
        elif factor < planned * 0.99:
            logger.info(
                "%s holds %.2f bytes per weight byte, less than the plan's %.2f: the plan priced more "
                "optimizer state than it holds",
                type(optimizer).__name__,
                factor,
                planned,
            )
        return factor


def _make_first_use(ref):
    def hook(optimizer, _args, _kwargs):
        check = ref()
        if check is None or any(r() is optimizer for r in check._optimizers) or check._is_inner(optimizer):
            return
        mine = {id(p) for p in check.parameters()}
        if any(id(p) in mine for g in optimizer.param_groups for p in g["params"]):
            check.use_optimizer(optimizer)

    return hook


def _make_state_check(ref):
    def hook(optimizer, _args, _kwargs):
        check = ref()
        if check is None or check.measured_state_factor is not None or check._is_inner(optimizer):
            return
        mine = {id(p) for p in check.parameters()}
        if any(id(p) in mine for g in optimizer.param_groups for p in g["params"]):
            check.check_optimizer(optimizer)

    return hook
