"""``--mode cpu`` of ``benchmarks/cost_model_fidelity.py``: real models profiled and trained on CPU cores.

Memory: each plan trains with ``--graph`` and ``--cluster``, so every rank reports its measured
peak beside the cost model's prediction for the optimizer used (``gpp_runtime.train``'s ``ranks``);
``memory_summary`` gives the range of measured / predicted over the ranks and the ranks outside
the targets (measured <= 1.05 x predicted, predicted <= 1.25 x measured).

Why every core is kept busy. This machine's cores are not independent devices: on the 2-vCPU VM
this was written on, one single-threaded 256x256 float32 matmul loop took 344 us per matmul alone
and 620 us in each of two loops run at once (``runtime/cores.py``). Profiled by one process alone,
every 1-rank plan held (-5..+10%) and every 2-rank plan ran +12..+102% slow (stage busy +18..+50%):
the profile described a faster device than each of two concurrent ranks gets. So, with
``--fill-cores unused`` (the default):

- the profile is ``gpp_runtime.profile --concurrent C`` with C = every core this process may use:
  C pinned profilers at once, one thread each, each node's median of their medians;
- each rank is pinned to its own core (``gpp_runtime.train --pin-cores``), one thread;
- every core the plan does not use runs a pinned filler (``python -m gpp_runtime.cores``: the
  model's forward and backward in a loop, one thread, at the plan's largest micro-batch).
  ``none`` profiles one process alone and fills nothing.

What is left: while a rank waits (a pipeline bubble, a receive, the all-reduce) its core idles,
so the other ranks briefly run on a faster device than the profile's. Filling the ranks' own
cores too, with ``SCHED_IDLE`` fillers that take a core only while its rank waits, was tried and
dropped: on a 2-rank data-parallel plan of ``examples.sequential:workload`` it made gloo's
all-reduce 4-7x slower (1.5 -> 10 ms per step), the woken rank and gloo's threads waiting behind
the filler.

No figure is scaled: the profile and the training both run on "one core while the others work".
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# (MODULE:FN, mini-batch): predicted iteration times from a few ms (bert_tiny, two_tower) to a
# few hundred ms (resnet18, googlenet at 32x32 float64) on one EPYC core
CPU_MODELS = [
    ("examples.real_models:two_tower", 32),
    ("examples.real_models:bert_tiny", 32),
    ("examples.sequential:bench", 128),
    ("examples.two_branch:bench", 128),
    ("examples.real_models:googlenet", 4),
    ("examples.real_models:resnet18", 8),
    # models the project did not write and tests nowhere else: torchvision's
    # mobilenet_v3_small and a HuggingFace CLIP (two towers, text and image)
    ("examples.real_models:mobilenet_v3_small", 8),
    ("examples.real_models:clip_tiny", 32),
]
QUICK_CPU_MODELS = [("examples.sequential:workload", 8)]
FILL = ("unused", "none")


def model_specs(models: str | None, batch: int | None, quick: bool) -> list[tuple[str, int]]:
    """``MODULE:FN[@BATCH],...`` (``--models``) or the defaults; ``--batch`` overrides every batch."""
    if not models:
        specs = QUICK_CPU_MODELS if quick else CPU_MODELS
    else:
        specs = []
        for item in models.split(","):
            spec, _, b = item.partition("@")
            if ":" not in spec or (b and not b.isdigit()) or b == "0":
                raise ValueError(f"--models: expected MODULE:FUNCTION[@BATCH], got {item!r}")
            specs.append((spec, int(b) if b else 128))
    return [(s, batch or b) for s, b in specs]


def profile_sizes(batch: int) -> list[int]:
    """The micro-batch sizes profiled for a mini-batch of ``batch``: the powers of two below it and
    the batch itself, so that no plan's micro-batch is priced beyond the profile (above its largest
    size the graph format extrapolates at constant time per sample: on a GPU, where a small
    model's step is launch-bound, that priced BERT tiny at 512 samples 3x its measured time)."""
    return sorted({b for b in (2**i for i in range(batch.bit_length())) if b <= batch} | {batch})


def env() -> dict:
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]),
        "OMP_NUM_THREADS": "1",
    }


def n_cores() -> int:
    return len(os.sched_getaffinity(0))


def cpu_models(args, work: Path) -> list[tuple[str, dict, str, dict, int]]:
    """(label, profiled graph, MODULE:FN, env, mini-batch) per model."""
    concurrent = n_cores() if args.fill_cores != "none" and args.backend == "gloo" else 1
    out = []
    for spec, batch in model_specs(args.models, args.batch, args.quick):
        label = spec.removeprefix("examples.").replace(":", "-") + f"@{batch}"
        path = work / f"graph-{label}.json"
        sizes = ",".join(str(b) for b in profile_sizes(batch))
        cmd = [
            sys.executable,
            "-m",
            "gpp_runtime.profile",
            "--model",
            spec,
            "--micro-batch-sizes",
            sizes,
            "-o",
            str(path),
            "--threads",
            "1",
            "--concurrent",
            str(concurrent),
        ] + (["--cpu"] if args.backend == "gloo" else [])  # nccl: profiled on the GPU the ranks train on
        cmd += getattr(args, "profile_flags", [])
        res = subprocess.run(cmd, cwd=REPO, env=env(), capture_output=True, text=True)
        if res.returncode != 0:
            raise RuntimeError(f"profiling {spec} failed: {res.stderr.strip()[-300:]}")
        out.append((label, json.loads(path.read_text()), spec, {}, batch))
    return out


def train_flags(args) -> list[str]:
    """``gpp_runtime.train`` flags of cpu mode (none in emulated mode: its ranks sleep, 8 on 2 cores)."""
    return ["--pin-cores"] if args.mode == "cpu" and args.fill_cores != "none" and args.backend == "gloo" else []


@contextlib.contextmanager
def fillers(args, spec: str, used: int, micro_batch: int):
    """Pinned fillers on the cores a plan of ``used`` ranks leaves."""
    if args.mode != "cpu" or args.backend != "gloo" or args.fill_cores == "none":
        yield
        return
    procs = []
    try:
        for core in range(used, n_cores()):
            cmd = [
                sys.executable,
                "-m",
                "gpp_runtime.cores",
                "--model",
                spec,
                "--core",
                str(core),
                "--batch",
                str(micro_batch),
                "--precision",  # the kernels the ranks beside it run (fidelity_heldout --precision)
                getattr(args, "precision", "float32"),
            ]
            procs.append(
                subprocess.Popen(cmd, cwd=REPO, env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            )
        for p in procs:  # each prints "ready" after its first forward and backward
            if p.stdout.readline().strip() != "ready":
                raise RuntimeError(f"filler failed: {(p.stderr.read().strip().splitlines() or ['?'])[-1]}")
        yield
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait()


def memory_summary(rows: list[dict]) -> dict:
    """Measured / predicted peak memory over every rank of the distinct measured plans: the range,
    and the ranks outside the targets (measured > 1.05 x predicted: an out-of-memory surprise;
    predicted > 1.25 x measured: devices wasted)."""
    ratios = [
        m["peak_memory_bytes"] / m["predicted_peak_memory_bytes"]
        for r in rows
        if not r.get("same_as")
        for m in r.get("memory", [])
        if m.get("peak_memory_bytes") and m.get("predicted_peak_memory_bytes")
    ]
    return {
        "ranks": len(ratios),
        "min_ratio": min(ratios, default=float("nan")),
        "max_ratio": max(ratios, default=float("nan")),
        "over_1_05": sum(x > 1.05 for x in ratios),
        "under_0_8": sum(x * 1.25 < 1 for x in ratios),
    }


def memory_cell(r: dict) -> str:
    """The rank whose measured / predicted peak memory is the largest: ``measured / predicted MB (ratio)``."""
    ms = [m for m in r.get("memory", []) if m.get("peak_memory_bytes") and m.get("predicted_peak_memory_bytes")]
    if not ms:
        return "-"
    m = max(ms, key=lambda m: m["peak_memory_bytes"] / m["predicted_peak_memory_bytes"])
    meas, pred = m["peak_memory_bytes"], m["predicted_peak_memory_bytes"]
    return f"{meas / 1e6:.2f} / {pred / 1e6:.2f} ({meas / pred:.3f})"
