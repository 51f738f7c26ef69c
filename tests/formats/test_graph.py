"""gpp-graph/1: round trips, networkx conversion, and one test per rejection of docs/formats.md."""

from __future__ import annotations

import json

import networkx as nx
import pytest

import gpp_solver as gs
from gpp_solver.errors import InvalidGraphError


def test_round_trip(diamond, tmp_path):
    g = gs.graph_from_dict(diamond)
    assert gs.graph_from_dict(gs.graph_to_dict(g)) == g
    gs.save_graph(g, tmp_path / "g.json")
    assert gs.load_graph(tmp_path / "g.json") == g
    assert json.loads((tmp_path / "g.json").read_text())["format"] == "gpp-graph/1"


def test_extras_survive_round_trip(diamond):
    diamond["nodes"][0]["extra"] = {"op": "conv"}
    diamond["nodes"][0]["tmpc"] = [
        {
            "t": 2,
            "recompute": True,
            "fw_time": [1, 2],
            "bw_time": [3, 4],
            "weight_bytes": 5,
            "activation_bytes": 1,
            "extra": {"memory_b": 7},
        }
    ]
    diamond["extra"] = {"piper": {"maxDevices": 8}}
    diamond["edges"][0]["bytes"] = 123
    g = gs.graph_from_dict(diamond)
    assert g.node("a").extra["op"] == "conv" and g.extra["piper"] == {"maxDevices": 8}
    d = gs.graph_to_dict(g)
    assert d["nodes"][0]["extra"] == {"op": "conv"}
    assert d["nodes"][0]["tmpc"][0]["extra"]["memory_b"] == 7
    assert d["extra"] == {"piper": {"maxDevices": 8}}
    assert d["edges"][0]["bytes"] == 123


def test_structure_helpers(diamond):
    g = gs.graph_from_dict(diamond)
    assert g.succs("a") == ("b", "c") and g.preds("d") == ("b", "c")
    assert g.topo_order[0] == "a" and g.topo_order[-1] == "d"
    assert g.edge_bytes("a", "b") == 5.0


def test_networkx_round_trip(diamond):
    g = gs.graph_from_dict(diamond)
    G = gs.graph_to_networkx(g)
    assert set(G.edges) == {("a", "b"), ("a", "c"), ("b", "d"), ("c", "d")}
    back = gs.graph_from_networkx(G, name="diamond", micro_batch_sizes=[1, 2])
    assert back == g


def test_from_networkx_custom_attribute_names():
    G = nx.DiGraph()
    G.add_node("x", fwd=1.0, bwd=2.0, params=8)
    G.add_node("y", fwd=1.0, bwd=2.0)
    G.add_edge("x", "y")
    g = gs.graph_from_networkx(G, fw_time="fwd", bw_time="bwd", weight_bytes="params")
    assert g.node("x").weight_bytes == 8 and g.node("y").fw_time == (1.0,)


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda d: d["nodes"].append(dict(d["nodes"][0])), "duplicate node id 'a'"),
        (lambda d: d["edges"].append({"src": "a", "dst": "zz"}), "unknown node 'zz'"),
        (lambda d: d["edges"].append({"src": "b", "dst": "b"}), "self-loop"),
        (lambda d: d["edges"].append({"src": "d", "dst": "a"}), "cycle"),
        (lambda d: d["nodes"][1].update(weight_bytes=-1), "node 'b'.weight_bytes must be non-negative"),
        (lambda d: d["nodes"][1].update(fw_time=[1.0, float("inf")]), "must be finite"),
        (lambda d: d["nodes"][2].update(bw_time=[1.0]), "node 'c'.bw_time has 1 entries"),
        (lambda d: d.update(nodes=[], edges=[]), "empty"),
        (
            lambda d: d["nodes"].append(
                {
                    "id": "lonely",
                    "fw_time": [1, 1],
                    "bw_time": [1, 1],
                    "weight_bytes": 0,
                    "activation_bytes": 0,
                    "output_bytes": 0,
                }
            ),
            "disconnected: node 'lonely'",
        ),
        (lambda d: d["nodes"][0].pop("output_bytes"), "node 'a': missing field 'output_bytes'"),
        (lambda d: d.update(micro_batch_sizes=[2, 1]), "strictly increasing"),
        (lambda d: d.update(micro_batch_sizes=[0, 1]), "at least 1"),
        (lambda d: d["nodes"][0].update(id=""), "non-empty string"),
        (lambda d: d.update(format="gpp-graph/9"), "format"),
        (lambda d: d["nodes"][3].update(activation_bytes="10"), "must be a number"),
        (lambda d: d["edges"][0].update(bytes=-3), "bytes must be non-negative"),
    ],
)
def test_rejections(diamond, mutate, message):
    mutate(diamond)
    with pytest.raises(
        InvalidGraphError, match=message.replace("(", r"\(").replace(")", r"\)").replace(".", r"\.").replace("[", r"\[")
    ):
        gs.graph_from_dict(diamond)


def test_cycle_is_named(diamond):
    diamond["edges"].append({"src": "d", "dst": "a"})
    with pytest.raises(InvalidGraphError) as e:
        gs.graph_from_dict(diamond)
    msg = str(e.value)
    assert "->" in msg and "a" in msg and "d" in msg


def test_not_json_file(tmp_path):
    p = tmp_path / "bad.json"
    p.write_text("{nope")
    with pytest.raises(InvalidGraphError, match="not JSON"):
        gs.load_graph(p)
    with pytest.raises(InvalidGraphError, match="not found"):
        gs.load_graph(tmp_path / "missing.json")
    p.write_text("[1, 2]")
    with pytest.raises(InvalidGraphError, match="JSON object"):
        gs.load_graph(p)
