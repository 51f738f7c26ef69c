"""The device profile and the one formula that turns an operator's work into node costs.

Every built-in workload describes each node by an :class:`OpCost` (work per sample) and calls
:func:`node_dict`, which evaluates, for a micro-batch of ``b`` samples on one device::

    eff(x)   = max_compute_efficiency * x / (x + half_efficiency_rows)     x = rows * b
    t_gemm   = flops * b / (peak_flops * eff(rows * b))                   (0 when flops == 0)
    t_weight = gemm_params * compute_weight_dtype_bytes / (memory_bandwidth * bandwidth_efficiency)
    t_mem    = elementwise_bytes * b / (memory_bandwidth * bandwidth_efficiency)
    fw(b)    = kernels * kernel_overhead + max(t_gemm, t_weight) + t_mem
    bw(b)    = backward_factor * fw(b)                                    (2x: dgrad + wgrad)

``max(t_gemm, t_weight)`` is the roofline of the matrix multiplies (compute against streaming the
fp16 weights once per micro-batch); ``t_mem`` is the memory-bound kernels (softmax, layer norm,
GeLU, dropout, concat, embedding gathers).  Per-sample time ``fw(b) / b`` is strictly decreasing
in ``b``: the launch and weight-streaming terms are per micro-batch and ``eff`` rises with ``b``.

Bytes: ``weight_bytes = (gemm_params + table_params) * weight_dtype_bytes`` (fp32 master weights;
the cluster's ``optimizer_state_factor`` multiplies them), ``activation_bytes`` and ``output_bytes``
per sample in the activation dtype (fp16), as each op builder computes them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpp_solver.errors import InvalidInputError


@dataclass(frozen=True)
class DeviceProfile:
    """A GPU as the cost formulas see it.  Default: NVIDIA V100-SXM2 16 GB (Summit), mixed precision.

    Mixed precision means fp16 activations and tensor-core GEMMs (``peak_flops`` 125e12), with fp32
    master weights (``weight_dtype_bytes`` 4).  ``fp32_peak_flops`` (15.7e12) is stated for
    reference and used by :data:`V100_FP32`.
    """

    name: str = "V100-SXM2-16GB (Summit), mixed precision"
    peak_flops: float = 125e12  # tensor-core fp16 FLOP/s
    fp32_peak_flops: float = 15.7e12  # plain fp32 FLOP/s (reference)
    memory_bandwidth: float = 900e9  # HBM2 bytes/s
    memory_bytes: float = 16 * 2**30  # for reference; the cluster sets the usable memory
    max_compute_efficiency: float = 0.7  # fraction of peak a large GEMM reaches
    half_efficiency_rows: float = 128.0  # GEMM rows (samples x tokens) at which eff = max / 2
    bandwidth_efficiency: float = 0.7  # fraction of memory_bandwidth memory-bound kernels reach
    kernel_overhead: float = 1e-5  # seconds per kernel (launch + framework)
    activation_dtype_bytes: int = 2  # fp16 activations
    compute_weight_dtype_bytes: int = 2  # weights as the GEMMs read them (fp16 copy)
    weight_dtype_bytes: int = 4  # master weights counted in weight_bytes (fp32)
    backward_factor: float = 2.0  # backward = 2x forward (FLOPs, bytes and kernels)

    def efficiency(self, rows: float) -> float:
        """Fraction of ``peak_flops`` a GEMM with ``rows`` rows reaches (rises with ``rows``)."""
        return self.max_compute_efficiency * rows / (rows + self.half_efficiency_rows)


V100 = DeviceProfile()
V100_FP32 = DeviceProfile(
    name="V100-SXM2-16GB (Summit), fp32", peak_flops=15.7e12, activation_dtype_bytes=4, compute_weight_dtype_bytes=4
)


@dataclass(frozen=True)
class OpCost:
    """Forward work of one node for ONE sample (see the module docstring for how it becomes time)."""

    flops: float = 0.0  # matrix-multiply FLOPs per sample
    rows: float = 1.0  # GEMM rows per sample (tokens); sets the efficiency
    gemm_params: float = 0.0  # parameters the GEMMs stream once per micro-batch
    table_params: float = 0.0  # parameters only gathered (embedding tables)
    elementwise_bytes: float = 0.0  # memory-bound traffic per sample
    kernels: int = 1  # forward kernels per micro-batch
    activation_bytes: float = 0.0  # kept from forward to backward, per sample
    output_bytes: float = 0.0  # output tensor, per sample


def forward_time(op: OpCost, dev: DeviceProfile, b: int) -> float:
    """Seconds of the forward pass of ``op`` for a micro-batch of ``b`` samples."""
    bw = dev.memory_bandwidth * dev.bandwidth_efficiency
    t_gemm = op.flops * b / (dev.peak_flops * dev.efficiency(op.rows * b)) if op.flops > 0 else 0.0
    t_weight = op.gemm_params * dev.compute_weight_dtype_bytes / bw
    t_mem = op.elementwise_bytes * b / bw
    return op.kernels * dev.kernel_overhead + max(t_gemm, t_weight) + t_mem


def node_dict(node_id: str, cost: OpCost, dev: DeviceProfile, sizes: list[int], **extra: Any) -> dict:
    """One gpp-graph/1 node for ``cost`` at micro-batch sizes ``sizes`` (``extra``: the node's ``extra``
    object, e.g. ``op``)."""
    fw = [forward_time(cost, dev, b) for b in sizes]
    return {
        "id": node_id,
        "fw_time": fw,
        "bw_time": [dev.backward_factor * t for t in fw],
        "weight_bytes": float((cost.gemm_params + cost.table_params) * dev.weight_dtype_bytes),
        "activation_bytes": float(cost.activation_bytes),
        "output_bytes": float(cost.output_bytes),
        **({"extra": dict(extra)} if extra else {}),
    }


def powers_of_two(max_micro_batch: int) -> list[int]:
    """1, 2, 4, ... up to ``max_micro_batch`` (included when it is not a power of two)."""
    sizes = []
    b = 1
    while b <= max_micro_batch:
        sizes.append(b)
        b *= 2
    if sizes[-1] != max_micro_batch:
        sizes.append(max_micro_batch)
    return sizes


def positive_int(value: Any, name: str) -> int:
    """``value`` as an int >= 1, else InvalidInputError naming the parameter."""
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        else:
            raise InvalidInputError(f"parameter '{name}' must be a positive integer, got {value!r}")
    if value < 1:
        raise InvalidInputError(f"parameter '{name}' must be a positive integer (>= 1), got {value!r}")
    return value
