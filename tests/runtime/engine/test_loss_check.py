"""The first step's check of loss_fn in one process (gpp_runtime.engine.loss_check): batch-level
losses are refused on outputs nearly equal across samples (as at initialisation) and on one-row
chunks; per-sample losses pass, float32 and half precision, class-index and dict targets."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from batch_losses import ACCEPTED, REFUSED

from gpp_runtime.engine.loss_check import BATCH_LEVEL, check_loss


def _outputs(rows: int, dtype=torch.float32) -> torch.Tensor:
    """Outputs nearly equal across samples, as a model's at initialisation."""
    g = torch.Generator().manual_seed(rows)
    return (torch.randn(1, 8, generator=g) + 1e-3 * torch.randn(rows, 8, generator=g)).to(dtype).requires_grad_()


@pytest.mark.parametrize("rows", [1, 2, 8])
@pytest.mark.parametrize("name", sorted(REFUSED))
def test_batch_level_loss_is_refused_on_nearly_equal_outputs(name, rows):
    out, tgt = _outputs(rows), torch.randn(rows, 8, generator=torch.Generator().manual_seed(1))
    msg, conclusive = check_loss(REFUSED[name], out, tgt, REFUSED[name](out, tgt), "mean")
    assert conclusive and msg is not None and msg.startswith("loss_fn ") and BATCH_LEVEL in msg
    assert "\n" not in msg


def test_a_small_variance_term_is_refused_too():
    def loss(o, t):
        return F.mse_loss(o, t) + 1e-3 * o.var(0, unbiased=False).mean()

    out, tgt = _outputs(4), torch.randn(4, 8)
    assert check_loss(loss, out, tgt, loss(out, tgt), "mean")[0] is not None


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16])
@pytest.mark.parametrize("rows", [1, 2, 8])
@pytest.mark.parametrize("name", sorted(ACCEPTED))
def test_per_sample_loss_passes(name, rows, dtype):
    fn, reduction, target = ACCEPTED[name]
    out = _outputs(rows, dtype)
    tgt = target(rows, torch.Generator().manual_seed(2))
    tgt = {k: v.to(dtype) if v.is_floating_point() else v for k, v in tgt.items()} if isinstance(tgt, dict) else tgt
    tgt = tgt.to(dtype) if isinstance(tgt, torch.Tensor) and tgt.is_floating_point() else tgt
    assert check_loss(fn, out, tgt, fn(out, tgt), reduction) == (None, True)


def test_probabilities_stay_probabilities():
    """Sigmoid outputs: the synthetic rows stay in (0, 1), so binary cross-entropy passes."""
    out, tgt = torch.sigmoid(_outputs(2)), torch.rand(2, 8)
    assert check_loss(F.binary_cross_entropy, out, tgt, F.binary_cross_entropy(out, tgt), "mean") == (None, True)


def test_the_other_reduction_is_named():
    out, tgt = _outputs(2), torch.randn(2, 8)
    msg, _ = check_loss(F.mse_loss, out, tgt, F.mse_loss(out, tgt), "sum")
    assert msg.startswith("loss_fn behaves as a mean") and "loss_reduction='mean'" in msg


def test_a_chunk_whose_loss_is_not_finite_is_judged_on_the_synthetic_rows():
    """NaN outputs prove nothing about the loss; the synthetic rows do (the caller judges the NaN)."""
    out, tgt = torch.full((2, 8), float("nan")), torch.randn(2, 8)
    assert check_loss(F.mse_loss, out, tgt, F.mse_loss(out, tgt), "mean") == (None, True)
    loss = REFUSED["centering"]
    assert check_loss(loss, out, tgt, loss(out, tgt), "mean")[0] is not None


def test_a_loss_that_proves_nothing_is_checked_on_the_next_chunk():
    def loss(o, t):  # not finite wherever it is computed
        return F.mse_loss(o, t) * float("inf")

    out, tgt = _outputs(2), torch.randn(2, 8)
    assert check_loss(loss, out, tgt, loss(out, tgt), "mean") == (None, False)


def test_a_per_sample_loss_that_fails_on_one_row_is_judged_on_two_parts():
    def loss(o, t):  # written for several rows
        if len(o) < 2:
            raise RuntimeError("one row")
        return F.mse_loss(o, t)

    out, tgt = _outputs(2), torch.randn(2, 8)
    assert check_loss(loss, out, tgt, loss(out, tgt), "mean") == (None, True)
