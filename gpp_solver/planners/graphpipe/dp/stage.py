"""A stage the GraphPipe DP chose (:class:`DPStage`), the DP's value encoding (devices, then stages),
the records of a DP pass (:class:`DPProbe`) and of one micro-batch size's tables (:class:`SizeTables`)
and the contiguous device ranges its stages get (:func:`assign_devices`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from gpp_solver.planners.graphpipe.dp.tree import INF

#: The DP's value is lexicographic: fewest devices, then fewest stages — each stage counts
#: ``devices << STAGE_BITS | 1`` (:func:`encode`), so among stagings with equal devices the sums
#: prefer fewer stages (fewer transfers and pipeline steps); :func:`decode` recovers the devices.
STAGE_BITS = 12


def encode(dev: np.ndarray) -> np.ndarray:
    return np.where(dev >= INF, INF, (dev << STAGE_BITS) + 1)


def decode(val):
    return np.where(np.asarray(val) >= INF, INF, np.asarray(val) >> STAGE_BITS)


@dataclass(frozen=True)
class DPStage:
    """One stage chosen by the DP: operators, data-parallel degree, depth (1 = sink) and the DP's
    TPS estimate (an upper bound of the exact figure)."""

    nodes: tuple[str, ...]
    degree: int
    depth: int
    tps_estimate: float
    first: int  # position of its first operator in the tree's leaf order


def power_of_two_degrees(limit: int) -> tuple[int, ...]:
    out, d = [], 1
    while d <= limit:
        out.append(d)
        d *= 2
    return tuple(out)


def assign_devices(stages: Sequence[DPStage], devices_per_node: int | None) -> list[tuple[int, ...]]:
    """Contiguous device ranges: largest degree first, then leaf order.

    With power-of-two degrees every range starts at a multiple of its size, so a stage whose
    degree divides ``devices_per_node`` sits inside one node (the DP's all-reduce estimate relies
    on this).  Neighbouring stages of equal degree get neighbouring devices.
    """
    order = sorted(range(len(stages)), key=lambda i: (-stages[i].degree, stages[i].first))
    out: list[tuple[int, ...]] = [()] * len(stages)
    nxt = 0
    for i in order:
        d = stages[i].degree
        out[i] = tuple(range(nxt, nxt + d))
        nxt += d
    return out


@dataclass(frozen=True)
class DPProbe:
    """One batched DP pass: ``devices[i, e]`` = fewest devices for ``pairs[i]`` at depth ``<= e``;
    ``kept`` the DP's tables for :meth:`StageDP.traceback` (``None`` when not kept)."""

    pairs: tuple[tuple[int, float], ...]
    devices: np.ndarray
    kept: tuple | None = None
    E: int | None = None  # the depth bound the pass ran under (``None``: the DP's own ``E``)
    sat: bool = False  # its depths saturated at ``E`` (StageDP.depth_cap)


@dataclass
class SizeTables:
    degrees: tuple[int, ...]
    tps: np.ndarray
    maxdepth: np.ndarray
    best: np.ndarray  # stage_tables.best_at_sink(tps, maxdepth): a target below leaves a segment INF
