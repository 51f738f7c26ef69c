"""Shared fixtures: tiny hand-drawn graphs and clusters."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

SHARED = Path(__file__).resolve().parents[2] / "shared"


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


CLUSTER = {"format": "gpp-cluster/1", "devices": 4, "memory_bytes": 1e6, "devices_per_node": 2,
           "intra_node_bandwidth": 1000.0, "inter_node_bandwidth": 100.0, "latency": 0.01,
           "optimizer_state_factor": 4.0}


@pytest.fixture
def diamond() -> dict:
    return copy.deepcopy(diamond_dict())


@pytest.fixture
def chain() -> dict:
    return copy.deepcopy(chain_dict())


@pytest.fixture
def cluster_dict() -> dict:
    return copy.deepcopy(CLUSTER)


@pytest.fixture
def shared_dir() -> Path:
    if not SHARED.exists():
        pytest.skip("../shared is not beside the checkout")
    return SHARED
