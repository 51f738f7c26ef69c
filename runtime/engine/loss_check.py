"""The first step's check of ``loss_fn``: a pipeline computes the loss per micro-batch, so the loss
must be the mean (``loss_reduction="mean"``) or the sum (``"sum"``) of per-sample terms.

Two probes, both without gradients, on the sink's first chunk:

- on the chunk's own outputs and targets: the chunk repeated twice must give the same loss (mean)
  or twice it (sum), and the losses of its two halves must combine into the chunk's (a loss that
  fails on a half or on a single row, written for several rows, is judged without them);
- on synthetic outputs: ``SYNTHETIC_ROWS`` rows with the output's shape (past the rows), dtype and
  device but a wide spread (each row its own scale and offset, in the output's range: (0, 1) when
  every output value is there, positive when every one is), the targets the chunk's own rows
  repeated. Their loss must combine from the losses of two unequal parts and from those of every
  single row. At initialisation a model's outputs are nearly equal across samples, so a term over
  the batch's statistics (a centering by the batch mean, a variance, a normalisation over the
  batch) is tiny on them: on the synthetic rows it is not, and the probe works on one-row chunks.

A loss that fails or is not finite on the synthetic rows proves nothing (an output with a domain
the probe does not guess); one that is finite on all of them but fails or is not finite on a part
is not per-sample. Tolerances are relative, to the sum of the per-row losses' magnitudes, so a
per-sample loss is never refused for float32 rounding.
"""

from __future__ import annotations

import math

import torch
import torch.utils._pytree as pytree

from gpp_solver.errors import InvalidInputError

BATCH_LEVEL = (
    "a pipeline computes the loss per micro-batch, so it must be a sum or mean of per-sample "
    "terms; a loss over the whole batch (a term over the batch's statistics: a centering by the "
    "batch mean, a variance, a normalisation over the batch; in-batch negatives: a contrastive "
    "loss such as CLIP's, where each sample's term depends on every other sample) cannot be split: "
    "use a per-sample loss, or keep the batch-level part (the all-pairs similarity and its loss) "
    "out of the pipelined model and its loss_fn"
)

#: rows of synthetic outputs the probe builds (fewer when a row is large)
SYNTHETIC_ROWS = 8
#: the synthetic rows' memory cap, unless the chunk itself is larger
SYNTHETIC_BYTES = 64 * 2**20
#: exceptions of a loss_fn given rows it cannot pair (labels of the whole batch, ...)
LOSS_ERRORS = (IndexError, RuntimeError, ValueError)


class LossRefused(InvalidInputError):
    """The first step's check refused ``loss_fn``; ``origin`` is the rank whose check did (every
    rank raises it, so only that rank need report it)."""

    def __init__(self, message: str, origin: int) -> None:
        super().__init__(message)
        self.origin = origin


def one_line(exc: Exception) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def rows_of(tree, lo: int, hi: int):
    return pytree.tree_map(lambda t: t[lo:hi] if isinstance(t, torch.Tensor) and t.dim() > 0 else t, tree)


def _take(tree, idx: torch.Tensor):
    return pytree.tree_map(lambda t: t[idx.to(t.device)] if isinstance(t, torch.Tensor) and t.dim() > 0 else t, tree)


def _close(a: float, b: float, scale: float = 0.0, rtol: float = 1e-4) -> bool:
    return abs(a - b) <= rtol * max(abs(a), abs(b), scale, 1e-12)


def _combine(halves: tuple[float, float, int, int], reduction: str) -> float:
    """The loss of a chunk from its halves' losses, for a sum or a mean over samples."""
    a, b, na, nb = halves
    return a + b if reduction == "sum" else (a * na + b * nb) / (na + nb)


def _rows(tree) -> int:
    return next((t.shape[0] for t in pytree.tree_leaves(tree) if isinstance(t, torch.Tensor) and t.dim() > 0), 0)


def _rms(t: torch.Tensor) -> float:
    v = float(t.detach().double().pow(2).mean().sqrt()) if t.numel() else 0.0
    return v if math.isfinite(v) else 0.0


def _rtol(out) -> float:
    """Relative tolerance of the synthetic probe: 1e-4, looser for half-precision outputs."""
    eps = max(
        (
            torch.finfo(t.dtype).eps
            for t in pytree.tree_leaves(out)
            if isinstance(t, torch.Tensor) and t.is_floating_point()
        ),
        default=0.0,
    )
    return max(1e-4, 8 * eps)


def _synthetic(out, tgt, gen: torch.Generator):
    """Synthetic outputs (rows of the output's shape, dtype and device, widely spread) and targets
    (the chunk's own rows repeated); None when the output has no floating rows."""
    n = _rows(out)
    leaves = [t for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor) and t.dim() > 0]
    if n == 0 or not any(t.is_floating_point() for t in leaves):
        return None
    row_bytes = sum(t.numel() // max(n, 1) * t.element_size() for t in leaves)
    m = SYNTHETIC_ROWS
    if m * row_bytes > max(4 * n * row_bytes, SYNTHETIC_BYTES):
        m = max(3, min(SYNTHETIC_ROWS, max(4 * n * row_bytes, SYNTHETIC_BYTES) // max(row_bytes, 1)))
    base = max(
        [1.0] + [_rms(t) for t in pytree.tree_leaves(tgt) if isinstance(t, torch.Tensor) and t.is_floating_point()]
    )
    scale = torch.logspace(-0.5, 0.7, m, dtype=torch.float64)[torch.randperm(m, generator=gen)]
    offset = 2 * torch.randn(m, generator=gen, dtype=torch.float64)

    def leaf(t):
        if not isinstance(t, torch.Tensor) or t.dim() == 0:
            return t
        if not t.is_floating_point():
            return t[torch.arange(m, device=t.device) % t.shape[0]]
        shape = (m, *t.shape[1:])
        view = (m,) + (1,) * (len(shape) - 1)
        z = torch.randn(shape, generator=gen, dtype=torch.float64) * scale.view(view) + offset.view(view)
        real = t.detach()
        lo, hi = (float(real.min()), float(real.max())) if real.numel() else (0.0, 0.0)
        if 0.0 <= lo and hi <= 1.0:
            v = torch.sigmoid(z)  # probabilities
        elif 0.0 <= lo:
            v = max(base, _rms(real)) * torch.exp(z.clamp(-6, 6) / 2)  # positive values
        else:
            v = max(base, _rms(real)) * z
        return v.to(dtype=t.dtype, device=t.device)

    return pytree.tree_map(leaf, out), _take(tgt, torch.arange(m) % _rows(tgt) if _rows(tgt) else torch.arange(m)), m


def _value(loss_fn, out, tgt) -> float:
    loss = loss_fn(out, tgt)
    return float(loss.detach()) if isinstance(loss, torch.Tensor) else float(loss)


def synthetic_probe(loss_fn, out, tgt, seed: int = 0):
    """The synthetic rows' verdict: ``{"mean": bool, "sum": bool}`` and a description of what the
    loss gave, or None when the loss proves nothing on them. Raises ``_NotPerSample`` when a part
    of rows whose whole has a finite loss fails or is not finite."""
    gen = torch.Generator().manual_seed(1_000_003 + seed)
    made = _synthetic(out, tgt, gen)
    if made is None:
        return None
    s, t, m = made
    with torch.no_grad():
        try:
            whole = _value(loss_fn, s, t)
        except (*LOSS_ERRORS, TypeError):
            return None
        if not math.isfinite(whole):
            return None
        a = max(1, (3 * m) // 8)
        try:
            la = _value(loss_fn, rows_of(s, 0, a), rows_of(t, 0, a))
            lb = _value(loss_fn, rows_of(s, a, m), rows_of(t, a, m))
        except LOSS_ERRORS as exc:
            raise _NotPerSample(
                f"loss_fn gave {whole:.6g} on {m} synthetic output rows but failed on part of them ({one_line(exc)})"
            ) from exc
        try:  # a loss written for several rows (a squeeze) may fail on one: the parts judge it then
            single = [_value(loss_fn, rows_of(s, i, i + 1), rows_of(t, i, i + 1)) for i in range(m)]
        except LOSS_ERRORS:
            single = None
    said = (
        f"on {m} synthetic output rows of the output's shape and dtype it gave {whole:.6g}, "
        f"{la:.6g} on rows 0:{a}, {lb:.6g} on rows {a}:{m}"
    )
    if single is not None:
        said += f", and {sum(single) / m:.6g} (mean) {sum(single):.6g} (sum) over the single rows"
    if not all(math.isfinite(x) for x in (la, lb, *(single or ()))):
        raise _NotPerSample(f"loss_fn is not finite on part of the rows where the whole is: {said}")
    rtol = _rtol(out)
    mag = sum(abs(x) for x in single) if single is not None else abs(la) * a + abs(lb) * (m - a)
    fits = {
        "mean": _close(whole, (la * a + lb * (m - a)) / m, mag / m, rtol)
        and (single is None or _close(whole, sum(single) / m, mag / m, rtol)),
        "sum": _close(whole, la + lb, mag, rtol) and (single is None or _close(whole, sum(single), mag, rtol)),
    }
    return fits, said


class _NotPerSample(Exception):
    pass


def check_loss(loss_fn, out, tgt, loss, reduction: str, seed: int = 0) -> tuple[str | None, bool]:
    """Whether ``loss_fn`` (which gave ``loss`` on the chunk ``out``, ``tgt``) is the ``reduction``
    of per-sample terms: (the refusal's one line or None, whether the check is conclusive). A
    check that is not conclusive (the loss not finite on the chunk nor on the synthetic rows) is
    repeated on the next chunk."""
    if not isinstance(loss, torch.Tensor) or loss.dim() != 0:
        raise InvalidInputError(
            f"loss_fn must return a scalar tensor, got {type(loss).__name__} {tuple(getattr(loss, 'shape', ()))}"
        )
    twice = lambda t: torch.cat([t, t]) if isinstance(t, torch.Tensor) and t.dim() > 0 else t  # noqa: E731
    l1 = float(loss.detach())
    try:
        with torch.no_grad():
            l2 = _value(loss_fn, pytree.tree_map(twice, out), pytree.tree_map(twice, tgt))
            try:  # as for single rows: a loss written for several rows is judged without its halves
                halves = _halves(loss_fn, out, tgt)
            except LOSS_ERRORS:
                halves = None
        syn = synthetic_probe(loss_fn, out, tgt, seed)
    except LOSS_ERRORS as exc:
        return f"loss_fn failed on a micro-batch repeated twice ({one_line(exc)}); {BATCH_LEVEL}", True
    except _NotPerSample as exc:
        return f"{exc}; {BATCH_LEVEL}", True
    real = None
    if math.isfinite(l1):
        rtol = _rtol(out)
        mag = None if halves is None else (abs(halves[0]), abs(halves[1]), *halves[2:])
        real = {
            red: _close(l2, ratio * l1, 0.0, rtol)
            and (halves is None or _close(_combine(halves, red), l1, _combine(mag, red), rtol))
            for red, ratio in (("mean", 1.0), ("sum", 2.0))
        }
    if real is None and syn is None:
        return None, False
    fits = {red: (real is None or real[red]) and (syn is None or syn[0][red]) for red in ("mean", "sum")}
    if fits[reduction]:
        return None, True
    other = {"mean": "sum", "sum": "mean"}[reduction]
    if fits[other]:
        return (
            f"loss_fn behaves as a {other} over samples (it gave {l1:.6g} on a chunk and {l2:.6g} "
            f"on the chunk twice) but loss_reduction={reduction!r}: pass "
            f"GraphPipeline(loss_reduction={other!r}) (gpp_runtime.train: set the workload's "
            f"loss_reduction = {other!r})"
        ), True
    got = "" if halves is None else f", {halves[0]:.6g} and {halves[1]:.6g} on its two halves"
    syn_said = "" if syn is None else f"; {syn[1]}"
    return (
        f"loss_fn is neither a mean nor a sum over samples (it gave {l1:.6g} on a chunk, {l2:.6g} "
        f"on the chunk twice{got}{syn_said}); {BATCH_LEVEL}"
    ), True


def _halves(loss_fn, out, tgt) -> tuple[float, float, int, int] | None:
    """The losses of the chunk's two halves and their rows (None below 2 rows)."""
    rows = _rows(out)
    if rows < 2:
        return None
    h = rows // 2
    return (
        _value(loss_fn, rows_of(out, 0, h), rows_of(tgt, 0, h)),
        _value(loss_fn, rows_of(out, h, rows), rows_of(tgt, h, rows)),
        h,
        rows - h,
    )
