"""The paper's workloads (GraphPipe Appendix A.2/A.3) as gpp-graph/1 graphs with estimated costs.

``build_model(name, **params)`` builds one from the registry :data:`MODELS` (``mmt``, ``dlrm``,
``candle-uno``, ``transformer``); each entry is ``(builder, params)`` with every parameter's
default and meaning.  Each builder also has a ``*_dict`` twin that returns the plain JSON dict.

Device profile (:class:`DeviceProfile`, default :data:`V100`): NVIDIA V100-SXM2 16 GB as on
Summit, **mixed precision**: fp16 activations (2 bytes) and tensor-core GEMMs at 125e12 FLOP/s
peak (fp32 peak 15.7e12 is stated; :data:`V100_FP32` uses it with 4-byte activations), fp32 master
weights (``weight_bytes`` = 4 bytes per parameter; the cluster's ``optimizer_state_factor``
multiplies them), HBM bandwidth 900e9 B/s, 0.7 of peak at best for GEMMs and 0.7 of the bandwidth
for memory-bound kernels, 10 us per kernel (launch + framework).

Formulas (``b`` samples in a micro-batch; per-op work in ``ops.py``)::

    eff(x) = 0.7 * x / (x + 128)                    x = GEMM rows = b * tokens per sample
    fw(b)  = kernels * 1e-5
           + max(flops * b / (125e12 * eff(x)),     matrix multiplies, compute bound ...
                 2 * gemm_params / (0.7 * 900e9))   ... or bound by streaming the fp16 weights
           + elementwise_bytes * b / (0.7 * 900e9)  softmax, LN, GeLU, concat, embedding gathers
    bw(b)  = 2 * fw(b)

Per layer (``s`` tokens, ``h`` hidden, ``a`` heads, ``f`` FFN, ``A`` = 2 bytes):

- attention: flops ``8 s h^2 + 4 s^2 h``, params ``4 h^2 + 6 h``, kept ``13 s h + 5 a s^2`` bytes;
- fc1 (LN, h->f, GeLU): flops ``2 s h f``, params ``h f + f + 2 h``, kept ``A (2 s h + s f)``;
- fc2 (f->h, dropout, residual): flops ``2 s f h``, params ``f h + h``, kept ``A s f + s h``;
  (together Megatron-LM's ``34 s h + 5 a s^2`` bytes per layer when ``f = 4 h``);
- linear+ReLU ``n_in -> n_out``: flops ``2 n_in n_out``, params ``n_in n_out + n_out``,
  kept ``A (n_in + n_out)``, output ``A n_out``;
- embedding bag (DLRM): table ``rows x dim`` fp32 (``4 rows dim`` bytes), ``bag`` lookups
  concatenated: output ``A bag dim``, gather traffic ``bag (dim (4 + A) + 8)``, kept ``8 bag``;
- concat: traffic ``2 A width``, nothing kept, output ``A width``.

``micro_batch_sizes`` are the powers of two up to ``max_micro_batch`` (64 for the Transformers,
512 for DLRM, 4096 for CANDLE-Uno); above the largest the graph format extrapolates linearly.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

from gpp_solver.errors import InvalidInputError
from gpp_solver.types import Graph
from gpp_solver.workloads.branchy_mlp import candle_uno, candle_uno_dict, dlrm, dlrm_dict
from gpp_solver.workloads.device import V100, V100_FP32, DeviceProfile, OpCost, forward_time, node_dict
from gpp_solver.workloads.transformer import mmt, mmt_dict, transformer, transformer_dict


class Param(NamedTuple):
    default: Any
    help: str


class ModelSpec(NamedTuple):
    """A registry entry: the builder (``**params -> Graph``) and its documented parameters."""

    builder: Callable[..., Graph]
    params: Mapping[str, Param]


_TRANSFORMER_PARAMS = {
    "seq": Param(256, "sequence length (tokens per sample)"),
    "hidden": Param(1024, "hidden size"),
    "heads": Param(16, "attention heads (must divide hidden)"),
    "ffn": Param(4096, "feed-forward inner size"),
    "vocab": Param(32000, "embedding vocabulary size"),
    "max_micro_batch": Param(64, "largest profiled micro-batch size"),
}

MODELS: dict[str, ModelSpec] = {
    "mmt": ModelSpec(
        mmt,
        {
            "branches": Param(4, "parallel Transformer branches"),
            "layers": Param(8, "Transformer layers per branch"),
            **_TRANSFORMER_PARAMS,
        },
    ),
    "dlrm": ModelSpec(
        dlrm,
        {
            "dense_branches": Param(7, "dense-feature branches"),
            "sparse_branches": Param(7, "embedding-bag branches"),
            "dense_layers": Param(4, "feed-forward layers per dense branch"),
            "hidden": Param(4096, "feed-forward width"),
            "dense_features": Param(4096, "input width of each dense branch"),
            "table_rows": Param(1_000_000, "rows of each embedding table"),
            "embed_dim": Param(64, "embedding dimension"),
            "bag_size": Param(100, "lookups per bag (concatenated)"),
            "top_layers": Param(4, "feed-forward layers after the interaction"),
            "max_micro_batch": Param(512, "largest profiled micro-batch size"),
        },
    ),
    "candle-uno": ModelSpec(
        candle_uno,
        {
            "branches": Param(7, "feature branches"),
            "layers": Param(4, "feed-forward layers per branch"),
            "hidden": Param(4096, "feed-forward width"),
            "top_layers": Param(4, "feed-forward layers after the concatenation"),
            "input_features": Param(4096, "input width of each branch"),
            "max_micro_batch": Param(4096, "largest profiled micro-batch size"),
        },
    ),
    "transformer": ModelSpec(transformer, {"layers": Param(32, "Transformer layers"), **_TRANSFORMER_PARAMS}),
}

_COMMON = ("name", "device")  # accepted by every builder, not CLI parameters


def build_model(name: str, **params: Any) -> Graph:
    """Build workload ``name`` with ``params`` (``None`` values mean "default").

    Raises InvalidInputError for an unknown name (listing the valid ones), an unknown parameter
    (listing that model's parameters) or a bad value (naming the parameter).
    """
    spec = MODELS.get(name)
    if spec is None:
        raise InvalidInputError(f"unknown model {name!r}; valid names: {', '.join(sorted(MODELS))}")
    given = {k: v for k, v in params.items() if v is not None}
    unknown = sorted(k for k in given if k not in spec.params and k not in _COMMON)
    if unknown:
        raise InvalidInputError(
            f"model {name!r} has no parameter {unknown[0]!r}; valid parameters: {', '.join(spec.params)}"
        )
    if "device" in given and not isinstance(given["device"], DeviceProfile):
        raise InvalidInputError(f"parameter 'device' must be a DeviceProfile, got {given['device']!r}")
    return spec.builder(**given)


__all__ = [
    "MODELS",
    "ModelSpec",
    "Param",
    "build_model",
    "DeviceProfile",
    "OpCost",
    "V100",
    "V100_FP32",
    "forward_time",
    "node_dict",
    "mmt",
    "mmt_dict",
    "dlrm",
    "dlrm_dict",
    "candle_uno",
    "candle_uno_dict",
    "transformer",
    "transformer_dict",
]
