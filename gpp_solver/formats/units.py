"""Quantities in human units: parse ``80GiB``, ``900GB/s``, ``200Gb/s``, ``10us``; format them back.

The JSON contracts hold plain numbers in bytes, bytes/s and seconds (``docs/formats.md``); these helpers
are for the command line only.  Decimal prefixes are powers of 1000 (``GB``, ``GB/s``), binary ones
powers of 1024 (``GiB``); a lower-case ``b`` is a bit (``Gb/s`` = 1e9 / 8 bytes/s).  A number
without a unit is taken in the base unit (bytes, bytes/s, seconds).  A bad or missing number, or an
unknown unit, raises :class:`~gpp_solver.errors.InvalidInputError` naming it and the valid units.
"""

from __future__ import annotations

import math
import re

from gpp_solver.errors import InvalidInputError

_DECIMAL = {"": 1, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}
_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}
#: unit -> (multiplier, divisor): exact factors, so that ``10us`` is exactly ``1e-05``
BYTE_UNITS = {f"{p}B": (f, 1) for p, f in (_DECIMAL | _BINARY).items()} | {
    f"{p}b": (f, 8) for p, f in _DECIMAL.items() if p
}
RATE_UNITS = {f"{u}/s": f for u, f in BYTE_UNITS.items()}
TIME_UNITS = {"s": (1, 1), "ms": (1, 10**3), "us": (1, 10**6), "µs": (1, 10**6), "ns": (1, 10**9)}

_NUMBER = re.compile(r"\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*(\S*)\s*")


def _parse(
    text: str, what: str, units: dict[str, tuple[int, int]], base: str, example: str, zero: bool = False
) -> float:
    m = _NUMBER.fullmatch(str(text))
    if m is None:
        raise InvalidInputError(f"{what}: expected a number with a unit such as {example}, got {text!r}")
    value, unit = float(m.group(1)), m.group(2)
    if unit != "" and unit not in units:
        order = sorted(units, key=lambda u: (units[u][0] / units[u][1], u))
        raise InvalidInputError(
            f"{what}: unknown unit {unit!r} in {text!r}; valid units: {', '.join(order)} (none = {base})"
        )
    mul, div = units.get(unit, (1, 1))
    v = value * mul / div
    if not math.isfinite(v) or v < 0 or (v == 0 and not zero):
        kind = "finite quantity >= 0" if zero else "positive finite quantity"
        raise InvalidInputError(f"{what}: expected a {kind}, got {text!r}")
    return v


def parse_bytes(text: str, what: str = "size") -> float:
    """``80GiB`` -> 85899345920.0; ``16GB`` -> 16e9; ``512`` -> 512.0 bytes."""
    return _parse(text, what, BYTE_UNITS, "bytes", "80GiB")


def parse_bandwidth(text: str, what: str = "bandwidth") -> float:
    """Bytes per second: ``900GB/s`` -> 9e11; ``200Gb/s`` -> 2.5e10 (bits); ``50e9`` -> 5e10."""
    return _parse(text, what, RATE_UNITS, "bytes/s", "900GB/s or 200Gb/s")


def parse_seconds(text: str, what: str = "time", zero: bool = False) -> float:
    """``10us`` -> 1e-5; ``2ms`` -> 0.002; ``0.5`` -> 0.5 seconds; ``0`` only with ``zero``."""
    return _parse(text, what, TIME_UNITS, "seconds", "10us", zero)


def format_bytes(n: float) -> str:
    """Binary prefixes, as memory is sold and shown by ``nvidia-smi``: ``17179869184`` -> ``16 GiB``."""
    for unit, f in (("TiB", 2.0**40), ("GiB", 2.0**30), ("MiB", 2.0**20), ("KiB", 2.0**10)):
        if n >= f:
            return f"{n / f:.4g} {unit}"
    return f"{n:.4g} B"


def format_bandwidth(bps: float) -> str:
    """Decimal prefixes, as links are specified: ``12.5e9`` -> ``12.5 GB/s``."""
    for unit, f in (("TB/s", 1e12), ("GB/s", 1e9), ("MB/s", 1e6), ("kB/s", 1e3)):
        if bps >= f:
            return f"{bps / f:.4g} {unit}"
    return f"{bps:.4g} B/s"


def format_seconds(t: float) -> str:
    """``1e-5`` -> ``10 µs``; ``0.25`` -> ``250 ms``; ``12`` -> ``12 s``."""
    for unit, f in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6)):
        if t >= f:
            return f"{t / f:.4g} {unit}"
    return f"{t / 1e-9:.4g} ns" if t > 0 else "0 s"


def plural(n: int, word: str, many: str | None = None) -> str:
    """``plural(1, "stage")`` -> ``1 stage``; ``plural(3, "stage")`` -> ``3 stages``."""
    return f"{n} {word if n == 1 else (many or word + 's')}"
