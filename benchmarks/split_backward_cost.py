"""What a split backward (B then W, ``gpp_runtime.engine.split_backward``) costs against one full
backward, on a middle stage (its input needs a gradient) of small real models, and what the
re-running split (W as ``torch.autograd.backward(roots, inputs=params)`` after B, which runs the
input-gradient part of every operator between the roots and the weighted operators again) cost.

    python benchmarks/split_backward_cost.py [--repeats 30] [--threads 1]

Prints one row per model: the median times (ms) of the full backward, of B + W, and of B + W
re-running, and the ratios to the full backward. The three are timed in turn within each repeat
(the same forward each), so load on the machine hits them alike; compare ratios, not times.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpp_runtime.capture.third_party import import_transformers  # noqa: E402
from gpp_runtime.engine.split_backward import backward_input, backward_weight  # noqa: E402


def mlp(width: int = 512, layers: int = 4, rows: int = 64):
    mods = [m for _ in range(layers) for m in (nn.Linear(width, width), nn.GELU())]
    return nn.Sequential(*mods), (rows, width)


def bert_layers(hidden: int = 256, layers: int = 2, rows: int = 8, seq: int = 64):
    import_transformers()
    from transformers import BertConfig
    from transformers.models.bert.modeling_bert import BertLayer

    cfg = BertConfig(hidden_size=hidden, num_attention_heads=4, intermediate_size=4 * hidden, hidden_dropout_prob=0.0)
    cfg.attention_probs_dropout_prob = 0.0
    cfg._attn_implementation = "eager"
    blocks = nn.ModuleList(BertLayer(cfg) for _ in range(layers))

    class Stage(nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = blocks

        def forward(self, x):
            for b in self.blocks:
                y = b(x)
                x = y[0] if isinstance(y, tuple) else y
            return x

    return Stage(), (rows, seq, hidden)


MODELS = {"mlp 4 x (Linear 512 + GELU), 64 rows": mlp, "BERT 2 layers, hidden 256, 8 x 64 tokens": bert_layers}


def _forward(model, shape, seed):
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).requires_grad_(True)
    out = model(x)
    return x, out, torch.ones_like(out)


def _full(model, x, out, g):
    torch.autograd.backward([out], [g])


def _split(model, x, out, g):
    _, pending = backward_input([out], [g], [x], list(model.parameters()))
    backward_weight(pending)


def _rerun(model, x, out, g):
    torch.autograd.grad([out], [x], [g], retain_graph=True)
    torch.autograd.backward([out], [g], inputs=list(model.parameters()))


def measure(model, shape, repeats: int) -> dict[str, float]:
    kinds = {"full": _full, "B+W": _split, "B+W re-run": _rerun}
    times: dict[str, list[float]] = {k: [] for k in kinds}
    for i in range(repeats + 3):
        for name, fn in kinds.items():
            model.zero_grad(set_to_none=True)
            x, out, g = _forward(model, shape, i)
            t0 = time.perf_counter()
            fn(model, x, out, g)
            if i >= 3:
                times[name].append(time.perf_counter() - t0)
    return {k: statistics.median(v) * 1e3 for k, v in times.items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    args = ap.parse_args(argv)
    torch.manual_seed(0)
    torch.set_num_threads(args.threads)
    print(f"{'stage':44} {'full ms':>8} {'B+W ms':>8} {'re-run ms':>9} {'B+W/full':>9} {'re-run/full':>11}")
    for name, make in MODELS.items():
        model, shape = make()
        t = measure(model, shape, args.repeats)
        print(
            f"{name:44} {t['full']:8.2f} {t['B+W']:8.2f} {t['B+W re-run']:9.2f} "
            f"{t['B+W'] / t['full']:9.2f} {t['B+W re-run'] / t['full']:11.2f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
