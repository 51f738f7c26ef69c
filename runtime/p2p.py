"""Point-to-point messages between ranks: non-blocking send/receive with a deadline.

Messages between two ranks are matched in posting order (the order ``actions.lower`` fixed and
checked), so no tags are used; that also holds for NCCL, which ignores tags.
"""

from __future__ import annotations

import datetime
import logging

import torch
import torch.distributed as dist

logger = logging.getLogger(__name__)


class CommTimeout(RuntimeError):
    """A peer did not answer within the process-group timeout (dead or stuck rank)."""


class P2P:
    """Posts isend/irecv and waits for them with ``timeout`` seconds as the limit."""

    def __init__(self, device: torch.device, timeout_s: float) -> None:
        self.device = device
        self.timeout = datetime.timedelta(seconds=timeout_s)
        self._sends: list[tuple[dist.Work, torch.Tensor, str]] = []

    def isend(self, tensor: torch.Tensor, dst: int, what: str) -> None:
        """Post a send; the tensor is kept alive until ``wait_sends``."""
        work = dist.isend(tensor, dst)
        self._sends.append((work, tensor, what))

    def irecv(self, shape: tuple[int, ...], dtype: torch.dtype, src: int) -> tuple[torch.Tensor, dist.Work]:
        """Post a receive into a fresh buffer; returns (buffer, work)."""
        buf = torch.empty(shape, dtype=dtype, device=self.device)
        return buf, dist.irecv(buf, src)

    def wait(self, work: dist.Work, what: str) -> None:
        """Wait for one posted operation; CommTimeout naming ``what`` if the peer fails."""
        try:
            work.wait(self.timeout)
        except Exception as exc:  # noqa: BLE001 - backends raise RuntimeError / DistBackendError
            raise CommTimeout(f"{what} failed or timed out after {self.timeout.total_seconds():g} s "
                              f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})") from exc

    def wait_sends(self) -> None:
        """Wait for every send posted since the last call."""
        sends, self._sends = self._sends, []
        for work, _t, what in sends:
            self.wait(work, what)
