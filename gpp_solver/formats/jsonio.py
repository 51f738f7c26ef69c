"""Small shared helpers for reading JSON documents and checking fields with clear messages."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Type

from gpp_solver.errors import InvalidInputError


def read_json(path: str | Path, what: str, error: Type[InvalidInputError]) -> Any:
    """Load a JSON file, turning a missing file or bad JSON into one clear ``error``."""
    p = Path(path)
    try:
        text = p.read_text()
    except FileNotFoundError:
        raise error(f"{what} file not found: {p}") from None
    except OSError as exc:
        raise error(f"cannot read {what} file {p}: {exc.strerror}") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise error(f"{what} file {p} is not JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None


def write_json(obj: Any, path: str | Path) -> None:
    Path(path).write_text(json.dumps(obj, indent=1) + "\n")


def require(d: Any, key: str, where: str, error: Type[InvalidInputError]) -> Any:
    if not isinstance(d, dict):
        raise error(f"{where} must be a JSON object, got {type(d).__name__}")
    if key not in d:
        raise error(f"{where}: missing field '{key}'")
    return d[key]


def number(value: Any, where: str, error: Type[InvalidInputError], *, positive: bool = False,
           allow_zero: bool = True) -> float:
    """A finite, non-negative JSON number (bools and strings rejected)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise error(f"{where} must be a number, got {value!r}")
    v = float(value)
    if not math.isfinite(v):
        raise error(f"{where} must be finite, got {value!r}")
    if v < 0:
        raise error(f"{where} must be non-negative, got {value!r}")
    if positive and v <= 0:
        raise error(f"{where} must be positive, got {value!r}")
    return v


def integer(value: Any, where: str, error: Type[InvalidInputError], *, minimum: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (
            isinstance(value, float) and not value.is_integer()):
        raise error(f"{where} must be an integer, got {value!r}")
    v = int(value)
    if minimum is not None and v < minimum:
        raise error(f"{where} must be at least {minimum}, got {value!r}")
    return v
