"""The numeric kernel shared by the sequential-pipeline baselines: PipeDream's min-max DP.

``A[i, j, m]`` is the smallest bottleneck (largest stage time) of a chain of stages covering the
states between start ``starts[i]`` (exclusive) and state ``j`` (inclusive) on exactly ``m``
devices (or at most ``m`` with ``allow_fewer``), PipeDream §3.1::

    A[i, j, m] = min over states k (start ⊆ k ⊊ j) and replicas m' <= m of
                 max(A[i, k, m - m'], T(m, m')[k, j])

with ``A[i, starts[i], 0] = 0``, so ``k = start, m' = m`` is PipeDream's single-stage
initialisation.  ``T(m, m')`` is an ``S x S`` array of stage times (``inf`` where a stage is not
allowed, e.g. out of memory); entries with ``k`` not a strict subset of ``j`` are ignored.
The kernel is pure numpy, vectorised over ``(i, k, j)``, and knows nothing of graphs.  With a
``deadline`` (a ``time.perf_counter()`` value) it checks the clock before every ``(m, r)`` step and
raises :class:`DeadlineReached` past it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from gpp_solver.errors import TimeLimitError

INF = float("inf")
_CHUNK_ELEMS = 4_000_000


class DeadlineReached(TimeLimitError):
    """The deadline passed while the DP table was being filled (no table)."""


@dataclass(frozen=True)
class DPTable:
    """``value[i, j, m]``; ``arg_k``/``arg_r`` the last stage's start state and replicas
    (``arg_r == 0``: the value is the one with ``m - 1`` devices, i.e. a device left idle)."""

    starts: tuple[int, ...]
    value: np.ndarray
    arg_k: np.ndarray
    arg_r: np.ndarray

    def row(self, start: int) -> int:
        return self.starts.index(start)

    def stages(self, start: int, end: int, devices: int) -> list[tuple[int, int, int]]:
        """The chain ``[(k, j, replicas), ...]`` (in order) behind ``value[start, end, devices]``."""
        i = self.row(start)
        if not np.isfinite(self.value[i, end, devices]):
            raise ValueError(f"no finite solution for states ({start}, {end}] on {devices} devices")
        out = []
        j, m = end, devices
        while j != start:
            r = int(self.arg_r[i, j, m])
            if r == 0:
                m -= 1
                continue
            k = int(self.arg_k[i, j, m])
            out.append((k, j, r))
            j, m = k, m - r
        return out[::-1]


def minmax_dp(
    subset: np.ndarray,
    stage_time: Callable[[int, int], np.ndarray],
    devices: int,
    *,
    starts: Sequence[int] = (0,),
    allow_fewer: bool = False,
    replicas: Sequence[int] | None = None,
    deadline: float | None = None,
) -> DPTable:
    """Fill the table for ``1..devices`` devices (see the module docstring).

    ``replicas``: the only replica counts ``stage_time`` may give finite times for (others are
    skipped without calling it); default every count."""
    allowed = None if replicas is None else set(int(r) for r in replicas)
    S = subset.shape[0]
    starts = tuple(starts)
    n_starts = len(starts)
    val = np.full((n_starts, S, devices + 1), INF)
    arg_k = np.full((n_starts, S, devices + 1), -1, dtype=np.int64)
    arg_r = np.zeros((n_starts, S, devices + 1), dtype=np.int64)
    val[np.arange(n_starts), list(starts), 0] = 0.0
    chunk = max(1, _CHUNK_ELEMS // max(1, S * S))
    for m in range(1, devices + 1):
        best = np.full((n_starts, S), INF)
        bk = np.full((n_starts, S), -1, dtype=np.int64)
        br = np.zeros((n_starts, S), dtype=np.int64)
        for r in range(1, m + 1):
            if allowed is not None and r not in allowed:
                continue
            if deadline is not None and time.perf_counter() > deadline:
                raise DeadlineReached(f"the min-max DP reached its deadline at {m} of {devices} devices")
            T = np.where(subset, stage_time(m, r), INF)
            prev = val[:, :, m - r]
            for lo in range(0, n_starts, chunk):
                p = prev[lo : lo + chunk]
                live = np.isfinite(p).any(axis=0)  # only states some start can reach
                if not live.any():
                    continue
                ks = np.nonzero(live)[0]
                js = np.nonzero(np.isfinite(T[ks]).any(axis=0))[0]  # states some live k reaches
                if not js.size:
                    continue
                X = np.maximum(p[:, ks, None], T[np.ix_(ks, js)][None, :, :])  # (c, k, j)
                kk = X.argmin(axis=1)
                v = np.take_along_axis(X, kk[:, None, :], axis=1)[:, 0, :]
                cur = best[lo : lo + chunk, js]
                better = v < cur
                rows, cols = np.nonzero(better)
                best[lo + rows, js[cols]] = v[rows, cols]
                bk[lo + rows, js[cols]] = ks[kk[rows, cols]]
                br[lo + rows, js[cols]] = r
        if allow_fewer:
            fewer = val[:, :, m - 1] <= best
            best = np.where(fewer, val[:, :, m - 1], best)
            br = np.where(fewer, 0, br)
        val[:, :, m] = best
        arg_k[:, :, m] = bk
        arg_r[:, :, m] = br
    return DPTable(starts, val, arg_k, arg_r)
