"""Import torchvision (and packages that import it: timm, transformers) next to a CPU-only torch.

The registry's torchvision wheels are built against the CUDA torch: their C extension
(``torchvision/_C.so``) links ``libtorch_cuda.so`` and does not load next to the pinned CPU
torch (``torch==2.13.0+cpu``). torchvision then skips its C++ operators, which the model
*definitions* (``torchvision.models``) never use, but ``torchvision/_meta_registrations.py``
still registers fake kernels for ``torchvision::nms`` and ``torchvision::qnms`` without checking
that the operators exist, so ``import torchvision`` fails with
``RuntimeError: operator torchvision::nms does not exist``. transformers imports torchvision
when it is installed and fails the same way, and so does ``import timm``.

:func:`import_torchvision` imports torchvision normally; only when that fails for this one reason
does it declare the two operator *schemas* (no kernels: calling ``nms`` still raises) and import
again. Nothing is copied from torchvision; where its extension loads (a matching CUDA torch), the
normal import succeeds and nothing is declared. :func:`prepare_third_party` (what
``gpp_runtime.profile``, ``gpp_runtime.train`` and ``gpp_runtime.cores`` call before loading a ``--model``
module) does it whenever torchvision is installed. In your own scripts, call it before importing
torchvision, timm or transformers::

    from .third_party import import_torchvision
    tv = import_torchvision()
    net = tv.models.googlenet(weights=None, aux_logits=False, init_weights=True)
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import sys
from types import ModuleType

import torch

logger = logging.getLogger(__name__)

# Schemas as torchvision's csrc/ops/nms.cpp declares them (TORCH_LIBRARY_FRAGMENT(torchvision, m)).
_SCHEMAS = (
    "nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
)
_LIBRARY: list = []  # keeps the torch.library.Library alive (its schemas vanish with it)


def _purge() -> None:
    for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
        del sys.modules[name]


def import_torchvision() -> ModuleType:
    """``import torchvision``, declaring its missing operator schemas first if the C extension
    cannot load. ImportError if torchvision is not installed (``pip install torchvision==0.28.0``
    for torch 2.13)."""
    if "torchvision" in sys.modules and hasattr(sys.modules["torchvision"], "models"):
        return sys.modules["torchvision"]
    try:
        return importlib.import_module("torchvision")
    except RuntimeError as exc:
        if "torchvision::" not in str(exc) or _LIBRARY:
            raise
        logger.debug("torchvision's C extension does not load (%s); declaring its op schemas", exc)
    _purge()
    lib = torch.library.Library("torchvision", "FRAGMENT")  # noqa: TOR901 - schemas only
    for schema in _SCHEMAS:
        lib.define(schema)
    _LIBRARY.append(lib)
    return importlib.import_module("torchvision")


def import_transformers() -> ModuleType:
    """``import transformers`` after making torchvision importable when it is installed."""
    if importlib.util.find_spec("torchvision") is not None:
        import_torchvision()
    return importlib.import_module("transformers")


def prepare_third_party() -> None:
    """Make torchvision (and so timm and transformers) importable when it is installed: a workload
    module may import any of them. Does nothing without torchvision; a torchvision that fails for
    another reason is left for the workload's own import to report."""
    if "torchvision" in sys.modules or importlib.util.find_spec("torchvision") is None:
        return
    try:
        import_torchvision()
    except Exception as exc:  # noqa: BLE001 - the workload's import reports it
        logger.debug("torchvision does not import: %s", exc)
