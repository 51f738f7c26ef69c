"""How sure a profile is: signs that it was measured while something else ran on the machine.

A profile taken beside other work describes a slower, or unevenly slower, device than the one the
ranks will train on, and a plan made from it can be the wrong one (a profile taken beside a test
run once rose from 3.7 to 5.5 ms per sample between 2 and 4 samples, and its plan was 2x slower
than one that fit). Three signs, each per micro-batch size:

- **rounds that disagree**: the profiler sweeps every size ``--rounds`` times (and each concurrent
  worker does); a size whose rounds' summed times differ by more than :data:`ROUND_SPREAD` of
  their median was measured while the machine's speed moved;
- **per-sample time rising with the size**: the model's time per sample at a larger size more than
  :data:`PER_SAMPLE_RISE` (or twice the rounds' spread, if larger) above a smaller size's: batching
  amortises, it does not cost more per sample, beyond noise;
- **an in-situ step far from the sum of its parts**: the in-situ calibration's factor (the one-stage
  step's forward or backward over the sum of the node times, ``gpp_runtime.calibration.insitu``)
  at a size outside :data:`IN_SITU_RANGE` times its median over the sizes: the runtime's own cost
  moves the factors together (tens of percent on a quiet machine, up to 2x for a tiny model), a
  machine whose speed moved between the node timings and the step moves them apart (factors of
  5.2 at one sample and 0.2 at 64 were seen beside a test run).

:func:`assess` returns what ``extra.profile.quality`` records: the largest spread of the rounds,
the sizes that look wrong and why. ``gpp_runtime.profile`` warns in one line naming them (with
``--again`` it first measures once more and keeps the profile with fewer such sizes); ``gpp plan``
shows the record under the plan's summary.
"""

from __future__ import annotations

import statistics

#: rounds of one size more than this far apart (max - min over their median)
ROUND_SPREAD = 0.15
#: per-sample time at a larger size more than this above a smaller size's
PER_SAMPLE_RISE = 0.25
#: an in-situ factor outside this range times the median of its kind's factors over the sizes
IN_SITU_RANGE = (0.67, 1.5)


def assess(doc: dict) -> dict:
    """The quality record of a ``gpp-graph/1`` profile (module docstring)."""
    sizes = doc["micro_batch_sizes"]
    info = doc.get("extra", {}).get("profile", {})
    reasons: list[str] = []
    suspect: set[int] = set()
    spread = _round_spread(info.get("round_totals"), len(sizes))
    for b, s in zip(sizes, spread):
        if s > ROUND_SPREAD:
            suspect.add(b)
            reasons.append(f"its rounds at {b} differ by {s:.0%}")
    per_sample = [sum(n["fw_time"][i] + n["bw_time"][i] for n in doc["nodes"]) / b for i, b in enumerate(sizes)]
    for j in range(1, len(sizes)):
        i = min(range(j), key=per_sample.__getitem__)  # the cheapest smaller size
        allowed = max(PER_SAMPLE_RISE, 2 * max(spread[i], spread[j]))
        if per_sample[i] > 0 and per_sample[j] > per_sample[i] * (1 + allowed):
            suspect.add(sizes[j])
            reasons.append(
                f"its time per sample at {sizes[j]} is {per_sample[j] / per_sample[i]:.2f}x that at {sizes[i]}"
            )
    lo, hi = IN_SITU_RANGE
    for scale in _in_situ_scales(info.get("in_situ")):
        for kind in ("fw", "bw"):
            factors = [k for k in scale.get(kind, []) if k > 0]
            med = statistics.median(factors) if factors else 0.0
            for b, k in zip(sizes, scale.get(kind, [])):
                if med > 0 and not lo <= k / med <= hi and b not in suspect:
                    suspect.add(b)
                    reasons.append(
                        f"its one-stage {kind} step at {b} ran {k:.2f}x the sum of its node times "
                        f"(median over the sizes {med:.2f}x)"
                    )
    return {
        "round_spread": max(spread, default=0.0),
        "suspect_sizes": sorted(suspect),
        "reasons": reasons,
    }


def _round_spread(totals, n: int) -> list[float]:
    """Per size, (max - min) / median of its rounds' totals (0 where fewer than two rounds)."""
    out = []
    for ts in (totals or [[]] * n)[:n]:
        med = statistics.median(ts) if ts else 0.0
        out.append((max(ts) - min(ts)) / med if len(ts) > 1 and med > 0 else 0.0)
    return out + [0.0] * (n - len(out))


def _in_situ_scales(record) -> list[dict]:
    """The in-situ factors of a profile (one record, or one per concurrent worker)."""
    if not record:
        return []
    records = record.get("workers", [record])
    return [r["scale"] for r in records if r and "scale" in r]
