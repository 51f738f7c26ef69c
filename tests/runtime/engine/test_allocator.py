"""The CPU allocator keeps freed memory for reuse (gpp_runtime.engine.allocator), as the profile runs it."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from gpp_runtime.engine.memory import default_memory_step

#: a child process: optionally keep freed memory, then allocate and free 256 MiB in 1 MiB tensors
#: (kept alive together, as a step's activations are) and print the resident memory after the free
CHILD = textwrap.dedent(
    """
    import os, sys, torch
    from gpp_runtime.engine.allocator import keep_freed_memory
    ok = keep_freed_memory() if sys.argv[1] == "keep" else None
    def rss():
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    before = rss()
    held = [torch.ones(2**17, dtype=torch.float64) for _ in range(256)]
    del held
    print(ok, rss() - before)
    """
)


def _kept_after_free(mode: str) -> tuple[str, int]:
    out = subprocess.run([sys.executable, "-c", CHILD, mode], capture_output=True, text=True, check=True).stdout
    ok, kept = out.split()
    return ok, int(kept)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_freed_memory_stays_for_reuse():
    ok, kept = _kept_after_free("keep")
    assert ok == "True"
    assert kept > 200 * 2**20  # the 256 MiB freed stays in the process, ready for the next step
    _ok, default = _kept_after_free("default")
    assert default < 64 * 2**20  # glibc's defaults give it back to the kernel


def test_the_default_memory_step_stays_in_the_warm_up():
    # the measured step (>= 1: the optimizer's state exists) and the next one, which processes the
    # profile, are warm-up steps whenever there are 3 or more
    for warmup in range(3, 8):
        step = default_memory_step(warmup)
        assert 1 <= step and step + 1 <= warmup - 1
    assert default_memory_step(1) == default_memory_step(2) == 1
