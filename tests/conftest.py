"""Shared fixtures: tiny hand-drawn graphs and clusters."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
from tiny_graphs import chain_dict, diamond_dict, node  # noqa: F401

SHARED = Path(__file__).resolve().parents[2] / "shared"


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
