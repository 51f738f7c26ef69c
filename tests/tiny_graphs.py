"""Tiny hand-drawn graphs shared by the tests."""

from __future__ import annotations


def node(i: str, f: float = 1.0, w: float = 100.0, a: float = 10.0, o: float = 5.0) -> dict:
    return {"id": i, "fw_time": [f, 1.5 * f], "bw_time": [2 * f, 3 * f], "weight_bytes": w,
            "activation_bytes": a, "output_bytes": o}


def diamond_dict() -> dict:
    return {"format": "gpp-graph/1", "name": "diamond", "micro_batch_sizes": [1, 2],
            "nodes": [node("a"), node("b"), node("c"), node("d")],
            "edges": [{"src": "a", "dst": "b"}, {"src": "a", "dst": "c"},
                      {"src": "b", "dst": "d"}, {"src": "c", "dst": "d"}]}


def chain_dict(n: int = 4, times: list[float] | None = None) -> dict:
    times = times or [1.0] * n
    return {"format": "gpp-graph/1", "name": f"chain{n}", "micro_batch_sizes": [1, 2],
            "nodes": [node(f"n{i}", times[i]) for i in range(n)],
            "edges": [{"src": f"n{i}", "dst": f"n{i + 1}"} for i in range(n - 1)]}
