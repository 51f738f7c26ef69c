"""Workloads on models the project did not write, for ``gpp_runtime.profile`` and ``gpp_runtime.train``.

    python -m gpp_runtime.profile --model examples.real_models:googlenet --micro-batch-sizes 2,4 -o g.json

- ``googlenet`` / ``resnet18``: torchvision's definitions as shipped (in-place ReLUs, ``+=``),
  10 classes, 32x32 images, float64 (deep CNNs in fp32 differ from one process by rounding).
  Their BatchNorm layers are swapped for torchvision's ``FrozenBatchNorm2d`` (kept whole as leaf
  modules) so that a pipeline, whose BatchNorm statistics would be per micro-batch, trains exactly
  like one process; ``googlenet_bn`` keeps the trainable BatchNorm (profile it from 2 samples).
- ``bert_tiny``: HuggingFace ``BertModel`` from a tiny random config (no download) with a linear
  head on the first token; its ``BertEmbeddings`` and ``BertLayer`` are leaf modules (the
  workload's tracer hook: plain fx fails on the embeddings' slicing by a traced length).
- ``gpt2_tiny`` / ``gpt2_tiny_tied``: HuggingFace ``GPT2LMHeadModel`` from a tiny random config,
  traced with ``torch.export``; ``gpt2_tiny_tied`` ties the head to the embedding (as shipped).
- ``gpt2_deep``: the tied GPT-2 above, 60 blocks deep at the same tiny width: about 2,200 graph
  nodes, a real model at the size where planning (not training) is the hard part.
- ``two_tower``: a text tower (embedding, ``nn.TransformerEncoderLayer``) and an image tower
  (convolutions) fused by a raw ``nn.MultiheadAttention`` (its output is a tuple) and a head.
- ``mobilenet_v3_small``: torchvision's definition as shipped, frozen BatchNorm, float64.
- ``clip_tiny``: HuggingFace ``CLIPModel`` (text and vision towers, projections) from a tiny random
  ``CLIPConfig``, traced with ``torch.export`` (plain fx fails on its position-length check); the
  per-sample score of each image with its own text, binary cross-entropy against a random label.

torchvision and transformers are imported through ``gpp_runtime.capture.third_party`` (see there why).
Dropout is 0 everywhere: ``--verify`` needs the pipeline and one process to draw equal masks.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch
from torch import nn

from gpp_runtime.capture.third_party import import_torchvision, import_transformers

CLASSES = 10


def _classification(model: nn.Module, input_shape: tuple, dtype=torch.float64, **hooks):
    model = model.to(dtype)

    def sample(batch_size: int, step: int):
        g = torch.Generator().manual_seed(3000 + step)
        x = torch.randn(batch_size, *input_shape, generator=g, dtype=dtype)
        y = torch.randint(0, CLASSES, (batch_size,), generator=g)
        return (x,), y

    def loss(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return nn.functional.cross_entropy(output, target, reduction="sum")

    return SimpleNamespace(model=model, sample=sample, loss=loss, **hooks)


def _freeze_batchnorm(model: nn.Module) -> nn.Module:
    """Replace every ``nn.BatchNorm2d`` with torchvision's ``FrozenBatchNorm2d`` (same stats)."""
    frozen = import_torchvision().ops.misc.FrozenBatchNorm2d
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, nn.BatchNorm2d):
                f = frozen(child.num_features, eps=child.eps)
                f.weight.copy_(child.weight.detach())
                f.bias.copy_(child.bias.detach())
                f.running_mean.copy_(child.running_mean)
                f.running_var.copy_(child.running_var)
                setattr(parent, name, f)
    return model


def googlenet(size: int = 32):
    tv = import_torchvision()
    net = tv.models.googlenet(weights=None, aux_logits=False, init_weights=True, dropout=0.0, num_classes=CLASSES)
    return _classification(_freeze_batchnorm(net), (3, size, size), leaf_modules=(tv.ops.misc.FrozenBatchNorm2d,))


def googlenet_bn(size: int = 32):
    """GoogLeNet with its trainable BatchNorm (statistics per micro-batch in a pipeline)."""
    tv = import_torchvision()
    net = tv.models.googlenet(weights=None, aux_logits=False, init_weights=True, dropout=0.0, num_classes=CLASSES)
    return _classification(net, (3, size, size), dtype=torch.float32)


def resnet18(size: int = 32):
    tv = import_torchvision()
    frozen = tv.ops.misc.FrozenBatchNorm2d
    return _classification(
        tv.models.resnet18(weights=None, num_classes=CLASSES, norm_layer=frozen),
        (3, size, size),
        leaf_modules=(frozen,),
    )


class _FirstTokenClassifier(nn.Module):
    def __init__(self, encoder: nn.Module, hidden: int) -> None:
        super().__init__()
        self.encoder = encoder
        self.head = nn.Linear(hidden, CLASSES)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(input_ids).last_hidden_state[:, 0])


def bert_tiny(seq: int = 8, layers: int = 2):
    tr = import_transformers()
    from transformers.models.bert import modeling_bert as mb

    cfg = tr.BertConfig(
        vocab_size=64,
        hidden_size=16,
        num_hidden_layers=layers,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=16,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    model = _FirstTokenClassifier(tr.BertModel(cfg, add_pooling_layer=False), cfg.hidden_size)

    def sample(batch_size: int, step: int):
        g = torch.Generator().manual_seed(4000 + step)
        ids = torch.randint(0, cfg.vocab_size, (batch_size, seq), generator=g)
        return (ids,), torch.randint(0, CLASSES, (batch_size,), generator=g)

    def loss(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return nn.functional.cross_entropy(output, target, reduction="sum")

    return SimpleNamespace(model=model, sample=sample, loss=loss, leaf_modules=(mb.BertEmbeddings, mb.BertLayer))


class _Logits(nn.Module):
    def __init__(self, lm: nn.Module) -> None:
        super().__init__()
        self.lm = lm

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.lm(input_ids).logits.flatten(1)


def gpt2_tiny(seq: int = 8, layers: int = 2, tied: bool = False, vocab: int = 32):
    """HuggingFace ``GPT2LMHeadModel`` from a tiny random config; plain fx fails on its mask
    builder (data-dependent control flow), so it is traced with ``torch.export``. ``tied``: the
    head shares the embedding's weight (as shipped): in the exported graph one parameter read by
    the embedding lookup and by the head's matmul, which may land in different stages."""
    tr = import_transformers()
    cfg = tr.GPT2Config(
        vocab_size=vocab,
        bos_token_id=vocab - 1,
        eos_token_id=vocab - 1,
        n_embd=16,
        n_layer=layers,
        n_head=2,
        n_positions=16,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        tie_word_embeddings=tied,
    )
    model = _Logits(tr.GPT2LMHeadModel(cfg))

    def sample(batch_size: int, step: int):
        g = torch.Generator().manual_seed(6000 + step)
        ids = torch.randint(0, cfg.vocab_size, (batch_size, seq + 1), generator=g)
        return (ids[:, :-1],), ids[:, 1:]

    def loss(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        logits = output.reshape(target.shape[0] * target.shape[1], -1)
        return nn.functional.cross_entropy(logits, target.reshape(-1), reduction="sum")

    return SimpleNamespace(model=model, sample=sample, loss=loss)


def gpt2_tiny_tied():
    """GPT-2 with its head tied to the embedding (vocabulary 64, so the tied weight is the
    largest parameter)."""
    return gpt2_tiny(tied=True, vocab=64)


def gpt2_deep(layers: int = 60):
    """The tied GPT-2 of :func:`gpt2_tiny_tied`, ``layers`` blocks deep (60: about 2,200 graph
    nodes, 36 a block): the shape of a large model at a width CPU ranks train in seconds."""
    return gpt2_tiny(layers=layers, tied=True, vocab=64)


class TwoTower(nn.Module):
    """Text tokens and an image, each through its own tower, fused by cross-attention."""

    def __init__(self, vocab: int = 32, width: int = 16, dropout: float = 0.0) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.text = nn.TransformerEncoderLayer(width, 2, 2 * width, dropout=dropout, batch_first=True)
        self.image = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(inplace=True), nn.Conv2d(8, width, 3, stride=2, padding=1), nn.ReLU()
        )
        self.fuse = nn.MultiheadAttention(width, 2, dropout=dropout, batch_first=True)
        self.head = nn.Linear(2 * width, CLASSES)

    def forward(self, tokens: torch.Tensor, image: torch.Tensor) -> torch.Tensor:
        t = self.text(self.embed(tokens))
        i = self.image(image).flatten(2).transpose(1, 2)
        fused, _ = self.fuse(t, i, i)
        return self.head(torch.cat([fused.mean(1), i.mean(1)], dim=1))


def two_tower(dropout: float = 0.0, dtype=torch.float32):
    model = TwoTower(dropout=dropout).to(dtype)

    def sample(batch_size: int, step: int):
        g = torch.Generator().manual_seed(5000 + step)
        tokens = torch.randint(0, 32, (batch_size, 6), generator=g)
        image = torch.randn(batch_size, 3, 8, 8, generator=g, dtype=dtype)
        return (tokens, image), torch.randint(0, CLASSES, (batch_size,), generator=g)

    def loss(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return nn.functional.cross_entropy(output, target, reduction="sum")

    return SimpleNamespace(model=model, sample=sample, loss=loss)


def two_tower_dropout():
    """The two-tower model with dropout 0.1, float32: the encoder layer's dropouts and the
    attention's dropout run inside modules traced whole, so ``--verify`` needs their draws per
    chunk of samples too (``gpp_runtime.capture.dropout.ChunkSeeded``)."""
    return two_tower(dropout=0.1, dtype=torch.float32)


def mobilenet_v3_small(size: int = 32):
    """torchvision's ``mobilenet_v3_small`` as shipped (squeeze-excitation, hardswish, in-place
    activations), 10 classes, 32x32 images, float64, BatchNorm frozen (``FrozenBatchNorm2d``) and
    the classifier's dropout 0, as for ``googlenet``."""
    tv = import_torchvision()
    frozen = tv.ops.misc.FrozenBatchNorm2d
    net = tv.models.mobilenet_v3_small(weights=None, num_classes=CLASSES, dropout=0.0, norm_layer=frozen)
    return _classification(net, (3, size, size), leaf_modules=(frozen,))


class _ClipPairScore(nn.Module):
    """A HuggingFace ``CLIPModel``'s two towers and projections; per sample, the scaled cosine
    similarity of its own image and text embeddings (a per-sample logit: the pipeline splits the
    mini-batch, so a loss over all pairs of the batch cannot be used)."""

    def __init__(self, clip: nn.Module) -> None:
        super().__init__()
        self.clip = clip

    def forward(self, input_ids: torch.Tensor, pixel_values: torch.Tensor) -> torch.Tensor:
        text = self.clip.get_text_features(input_ids=input_ids)
        image = self.clip.get_image_features(pixel_values=pixel_values)
        text = getattr(text, "pooler_output", text)  # newer transformers return an output object
        image = getattr(image, "pooler_output", image)
        text = text / text.norm(dim=-1, keepdim=True)
        image = image / image.norm(dim=-1, keepdim=True)
        return (text * image).sum(-1) * self.clip.logit_scale.exp()


def clip_tiny(seq: int = 8, image: int = 16):
    """HuggingFace ``CLIPModel`` (a text and a vision transformer, each with its projection) from a
    tiny random ``CLIPConfig`` (no download); the loss is binary cross-entropy of each sample's
    image-text score against a random match label, summed over samples."""
    tr = import_transformers()
    text = dict(
        vocab_size=64,
        bos_token_id=62,
        eos_token_id=63,
        pad_token_id=0,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        max_position_embeddings=seq,
        attention_dropout=0.0,
    )
    vision = dict(
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        image_size=image,
        patch_size=4,
        attention_dropout=0.0,
    )
    cfg = tr.CLIPConfig(text_config=text, vision_config=vision, projection_dim=16)
    model = _ClipPairScore(tr.CLIPModel(cfg)).to(torch.float64)

    def sample(batch_size: int, step: int):
        g = torch.Generator().manual_seed(7000 + step)
        ids = torch.randint(0, 64, (batch_size, seq), generator=g)
        pixels = torch.randn(batch_size, 3, image, image, generator=g, dtype=torch.float64)
        return (ids, pixels), torch.randint(0, 2, (batch_size,), generator=g).to(torch.float64)

    def loss(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return nn.functional.binary_cross_entropy_with_logits(output, target, reduction="sum")

    return SimpleNamespace(model=model, sample=sample, loss=loss)
