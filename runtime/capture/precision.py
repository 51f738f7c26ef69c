"""The precision a pipeline trains in: ``precision=`` of ``GraphPipeline``, ``--precision`` of
``gpp_runtime.train`` and ``gpp_runtime.profile``.

- ``float32`` (the default): the model as it is built; nothing is cast.
- ``bf16-autocast``: torch.amp's recipe in bfloat16. Weights, gradients and optimizer state stay
  float32; each stage's forward and the sink's loss run under ``torch.autocast(device_type,
  dtype=torch.bfloat16)`` (the backward outside it, as torch.amp prescribes), so matmuls and
  convolutions compute and return bfloat16 and a value that crosses stages travels in the dtype
  its producer returns (half the bytes of float32 for a bfloat16 output). Autocast's cache of
  low-precision weight copies lives for one micro-batch's forward.
- ``fp16-autocast``: the same in float16, with one loss scale for the whole pipeline
  (:class:`gpp_runtime.engine.loss_scale.LossScaler`).
- ``bf16-model``: the model cast to bfloat16 (``model.to(torch.bfloat16)``: weights, gradients
  and optimizer state in bfloat16), its floating inputs and targets cast to bfloat16; no autocast.

The dtypes of the values that cross stages are traced under the same precision when the pipeline
is built (``stage_setup.value_meta``), so every receive buffer has the dtype its sender produces.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
import torch.utils._pytree as pytree

from gpp_solver.errors import InvalidInputError


@dataclass(frozen=True)
class Precision:
    """One of :data:`PRECISIONS` (module docstring)."""

    name: str
    #: the dtype of the autocast regions (each forward and its loss), None: no autocast
    autocast: torch.dtype | None = None
    #: the dtype the model, its floating inputs and targets are cast to, None: as built
    model_dtype: torch.dtype | None = None
    #: whether the loss is scaled (fp16: ``LossScaler``)
    scaled: bool = False

    def forward(self, device: torch.device | str):
        """The context a forward and its loss run in: ``torch.autocast`` for ``device``'s type, or nothing."""
        if self.autocast is None:
            return contextlib.nullcontext()
        kind = torch.device(device).type
        return torch.autocast(kind, dtype=self.autocast)

    def cast(self, tree):
        """``tree`` (inputs, a target) with its floating tensors cast to :attr:`model_dtype`."""
        if self.model_dtype is None:
            return tree
        dtype = self.model_dtype
        return pytree.tree_map(
            lambda t: t.to(dtype) if isinstance(t, torch.Tensor) and t.is_floating_point() else t, tree
        )

    def cast_model(self, model: torch.nn.Module) -> torch.nn.Module:
        """``model`` cast to :attr:`model_dtype` in place (nothing for the other precisions)."""
        return model.to(self.model_dtype) if self.model_dtype is not None else model

    @property
    def low(self) -> torch.dtype | None:
        """The low-precision dtype in use (autocast's or the model's), None for float32."""
        return self.autocast or self.model_dtype


#: the precision choices, by name
PRECISIONS: dict[str, Precision] = {
    "float32": Precision("float32"),
    "bf16-autocast": Precision("bf16-autocast", autocast=torch.bfloat16),
    "fp16-autocast": Precision("fp16-autocast", autocast=torch.float16, scaled=True),
    "bf16-model": Precision("bf16-model", model_dtype=torch.bfloat16),
}


def precision(choice: str | Precision | None) -> Precision:
    """The :class:`Precision` named ``choice`` (None: float32); InvalidInputError naming the choices."""
    if choice is None:
        return PRECISIONS["float32"]
    if isinstance(choice, Precision):
        return choice
    if choice not in PRECISIONS:
        raise InvalidInputError(f"precision must be one of {', '.join(PRECISIONS)}; got {choice!r}")
    return PRECISIONS[choice]


def in_precision(wl, prec):
    """The workload as it trains in ``prec``: a bf16 model and its floating samples cast (the
    workload object changed in place); the others as they are (their autocast is the caller's: the
    profiler's, a filler's)."""
    if prec.model_dtype is None:
        return wl
    prec.cast_model(wl.model)
    sample = wl.sample
    wl.sample = lambda rows, step: prec.cast(tuple(sample(rows, step)))
    return wl
