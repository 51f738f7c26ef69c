from __future__ import annotations

import pytest

import gpp_solver as gs
from gpp_solver.errors import InvalidClusterError


def test_round_trip(cluster_dict, tmp_path):
    c = gs.cluster_from_dict(cluster_dict)
    assert gs.cluster_from_dict(gs.cluster_to_dict(c)) == c
    gs.save_cluster(c, tmp_path / "c.json")
    assert gs.load_cluster(tmp_path / "c.json") == c
    assert gs.as_cluster(str(tmp_path / "c.json")) == c


def test_bandwidth_selection(cluster_dict):
    c = gs.cluster_from_dict(cluster_dict)
    assert c.bandwidth([0, 1]) == 1000.0  # one node
    assert c.bandwidth([1, 2]) == 100.0  # spans nodes
    flat = gs.cluster_from_dict({"devices": 4, "memory_bytes": 1, "inter_node_bandwidth": 7.0})
    assert flat.bandwidth([0]) == 7.0 and flat.latency == 0.0 and flat.optimizer_state_factor == 4.0


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda d: d.update(devices=0), "devices must be at least 1"),
        (lambda d: d.update(memory_bytes=0), "memory_bytes must be positive"),
        (lambda d: d.update(memory_bytes=-5), "memory_bytes must be non-negative"),
        (lambda d: d.pop("devices"), "missing field 'devices'"),
        (lambda d: d.pop("inter_node_bandwidth"), "missing field 'inter_node_bandwidth'"),
        (lambda d: d.update(devices=2.5), "devices must be an integer"),
        (lambda d: d.update(latency=float("nan")), "latency must be finite"),
        (lambda d: d.update(devices_per_node=0), "devices_per_node must be at least 1"),
    ],
)
def test_rejections(cluster_dict, mutate, message):
    mutate(cluster_dict)
    with pytest.raises(InvalidClusterError, match=message):
        gs.cluster_from_dict(cluster_dict)
