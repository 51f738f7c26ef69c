"""Deep recursions without Python's recursion limit.

A recursive function written as a generator yields the arguments of each recursive call instead
of making it, and receives the call's result back from ``yield``; :func:`run` drives the calls
on an explicit stack.  Mutually recursive generator functions (methods of one object, say) yield
the call itself — a generator object — instead of its arguments.  The code reads as the recursion it is, and its depth is bounded by memory
alone (a 10,000-operator graph's trees are as deep as the graph is long).

>>> def depth(n):
...     return 0 if n == 0 else 1 + (yield (n - 1,))
>>> run(depth, 100_000)
100000
>>> def even(n):
...     return True if n == 0 else (yield odd(n - 1))
>>> def odd(n):
...     return False if n == 0 else (yield even(n - 1))
>>> run(even, 10_001)
False
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import Any

__all__ = ["run"]

Call = Generator[tuple, Any, Any]


def run(fn: Callable[..., Call | Any], *args: Any) -> Any:
    """``fn(*args)``, where ``fn`` is a generator function whose ``yield args`` means ``fn(*args)``
    and ``yield other(...)`` (a generator object) means that call (its value is sent back); a call
    that returns without yielding is a plain return."""
    stack: list[Call] = []
    call = fn(*args)
    if not isinstance(call, Generator):
        return call
    stack.append(call)
    value = None
    while stack:
        try:
            request = stack[-1].send(value)
        except StopIteration as stop:
            stack.pop()
            value = stop.value
            continue
        value = None
        call = request if isinstance(request, Generator) else fn(*request)
        if isinstance(call, Generator):
            stack.append(call)
        else:
            value = call
    return value
