"""Supported ranges of every quantity a graph or a cluster carries.

They bound what the formats accept, so that whatever a planner computes from the figures
(products over a mini-batch, a stage, a cluster) stays a finite float: a value outside them is
rejected by name instead of becoming ``inf``/``nan`` inside a planner.
"""

from __future__ import annotations

#: Largest byte count (weights, activations, outputs, device memory): one exabyte.
MAX_BYTES = 1e18
#: Largest time (seconds) of one operation, and largest latency: about 31 years.
MAX_SECONDS = 1e9
#: Smallest non-zero time (seconds); a smaller positive time is a unit mistake, and its
#: reciprocals (throughput) overflow.
MIN_SECONDS = 1e-15
#: Bandwidth range, bytes/s.
MIN_BANDWIDTH, MAX_BANDWIDTH = 1.0, 1e18
#: Largest integer count (devices, samples of a mini-batch or micro-batch).
MAX_COUNT = 2**20
#: Largest optimizer-state factor (bytes of state per byte of weights).
MAX_FACTOR = 1e6
