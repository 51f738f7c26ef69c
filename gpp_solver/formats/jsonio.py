"""Small shared helpers for reading JSON documents and checking fields with clear messages.

Reading never lets a malformed file through as a traceback: a file that is not UTF-8, not JSON,
nested deeper than :data:`MAX_DEPTH`, or that holds a number no float can represent (``NaN``,
``Infinity``, ``1e400``, an integer of more than 308 digits) is one :class:`InvalidInputError`
naming the file and, for numbers, the JSON path of the value.

The supported ranges the field checks are given (``MAX_BYTES``, ``MAX_SECONDS``, ...) are
:mod:`gpp_solver.limits`.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from gpp_solver.errors import InvalidInputError, show

#: Deepest nesting of arrays/objects a document may have.
MAX_DEPTH = 64


class _Unrepresentable:
    """A JSON number no float holds (kept as text so the error can name the field)."""

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        t = self.text
        return t if len(t) <= 24 else f"{t[:12]}...({len(t)} characters)"


def _parse_int(text: str) -> Any:
    return _Unrepresentable(text) if len(text.lstrip("-")) > 308 else int(text)


def _parse_float(text: str) -> Any:
    v = float(text)
    return v if math.isfinite(v) else _Unrepresentable(text)


def _parse_constant(text: str) -> Any:
    return _Unrepresentable(text)


def _check_tree(doc: Any, what: str, p: Path | str, error: type[InvalidInputError]) -> None:
    """Iteratively: depth <= MAX_DEPTH and no unrepresentable number (named by its JSON path)."""
    stack: list[tuple[Any, str, int]] = [(doc, "", 0)]
    while stack:
        v, path, depth = stack.pop()
        if isinstance(v, _Unrepresentable):
            raise error(
                f"{what} file {p}: {path.lstrip('.') or 'the document'} = {v!r} is not a finite "
                f"number a float can hold (at most about 1.8e308 in magnitude)"
            )
        if isinstance(v, (dict, list)):
            if depth >= MAX_DEPTH:
                raise error(f"{what} file {p}: nested deeper than {MAX_DEPTH} levels at {path.lstrip('.') or '/'}")
            items = v.items() if isinstance(v, dict) else enumerate(v)
            for k, x in items:
                stack.append((x, f"{path}.{k}" if isinstance(v, dict) else f"{path}[{k}]", depth + 1))


def loads(text: str, what: str, p: Path | str, error: type[InvalidInputError]) -> Any:
    """Parse JSON ``text`` (of file ``p``) with every failure as one ``error``."""
    try:
        doc = json.loads(text, parse_int=_parse_int, parse_float=_parse_float, parse_constant=_parse_constant)
    except json.JSONDecodeError as exc:
        raise error(f"{what} file {p} is not JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
    except RecursionError:
        raise error(f"{what} file {p}: nested deeper than {MAX_DEPTH} levels") from None
    except ValueError as exc:  # e.g. an integer conversion limit of the interpreter
        raise error(f"{what} file {p} holds an unreadable number: {exc}") from None
    _check_tree(doc, what, p, error)
    return doc


def read_text(path: str | Path, what: str, error: type[InvalidInputError]) -> str:
    """The UTF-8 text of a file, a missing/unreadable/non-UTF-8 file as one clear ``error``."""
    p = Path(path)
    try:
        data = p.read_bytes()
    except FileNotFoundError:
        raise error(f"{what} file not found: {p}") from None
    except IsADirectoryError:
        raise error(f"{what} file {p} is a directory") from None
    except OSError as exc:
        raise error(f"cannot read {what} file {p}: {exc.strerror or exc}") from None
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise error(f"{what} file {p} is not UTF-8 text (byte {data[exc.start]:#04x} at offset {exc.start})") from None


def read_json(path: str | Path, what: str, error: type[InvalidInputError]) -> Any:
    """Load a JSON file, turning a missing file or bad JSON into one clear ``error``."""
    return loads(read_text(path, what, error), what, Path(path), error)


def write_json(obj: Any, path: str | Path) -> None:
    Path(path).write_text(json.dumps(obj, indent=1, allow_nan=False) + "\n")


def require(d: Any, key: str, where: str, error: type[InvalidInputError]) -> Any:
    if not isinstance(d, dict):
        raise error(f"{where} must be a JSON object, got {show(d)}")
    if key not in d:
        raise error(f"{where}: missing field '{key}'")
    return d[key]


def obj(value: Any, where: str, error: type[InvalidInputError]) -> dict:
    """``value`` must be a JSON object."""
    if not isinstance(value, dict):
        raise error(f"{where} must be a JSON object, got {show(value)}")
    return value


def known_fields(d: dict, allowed: set[str] | frozenset[str], where: str, error: type[InvalidInputError]) -> None:
    """Reject a field outside ``allowed`` (extensions go under an ``extra`` object), naming it."""
    for k in d:
        if k not in allowed:
            raise error(
                f"{where}: unknown field {k!r} (valid: {', '.join(sorted(allowed))}; put extensions under \"extra\")"
            )


def document(d: Any, what: str, fields: set[str] | frozenset[str], fmt: str, error: type[InvalidInputError]) -> dict:
    """The checks every document reader starts with: ``d`` is an object, has no unknown field and
    is of format ``fmt`` (an absent ``format`` is taken as ``fmt``)."""
    if not isinstance(d, dict):
        raise error(f"{what} must be a JSON object, got {type(d).__name__}")
    known_fields(d, fields, what, error)
    got = d.get("format", fmt)
    if got != fmt:
        raise error(f"{what}: format must be '{fmt}', got {got!r}")
    return d


def extra(d: dict, where: str, error: type[InvalidInputError]) -> dict:
    """The ``extra`` object of ``d`` (empty when absent)."""
    x = d.get("extra", {})
    if not isinstance(x, dict):
        raise error(f"{where}.extra must be a JSON object, got {show(x)}")
    return dict(x)


def number(
    value: Any,
    where: str,
    error: type[InvalidInputError],
    *,
    positive: bool = False,
    allow_zero: bool = True,
    maximum: float | None = None,
    minimum_nonzero: float | None = None,
    minimum: float | None = None,
) -> float:
    """A finite, non-negative JSON number (bools and strings rejected), within the given range."""
    if isinstance(value, _Unrepresentable):
        raise error(f"{where} must be a finite number, got {value!r}")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise error(f"{where} must be a number, got {show(value)}")
    try:
        v = float(value)
    except OverflowError:
        raise error(f"{where} is out of the supported range, got {show(value)}") from None
    if not math.isfinite(v):
        raise error(f"{where} must be finite, got {value!r}")
    if v < 0:
        raise error(f"{where} must be non-negative, got {show(value)}")
    if positive and v <= 0:
        raise error(f"{where} must be positive, got {show(value)}")
    if maximum is not None and v > maximum:
        raise error(f"{where} = {show(value)} is out of the supported range (at most {maximum:g})")
    if minimum is not None and v < minimum:
        raise error(f"{where} = {show(value)} is out of the supported range (at least {minimum:g})")
    if minimum_nonzero is not None and 0 < v < minimum_nonzero:
        raise error(f"{where} = {show(value)} is out of the supported range (0 or at least {minimum_nonzero:g})")
    return v


def integer(
    value: Any, where: str, error: type[InvalidInputError], *, minimum: int | None = None, maximum: int | None = None
) -> int:
    if isinstance(value, _Unrepresentable):
        raise error(f"{where} must be an integer, got {value!r}")
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or (isinstance(value, float) and not value.is_integer())
    ):
        raise error(f"{where} must be an integer, got {show(value)}")
    v = int(value)
    if minimum is not None and v < minimum:
        raise error(f"{where} must be at least {minimum}, got {show(value)}")
    if maximum is not None and v > maximum:
        raise error(f"{where} is out of the supported range (at most {maximum}), got {show(value)}")
    return v
