"""Shared fixtures: tiny hand-drawn graphs and clusters."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
from tiny_graphs import chain_dict, diamond_dict, node  # noqa: F401

#: the published profiles the tests read (PipeDream, Piper; see data/README.md)
DATA = Path(__file__).resolve().parents[1] / "data"


CLUSTER = {
    "format": "gpp-cluster/1",
    "devices": 4,
    "memory_bytes": 1e6,
    "devices_per_node": 2,
    "intra_node_bandwidth": 1000.0,
    "inter_node_bandwidth": 100.0,
    "latency": 0.01,
    "optimizer_state_factor": 4.0,
}


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
def data_dir() -> Path:
    """The repository's ``data/`` folder of published profiles."""
    return DATA
