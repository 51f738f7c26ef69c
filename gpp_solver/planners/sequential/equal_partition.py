"""PipeDream-2BW's cut of a chain into ``w`` parts of equal weight: each cut at the prefix sum
nearest to ``i * total / w`` (:func:`equal_partition`), vectorised, with the direct scan
(:func:`_equal_partition_loop`) as its reference and fallback."""

from __future__ import annotations

import numpy as np

from gpp_solver.errors import InvalidInputError


def _equal_partition_loop(prefix: np.ndarray, n: int, w: int) -> list[int]:
    total = prefix[-1]
    cuts = [0]
    for i in range(1, w):
        lo, hi = cuts[-1] + 1, n - (w - i)  # leave one item for each later part
        target = total * i / w
        cand = np.arange(lo, hi + 1)
        cuts.append(int(cand[np.argmin(np.abs(prefix[cand] - target))]))
    cuts.append(n)
    return cuts


def equal_partition(weights: list[float], w: int) -> list[int]:
    """Cut points ``0 = c_0 < c_1 < ... < c_w = n`` so every part has one or more items and part
    sums are near ``total / w`` (each cut at the prefix sum nearest to ``i * total / w``: the first
    index of ``[c_{i-1} + 1, n - (w - i)]`` minimising ``|prefix - i * total / w|``).

    With non-negative weights the prefix sums are non-decreasing, so ``|prefix - target|`` falls
    then rises: the first minimiser over all of ``[0, n]`` is the first index ``k`` with
    ``prefix[k] >= target`` or the one before it (found for every cut at once by ``searchsorted``),
    and when it lies in the cut's allowed range it is also the first minimiser there.  Cuts where
    it does not (or where ``k - 1`` ties with ``k - 2``, so the first minimiser might lie further
    left) are found by the direct scan, so the cuts are exactly the scan's."""
    n = len(weights)
    if not 1 <= w <= n:
        raise InvalidInputError(f"`1 <= w <= number of nodes` must hold, but got (w={w}, nodes={n})")
    wt = np.asarray(weights, dtype=np.float64)
    prefix = np.concatenate([[0.0], np.cumsum(wt)])
    if w == 1:
        return [0, n]
    if not bool(np.all(wt >= 0.0)):
        return _equal_partition_loop(prefix, n, w)
    total = prefix[-1]
    targets = total * np.arange(1, w, dtype=np.float64) / w  # the same operations as total * i / w
    k = np.searchsorted(prefix, targets, side="left")  # first prefix >= target (n + 1: none)
    km1 = np.maximum(k - 1, 0)
    v_k = np.where(k <= n, np.abs(prefix[np.minimum(k, n)] - targets), np.inf)
    v_km1 = np.where(k >= 1, np.abs(prefix[km1] - targets), np.inf)
    v_km2 = np.where(k >= 2, np.abs(prefix[np.maximum(k - 2, 0)] - targets), np.inf)
    left = v_km1 <= v_k  # ties: the earlier index
    first_a = np.where(left, km1, k)
    sure_a = ~left | (k == 1) | (v_km2 > v_km1)  # nothing further left ties
    # The first minimiser g over all of [0, n]: k when k - 1 is farther; else the first index j0
    # holding prefix[k - 1]'s value, provided the index before j0 is strictly farther (rounded
    # target - prefix does not increase with prefix, so nothing further left ties either).  From
    # g on, |prefix - target| does not decrease, so the first minimiser over [lo, hi] with
    # lo = previous cut + 1 is max(g, lo) while that is at most hi = n - (w - i): the cuts are
    # c_i = i + max(0, max_{j <= i} (g_j - j)), a running maximum.  Where a cut is lo > j0 the
    # tie test is not needed (the true first minimiser is at most j0).  The loop below takes
    # exactly these cuts; it runs only when some cut is not settled this way.  Once a cut's
    # max(g, lo) passes hi, every later range is the single point hi; at the first such cut the
    # function does not increase on [lo, hi] (hi < g, g known), so the cut is hi when hi - 1 is
    # strictly farther (or lo = hi).
    j0 = np.searchsorted(prefix, prefix[km1], side="left")
    v_before = np.where(j0 >= 1, np.abs(prefix[np.maximum(j0 - 1, 0)] - targets), np.inf)
    known = ~left | (v_before > v_km1)
    glob = np.where(left, j0, k)
    i_ar = np.arange(1, w)
    c = i_ar + np.maximum(np.maximum.accumulate(glob - i_ar), 0)
    hi_ar = n - w + i_ar
    over = c > hi_ar
    ok = bool(np.all(known | (c > j0) | over))
    if ok and bool(over.any()):
        f = int(np.argmax(over))
        lo, hi = (int(c[f - 1]) + 1 if f else 1), int(hi_ar[f])
        t = targets[f]
        ok = lo == hi or (bool(known[f]) and abs(prefix[hi - 1] - t) > abs(prefix[hi] - t))
    if ok:
        return [0, *np.minimum(c, hi_ar).tolist(), n]
    first, sure = first_a.tolist(), sure_a.tolist()
    cuts = [0]
    for i in range(1, w):
        lo, hi = cuts[-1] + 1, n - (w - i)
        j = first[i - 1]
        if sure[i - 1] and lo <= j <= hi:
            cuts.append(j)
        else:
            cand = np.arange(lo, hi + 1)
            cuts.append(int(cand[np.argmin(np.abs(prefix[cand] - total * i / w))]))
    cuts.append(n)
    return cuts
