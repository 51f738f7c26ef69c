"""How ``gpp_runtime.probe`` takes and reduces its timings: the sizes in turns, the typical time of a
message, and the fits of the point-to-point (affine) and all-reduce (ring) models to the times per
size."""

from __future__ import annotations

import statistics


def typical(times: list[float]) -> float:
    """The mean of the middle 80% of ``times`` (the fastest and slowest tenth left out, none of
    fewer than 10): the expected time of a message in a step, robust to a one-off stall."""
    if not times:
        raise ValueError("typical() of no times")
    v = sorted(times)
    k = len(v) // 10
    return statistics.fmean(v[k : len(v) - k])


def in_turns(items: list, warmup: int, repeats: int, once) -> list[float]:
    """The typical time (:func:`typical`) of ``once(item)`` (which returns seconds) for each item,
    the items taking turns within each repeat, so that a slow minute of the machine weighs on every
    size alike, not on a fit's slope; the first ``warmup`` repeats are left out."""
    times: list[list[float]] = [[] for _ in items]
    for i in range(warmup + repeats):
        for item, ts in zip(items, times):
            t = once(item)
            if i >= warmup:
                ts.append(t)
    return [typical(ts) for ts in times]


def affine_fit(sizes: list[int], one_way: list[float]) -> tuple[float, float]:
    """``(latency, bandwidth)`` from one-way times: latency at the smallest size, slope to the largest.

    A noisy measurement (a loaded machine) can make the largest transfer look no slower than the
    smallest; the bandwidth is then the largest size over its whole one-way time, a conservative
    figure (it charges the latency as transfer time), never an unbounded one."""
    lat = max(one_way[0], 0.0)
    dt = one_way[-1] - one_way[0]
    if dt > 0:
        return lat, (sizes[-1] - sizes[0]) / dt
    return lat, sizes[-1] / one_way[-1] if one_way[-1] > 0 else float("inf")


def ring_fit(sizes: list[int], seconds: list[float], n: int) -> tuple[float, float]:
    """``(latency per step, bandwidth)`` of the ring all-reduce among ``n`` ranks from its times at
    ``sizes`` bytes: ``t = 2 (n-1) latency + 2 (n-1)/n * bytes / bandwidth``, fitted by least
    squares of the *relative* error over every size (each residual divided by its time), so that
    the small all-reduces of small stages hold as well as the large ones: a plain fit, ruled by the
    largest sizes, put gloo's 4-byte all-reduce on two CPU ranks at 0.18 ms against 0.32 ms measured.
    When noise makes the fitted slope non-positive, the bandwidth is the largest size over its whole
    time (conservative, never unbounded); the latency is never negative."""
    steps, share = 2 * (n - 1), 2 * (n - 1) / n
    w = [1.0 / (y * y) if y > 0 else 0.0 for y in seconds]
    sw = sum(w)
    mx = sum(wi * x for wi, x in zip(w, sizes)) / sw if sw > 0 else 0.0
    my = sum(wi * y for wi, y in zip(w, seconds)) / sw if sw > 0 else 0.0
    sxx = sum(wi * (x - mx) ** 2 for wi, x in zip(w, sizes))
    slope = sum(wi * (x - mx) * (y - my) for wi, x, y in zip(w, sizes, seconds)) / sxx if sxx > 0 else 0.0
    if slope > 0:
        return max(0.0, my - slope * mx) / steps, share / slope
    bw = share * sizes[-1] / seconds[-1] if seconds[-1] > 0 else float("inf")
    return max(0.0, seconds[0] - share * sizes[0] / bw) / steps, bw
