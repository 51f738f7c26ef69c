"""One loss scale for a whole pipeline (``precision="fp16-autocast"``): ``GraphPipeline.scaler``.

float16's range ends at 65504 and its smallest normal is 6e-5, so gradients are computed on the
loss multiplied by a scale (torch.amp's ``GradScaler`` recipe). In a pipeline the gradients of
one step live on every rank, so the choice to step is the whole pipeline's:

- ``GraphPipeline.step`` seeds the sink's backward with the loss times :meth:`LossScaler.get_scale`
  (the gradients that cross stages are scaled too, which is what keeps them in float16's range);
  the loss it returns is unscaled.
- :meth:`LossScaler.step` (every rank, also one whose stage has no parameters: pass ``None``)
  divides this rank's gradients by the scale, then every rank learns whether any gradient of any
  rank is not finite (one all-reduce over the world group, data-parallel replicas included); if
  one is, no rank steps, else every rank's optimizer steps.
- :meth:`LossScaler.update` moves the scale the same way on every rank: times ``backoff_factor``
  after an overflow, times ``growth_factor`` after ``growth_interval`` steps in a row without one
  (torch's defaults: 2**16, 0.5, 2.0, 2000).

Usage, the same on every rank and a no-op for the other precisions (``enabled=False``: ``step``
is ``optimizer.step()``)::

    loss = pipe.step(x, target=y)
    pipe.scaler.step(opt)      # unscale, agree, step or skip
    pipe.scaler.update()

For gradient clipping, call ``pipe.scaler.unscale_()`` first, as with torch's scaler.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable

import torch
import torch.distributed as dist

from gpp_solver.errors import InvalidInputError

logger = logging.getLogger(__name__)


class LossScaler:
    """The pipeline's loss scale (module docstring)."""

    def __init__(
        self,
        params: Callable[[], Iterable[torch.Tensor]],
        device: torch.device,
        *,
        enabled: bool,
        group=None,
        distributed: bool = True,
        init_scale: float = 2.0**16,
        growth_factor: float = 2.0,
        backoff_factor: float = 0.5,
        growth_interval: int = 2000,
    ) -> None:
        if not (init_scale > 0 and growth_factor > 1 and 0 < backoff_factor < 1 and growth_interval >= 1):
            raise InvalidInputError(
                "loss scaling needs init_scale > 0, growth_factor > 1, 0 < backoff_factor < 1 and "
                f"growth_interval >= 1; got {init_scale}, {growth_factor}, {backoff_factor}, {growth_interval}"
            )
        self.enabled = enabled
        self._params = params
        self._device = device
        self._group = group  # None: the world group
        #: whether the ranks agree (False: one process, as ``--verify``'s reference trains)
        self.distributed = distributed
        self._scale = float(init_scale)
        self._growth_factor = growth_factor
        self._backoff_factor = backoff_factor
        self._growth_interval = growth_interval
        self._good_steps = 0
        #: this step's agreement, once unscaled: the rank that found a non-finite gradient (None: none)
        self._found: int | None = None
        self._unscaled = False
        #: the steps skipped so far (every rank counts the same)
        self.skipped = 0

    def get_scale(self) -> float:
        """The scale the next backward is seeded with (1.0 when disabled)."""
        return self._scale if self.enabled else 1.0

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        """``loss`` times the scale (``loss`` itself when disabled)."""
        return loss * self._scale if self.enabled else loss

    def unscale_(self) -> None:
        """Divide this rank's gradients by the scale and agree with every rank whether any is not
        finite (once per step; ``step`` calls it when the caller has not)."""
        if not self.enabled or self._unscaled:
            return
        grads = [p.grad for p in self._params() if p.grad is not None]
        bad = any(not bool(torch.isfinite(g).all()) for g in grads)
        if grads:
            torch._foreach_mul_(grads, 1.0 / self._scale)
        rank = dist.get_rank() if self.distributed and dist.is_initialized() else 0
        # the highest rank that found one, + 1 (0: none): the same answer on every rank
        flag = torch.tensor([float(rank + 1) if bad else 0.0], device=self._collective_device())
        if self.distributed and dist.is_initialized():
            dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self._group)
        found = int(flag.item())
        self._found = found - 1 if found else None
        self._unscaled = True

    def _collective_device(self) -> torch.device:
        backend = dist.get_backend(self._group) if self.distributed and dist.is_initialized() else "gloo"
        return self._device if backend == "nccl" else torch.device("cpu")

    def step(self, optimizer: torch.optim.Optimizer | None) -> bool:
        """Unscale (if not yet), agree, and step ``optimizer`` unless a gradient of any rank is not
        finite; whether it stepped. Every rank calls it, with ``None`` where nothing is to step."""
        if not self.enabled:
            if optimizer is not None:
                optimizer.step()
            return True
        self.unscale_()
        if self._found is not None:
            return False
        if optimizer is not None:
            optimizer.step()
        return True

    def update(self) -> None:
        """After every optimizer's ``step``: move the scale (module docstring) and start the next step."""
        if not self.enabled:
            return
        if not self._unscaled:
            raise InvalidInputError("LossScaler.update() before step(): call pipe.scaler.step(optimizer) first")
        if self._found is not None:
            old = self._scale
            self._scale *= self._backoff_factor
            self._good_steps = 0
            self.skipped += 1
            logger.info(
                "fp16: a gradient on rank %d is not finite: step skipped on every rank, loss scale %g -> %g",
                self._found,
                old,
                self._scale,
            )
        else:
            self._good_steps += 1
            if self._good_steps == self._growth_interval:
                self._scale *= self._growth_factor
                self._good_steps = 0
        self._found = None
        self._unscaled = False

    def state_dict(self) -> dict:
        """The scale and the count of steps since the last change (for checkpoints)."""
        return {"scale": self._scale, "good_steps": self._good_steps, "skipped": self.skipped}

    def load_state_dict(self, state: dict) -> None:
        self._scale = float(state["scale"])
        self._good_steps = int(state["good_steps"])
        self.skipped = int(state.get("skipped", 0))
