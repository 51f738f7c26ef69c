"""Work per sample of the layers the built-in workloads are made of, as :class:`OpCost` records.

``A`` = activation dtype bytes (2), ``W`` = bytes of the weights as the kernels read them (2),
``s`` tokens per sample, ``h`` hidden, ``a`` heads, ``f`` FFN width.  Dropout masks are 1 byte per
element.  The Transformer activation counts follow Megatron-LM's accounting (Korthikanti et al.
2022: ``34 s h + 5 a s^2`` bytes per layer at fp16), split over the three nodes of a layer.
"""

from __future__ import annotations

from gpp_solver.workloads.device import DeviceProfile, OpCost

INDEX_BYTES = 8  # int64 token / embedding-bag indices


def attention(s: int, h: int, a: int, dev: DeviceProfile) -> OpCost:
    """LayerNorm + QKV projection + scores + softmax + dropout + context + output projection + residual.

    flops ``8 s h^2 + 4 s^2 h``; params ``4 h^2 + 4 h`` (+ ``2 h`` LayerNorm);
    memory-bound traffic ``A (6 a s^2 + 5 s h)`` (softmax/dropout read+write of the scores three
    times, LayerNorm read+write, dropout+residual); kept ``A (6 s h + 2 a s^2) + (s h + a s^2)``
    (LN input, QKV input, Q, K, V, softmax and dropout outputs, context, masks) = ``13 s h + 5 a s^2``
    bytes at fp16; output ``A s h``.
    """
    A = dev.activation_dtype_bytes
    return OpCost(
        flops=8.0 * s * h * h + 4.0 * s * s * h,
        rows=s,
        gemm_params=4.0 * h * h + 4.0 * h + 2.0 * h,
        elementwise_bytes=A * (6.0 * a * s * s + 5.0 * s * h),
        kernels=8,
        activation_bytes=A * (6.0 * s * h + 2.0 * a * s * s) + (s * h + a * s * s),
        output_bytes=A * s * h,
    )


def ffn_in(s: int, h: int, f: int, dev: DeviceProfile) -> OpCost:
    """LayerNorm + first FFN linear (h -> f) + GeLU.

    flops ``2 s h f``; params ``h f + f + 2 h``; traffic ``A (2 s h + 2 s f)``;
    kept ``A (2 s h + s f)`` (LN input, linear input, GeLU input); output ``A s f``.
    """
    A = dev.activation_dtype_bytes
    return OpCost(
        flops=2.0 * s * h * f,
        rows=s,
        gemm_params=1.0 * h * f + f + 2.0 * h,
        elementwise_bytes=A * (2.0 * s * h + 2.0 * s * f),
        kernels=3,
        activation_bytes=A * (2.0 * s * h + 1.0 * s * f),
        output_bytes=A * s * f,
    )


def ffn_out(s: int, h: int, f: int, dev: DeviceProfile) -> OpCost:
    """Second FFN linear (f -> h) + dropout + residual add.

    flops ``2 s f h``; params ``f h + h``; traffic ``3 A s h``; kept ``A s f + s h`` (linear input,
    dropout mask); output ``A s h``.
    """
    A = dev.activation_dtype_bytes
    return OpCost(
        flops=2.0 * s * f * h,
        rows=s,
        gemm_params=1.0 * f * h + h,
        elementwise_bytes=3.0 * A * s * h,
        kernels=2,
        activation_bytes=A * s * f + s * h,
        output_bytes=A * s * h,
    )


def token_embedding(s: int, h: int, vocab: int, dev: DeviceProfile) -> OpCost:
    """Token + position embedding lookup (gathers only, no GEMM).

    table params ``vocab h + s h``; traffic ``2 s h (W + A)`` (two gathers, one add);
    kept ``8 s`` (the token ids); output ``A s h``.
    """
    A, W = dev.activation_dtype_bytes, dev.compute_weight_dtype_bytes
    return OpCost(
        rows=s,
        table_params=1.0 * vocab * h + 1.0 * s * h,
        elementwise_bytes=2.0 * s * h * (W + A),
        kernels=2,
        activation_bytes=INDEX_BYTES * s,
        output_bytes=A * s * h,
    )


def linear(n_in: int, n_out: int, dev: DeviceProfile, *, rows: int = 1, relu: bool = True) -> OpCost:
    """A feed-forward layer ``n_in -> n_out`` applied to ``rows`` rows per sample (+ bias, + ReLU).

    flops ``2 rows n_in n_out``; params ``n_in n_out + n_out``; traffic ``2 A rows n_out`` (bias and
    activation, read+write); kept ``A rows n_in`` (+ ``A rows n_out`` for the ReLU);
    output ``A rows n_out``.
    """
    A = dev.activation_dtype_bytes
    kept = A * rows * (n_in + (n_out if relu else 0))
    return OpCost(
        flops=2.0 * rows * n_in * n_out,
        rows=rows,
        gemm_params=1.0 * n_in * n_out + n_out,
        elementwise_bytes=2.0 * A * rows * n_out,
        kernels=2,
        activation_bytes=kept,
        output_bytes=A * rows * n_out,
    )


def embedding_bag(table_rows: int, dim: int, bag: int, dev: DeviceProfile) -> OpCost:
    """An embedding bag whose ``bag`` looked-up rows are concatenated (GraphPipe A.2), not summed.

    table params ``table_rows dim`` (fp32, sparse updates); traffic ``bag (dim (weight_dtype_bytes
    + A) + 8)`` (gather fp32 rows, write fp16, read indices); kept ``8 bag`` (indices for the
    backward scatter); output ``A bag dim``.
    """
    A = dev.activation_dtype_bytes
    return OpCost(
        rows=1,
        table_params=1.0 * table_rows * dim,
        elementwise_bytes=bag * (dim * (dev.weight_dtype_bytes + A) + INDEX_BYTES),
        kernels=1,
        activation_bytes=INDEX_BYTES * bag,
        output_bytes=A * bag * dim,
    )


def concat(elements: float, dev: DeviceProfile) -> OpCost:
    """Concatenation of inputs totalling ``elements`` per sample: traffic ``2 A elements`` (read +
    write), nothing kept (its backward only slices the gradient), output ``A elements``."""
    A = dev.activation_dtype_bytes
    return OpCost(
        rows=1, elementwise_bytes=2.0 * A * elements, kernels=1, activation_bytes=0.0, output_bytes=A * elements
    )
