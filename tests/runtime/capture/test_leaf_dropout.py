"""Dropout inside modules traced whole (``nn.MultiheadAttention``'s attention dropout, an
``nn.TransformerEncoderLayer``): the pipeline's chunks and the one-process reference draw the same
masks, so ``--verify`` holds with several micro-batches."""

from __future__ import annotations

import torch
from runtime_plans import assert_shape, plan, stage, torchrun, write
from torch import nn

from gpp_runtime.capture.dropout import ChunkSeeded, Context, per_chunk, set_context
from gpp_runtime.capture.fx_graph import set_training, trace


class Fused(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.enc = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.5, batch_first=True)
        self.attn = nn.MultiheadAttention(8, 2, dropout=0.5, batch_first=True)
        self.plain = nn.Linear(8, 8)  # no randomness: left as it is

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.enc(x)
        fused, _ = self.attn(h, x, x)
        return self.plain(fused)


def _traced():
    torch.manual_seed(0)
    model = Fused()
    x = torch.randn(4, 5, 8)
    mg = trace(model, (x,))
    assert per_chunk(mg.gm, mg.ids) == 2
    set_training(mg.gm, True)
    return mg, x


def test_attention_dropout_in_whole_modules_is_drawn_per_chunk():
    mg, x = _traced()
    gm = mg.gm
    assert isinstance(gm.get_submodule("enc"), ChunkSeeded) and isinstance(gm.get_submodule("attn"), ChunkSeeded)
    assert isinstance(gm.get_submodule("plain"), nn.Linear)
    rows = {nid: 2 for nid in mg.ids.values()}
    # the pipeline: two micro-batches of 2 samples, each in its own forward; torch's RNG disturbed
    # in between (other nodes, other stages) changes nothing
    set_context(Context(seed=0, step=1, lo=0))
    first = gm(x[:2])
    torch.rand(100)
    set_context(Context(seed=0, step=1, lo=2))
    second = gm(x[2:])
    # the reference: the mini-batch at once, each whole module split into the same chunks
    set_context(Context(seed=0, step=1, lo=0, chunk_rows=rows))
    whole = gm(x)
    torch.testing.assert_close(whole, torch.cat([first, second]), rtol=1e-6, atol=1e-7)
    # the masks are drawn (not off), anew per step, and differ between chunks
    set_training(gm, False)
    assert not torch.allclose(gm(x[:2]), first)
    set_training(gm, True)
    set_context(Context(seed=0, step=2, lo=0))
    assert not torch.allclose(gm(x[:2]), first)
    set_context(Context(seed=0, step=1, lo=2))
    assert not torch.allclose(gm(x[:2]), first)


def test_gradients_match_with_two_micro_batches():
    """Backward through the chunked reference equals the sum over the pipeline's micro-batches."""
    mg, x = _traced()
    gm = mg.gm
    params = [p for p in gm.parameters()]
    set_context(Context(seed=3, step=0, lo=0, chunk_rows={nid: 2 for nid in mg.ids.values()}))
    want = torch.autograd.grad(gm(x).square().sum(), params)
    got = [torch.zeros_like(p) for p in params]
    for lo in (0, 2):
        set_context(Context(seed=3, step=0, lo=lo))
        for g, d in zip(got, torch.autograd.grad(gm(x[lo : lo + 2]).square().sum(), params)):
            g += d
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6)


def test_two_tower_dropout_verifies_in_float32_with_replicas(tmp_path):
    """The encoder layer and the attention (both with dropout 0.1, traced whole) on a stage of two
    data-parallel replicas, two micro-batches of 2 (1 sample per replica): --verify at the default
    float32 tolerance."""
    doc = plan(
        4,
        [
            stage(0, ["embed", "image.0", "image.1", "image.2", "image.3", "flatten", "transpose"], [0], 2, 4, depth=1),
            stage(1, ["text", "fuse", "mean", "mean_1", "cat", "head"], [1, 2], 2, 4, depth=0),
        ],
        [[0, 1]],
    )
    assert_shape(doc, stages=2, micro_batches=2, devices=[1, 2])
    res = torchrun(
        3,
        [
            "--plan",
            write(tmp_path, doc),
            "--model",
            "examples.real_models:two_tower_dropout",
            "--steps",
            "3",
            "--verify",
        ],
        timeout=300,
    )
    out = res.stdout + res.stderr
    assert res.returncode == 0 and "verify: OK" in out, out[-3000:]
