"""Importers of the published PipeDream and Piper profiles: every file under data/, and malformed inputs."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from gpp_solver.errors import InvalidGraphError
from gpp_solver.formats.graph import graph_from_dict, graph_to_dict
from gpp_solver.formats.importers import import_pipedream, import_piper, pipedream_dict, piper_dict

DATA = Path(__file__).resolve().parents[2] / "data"
PIPEDREAM = sorted((DATA / "pipedream").glob("*.graph.txt"))
PIPER = sorted((DATA / "piper").glob("*.json"))


def _raw_pipedream(path: Path) -> tuple[dict, set]:
    """An independent, minimal reading of graph.txt: {id: (fw, bw, act, params, desc)}, edges."""
    nodes, edges = {}, set()
    for line in path.read_text().splitlines():
        if line.startswith("\t"):
            a, b = line.strip().split(" -- ")
            edges.add((a, b))
        elif line.strip():
            nid, desc, metrics = line.split(" -- ")
            kv = dict(re.findall(r"(\w+)=(\[[^\]]*\]|[^,]+)", metrics))
            act = kv["activation_size"]
            act = sum(float(x) for x in act[1:-1].split(";")) if act.startswith("[") else float(act)
            nodes[nid] = (
                float(kv["forward_compute_time"]),
                float(kv["backward_compute_time"]),
                act,
                float(kv["parameter_size"]),
                desc,
            )
    return nodes, edges


def test_published_files_are_present():
    assert {p.name for p in PIPEDREAM} == {
        "alexnet.graph.txt",
        "gnmt.graph.txt",
        "gnmt_large.graph.txt",
        "inception_v3.graph.txt",
        "nasnetalarge.graph.txt",
    }
    assert {p.name for p in PIPER} == {"gnmt.json", "resnet.json"}


@pytest.mark.parametrize("path", PIPEDREAM, ids=lambda p: p.name)
def test_pipedream_file_imports_with_counts_and_totals_preserved(path):
    batch = 32
    g = import_pipedream(path, batch_size=batch)
    raw, raw_edges = _raw_pipedream(path)
    assert graph_from_dict(graph_to_dict(g)) == g
    assert set(g.ids) == set(raw) and len(g.nodes) == len(raw)
    assert {(e.src, e.dst) for e in g.edges} == raw_edges and len(g.edges) == len(raw_edges)
    assert g.micro_batch_sizes == (batch,)
    assert sum(n.fw_time[0] for n in g.nodes) == pytest.approx(sum(v[0] for v in raw.values()) / 1000)
    assert sum(n.bw_time[0] for n in g.nodes) == pytest.approx(sum(v[1] for v in raw.values()) / 1000)
    assert sum(n.weight_bytes for n in g.nodes) == pytest.approx(sum(v[3] for v in raw.values()))
    for n in g.nodes:
        assert n.activation_bytes == n.output_bytes == pytest.approx(raw[n.id][2] / batch)
        assert n.extra["op"] == raw[n.id][4]
    assert g.name == path.name.removesuffix(".graph.txt")


def test_pipedream_list_activation_is_summed_and_input_node_kept():
    g = import_pipedream(DATA / "pipedream" / "gnmt.graph.txt", batch_size=1)
    assert g.node("node7").activation_bytes == 6291456.0 + 131072.0 + 131072.0
    a = import_pipedream(DATA / "pipedream" / "alexnet.graph.txt", batch_size=256, name="alex")
    assert a.name == "alex"
    assert a.node("node1").extra["op"] == "Input"
    assert a.node("node1").output_bytes == 3 * 224 * 224 * 4  # 256 samples of 3x224x224 fp32


GOOD_NODE = (
    "node1 -- Linear(2, 2) -- forward_compute_time=1.5, backward_compute_time=3.0, "
    "activation_size=[8.0; 8.0], parameter_size=24.000"
)
GOOD_NODE2 = (
    "node2 -- ReLU -- forward_compute_time=0.5, backward_compute_time=0.5, activation_size=16.0, parameter_size=0.0"
)


def test_pipedream_small_text_and_duplicate_edges_merged():
    d = pipedream_dict("\n".join([GOOD_NODE, GOOD_NODE2, "\tnode1 -- node2", "\tnode1 -- node2", ""]), batch_size=2)
    assert len(d["edges"]) == 1
    g = graph_from_dict(d)
    assert g.node("node1").fw_time == (0.0015,) and g.node("node1").activation_bytes == 8.0


@pytest.mark.parametrize(
    "lines,words",
    [
        (
            [GOOD_NODE.replace("parameter_size=24.000", "")[:-2], GOOD_NODE2, "\tnode1 -- node2"],
            ["line 1", "parameter_size"],
        ),
        ([GOOD_NODE, GOOD_NODE2.replace("0.5,", "fast,", 1), "\tnode1 -- node2"], ["line 2", "fast"]),
        ([GOOD_NODE, GOOD_NODE2, "\tnode1 -- node9"], ["line 3", "node9"]),
        ([GOOD_NODE, GOOD_NODE2, "\tnode1 node2"], ["line 3", "edge line"]),
        ([GOOD_NODE, GOOD_NODE, "\tnode1 -- node1"], ["line 2", "twice"]),
        ([GOOD_NODE, "node2 -- ReLU", "\tnode1 -- node2"], ["line 2"]),
        ([GOOD_NODE, GOOD_NODE2.replace("16.0", "-16.0"), "\tnode1 -- node2"], ["line 2", "non-negative"]),
        ([GOOD_NODE, GOOD_NODE2.replace("16.0", "[1.0; x]"), "\tnode1 -- node2"], ["line 2", "'x'"]),
        ([GOOD_NODE, GOOD_NODE2, "\tnode1 -- node1"], ["line 3", "self-loop"]),
    ],
)
def test_pipedream_malformed_input_names_the_line(lines, words):
    with pytest.raises(InvalidGraphError) as exc:
        pipedream_dict("\n".join(lines), batch_size=1, source="g.txt")
    for w in words:
        assert w in str(exc.value)


def test_pipedream_disconnected_or_missing_file_is_one_clear_error(tmp_path):
    p = tmp_path / "x.graph.txt"
    p.write_text(GOOD_NODE + "\n" + GOOD_NODE2 + "\n")
    with pytest.raises(InvalidGraphError, match="disconnected"):
        import_pipedream(p, batch_size=1)
    with pytest.raises(InvalidGraphError, match="not found"):
        import_pipedream(tmp_path / "missing.txt")
    with pytest.raises(InvalidGraphError, match="batch_size"):
        import_pipedream(p, batch_size=0)


@pytest.mark.parametrize("path", PIPER, ids=lambda p: p.name)
def test_piper_file_imports_with_counts_totals_and_extras(path):
    doc = json.loads(path.read_text())
    g = import_piper(path)
    g2 = graph_from_dict(graph_to_dict(g))
    assert graph_to_dict(g2) == graph_to_dict(g)  # tmpc / op / piper extras round-trip
    assert len(g.nodes) == len(doc["nodes"]) and len(g.edges) == len(doc["edges"])
    assert g.micro_batch_sizes == (1,)
    assert g.extra["piper"] == {k: doc[k] for k in ("maxDevices", "maxMemoryPerDevice", "bandwidth", "mbsInBatch")} | {
        "time_unit": 1e-3
    }
    vanilla = [next(t for t in nd["TMPCs"]["1"] if t["id"] == "vanilla") for nd in doc["nodes"]]
    total = sum(n.fw_time[0] + n.bw_time[0] for n in g.nodes)
    assert total == pytest.approx(sum(v["timePerSample"] for v in vanilla) / 1000)
    assert sum(n.weight_bytes for n in g.nodes) == pytest.approx(sum(v["parameterSize"] for v in vanilla))
    assert sum(n.activation_bytes for n in g.nodes) == pytest.approx(sum(v["memoryUsageA"] for v in vanilla))
    assert sum(len(n.tmpc) for n in g.nodes) == sum(len(v) for nd in doc["nodes"] for v in nd["TMPCs"].values())
    name = {nd["id"]: nd["name"] for nd in doc["nodes"]}
    cost = {(name[e["sourceId"]], name[e["destId"]]): e["communicationCost"] for e in doc["edges"]}
    assert {(e.src, e.dst): e.bytes for e in g.edges} == cost
    for n in g.nodes:
        assert n.output_bytes == max([c for (s, _), c in cost.items() if s == n.id], default=0.0)
        for t in n.tmpc:
            assert set(t.extra["sync_time_fw"]) == set(g.preds(n.id))
            assert set(t.extra["sync_time_bw"]) == set(g.succs(n.id))
            assert t.fw_time[0] + t.bw_time[0] == pytest.approx(t.extra["time_per_sample"] / 1000)
            assert t.fw_time[0] >= 0 and t.bw_time[0] >= 0
        rec = [t for t in n.tmpc if t.recompute]
        assert rec and all(r.activation_bytes <= n.activation_bytes for r in rec)


def test_piper_gnmt_is_pipedream_gnmt_large_with_the_same_forward_backward_split():
    piper = import_piper(DATA / "piper" / "gnmt.json")
    pd = import_pipedream(DATA / "pipedream" / "gnmt_large.graph.txt", batch_size=1)
    shared = set(piper.ids) & set(pd.ids)
    assert len(shared) == len(piper.nodes)
    for nid in shared:
        assert piper.node(nid).fw_time[0] == pytest.approx(pd.node(nid).fw_time[0], abs=1e-9)
        assert piper.node(nid).bw_time[0] == pytest.approx(pd.node(nid).bw_time[0], abs=1e-9)
        assert piper.node(nid).weight_bytes == pd.node(nid).weight_bytes


def _tiny_piper() -> dict:
    def tm(tps, a, rec_tps=None):
        out = [
            {
                "id": "vanilla",
                "timePerSample": tps,
                "parameterSize": 8.0,
                "memoryUsageA": a,
                "memoryUsageB": 16.0,
                "syncTimeFw": {},
                "syncTimeBw": {},
            }
        ]
        if rec_tps is not None:
            out.append({**out[0], "id": "activation recomp", "timePerSample": rec_tps, "memoryUsageA": a / 10})
        return out

    nodes = [
        {"id": 7, "name": "a", "TMPCs": {"1": tm(3.0, 100.0, 4.0)}},
        {"id": 9, "name": "b", "TMPCs": {"1": tm(6.0, 50.0), "2": tm(4.0, 25.0)}},
    ]
    nodes[0]["TMPCs"]["1"][0]["syncTimeBw"] = {"9": 5.0}
    nodes[1]["TMPCs"]["1"][0]["syncTimeFw"] = {"7": 2.0}
    return {
        "maxDevices": 4,
        "maxMemoryPerDevice": 1e9,
        "bandwidth": 1e9,
        "mbsInBatch": 8,
        "nodes": nodes,
        "edges": [{"sourceId": 7, "destId": 9, "communicationCost": 40.0}],
    }


def test_piper_forward_split_and_sync_keys_on_a_tiny_input():
    g = graph_from_dict(piper_dict(_tiny_piper()))
    a, b = g.node("a"), g.node("b")
    assert a.fw_time[0] == pytest.approx(1e-3) and a.bw_time[0] == pytest.approx(2e-3)  # fw = 4 - 3
    assert b.fw_time[0] == pytest.approx(2e-3) and b.bw_time[0] == pytest.approx(4e-3)  # no pair: 1/3
    assert [t.t for t in b.tmpc] == [1, 2]
    t2 = b.tmpc[1]
    assert t2.fw_time[0] + t2.bw_time[0] == pytest.approx(4e-3) and t2.activation_bytes == 25.0
    assert a.tmpc[0].extra["sync_time_bw"] == {"b": 5.0} and b.tmpc[0].extra["sync_time_fw"] == {"a": 2.0}
    assert b.tmpc[1].extra["sync_time_fw"] == {"a": 0.0}  # omitted edge -> 0
    assert a.output_bytes == 40.0 and b.output_bytes == 0.0
    assert a.extra["piper_id"] == 7 and a.tmpc[1].recompute and a.tmpc[1].extra["memory_b"] == 16.0


def test_piper_duplicate_names_fall_back_to_numeric_ids():
    doc = _tiny_piper()
    doc["nodes"][1]["name"] = "a"
    for nd in doc["nodes"]:
        nd["name"] = "Transformer"
    g = graph_from_dict(piper_dict(doc))
    assert set(g.ids) == {"n7", "n9"} and g.node("n7").extra["op"] == "Transformer"


def _break(fn):
    doc = _tiny_piper()
    fn(doc)
    return doc


@pytest.mark.parametrize(
    "doc,words",
    [
        (_break(lambda d: d["nodes"][0]["TMPCs"]["1"][0].pop("memoryUsageA")), ["'a'", "memoryUsageA"]),
        (_break(lambda d: d["nodes"][1]["TMPCs"]["1"][0].update(timePerSample="slow")), ["'b'", "timePerSample"]),
        (_break(lambda d: d["edges"][0].update(destId=3)), ["edge #0", "unknown node id 3"]),
        (_break(lambda d: d["edges"].append(dict(d["edges"][0]))), ["edge #1", "duplicate"]),
        (
            _break(lambda d: d["nodes"][0]["TMPCs"]["1"][0].update(syncTimeFw={"9": 1.0})),
            ["'a'", "syncTimeFw", "predecessor"],
        ),
        (_break(lambda d: d["nodes"][1]["TMPCs"].pop("1")), ["'b'", "t=1"]),
        (_break(lambda d: d.pop("bandwidth")), ["bandwidth"]),
        (_break(lambda d: d["nodes"][0]["TMPCs"]["1"][0].update(parameterSize=-1)), ["'a'", "parameterSize"]),
        (_break(lambda d: d["nodes"][1].update(id=7)), ["duplicate id 7"]),
    ],
)
def test_piper_malformed_input_names_the_node_or_edge(doc, words):
    with pytest.raises(InvalidGraphError) as exc:
        piper_dict(doc)
    for w in words:
        assert w in str(exc.value)


def test_piper_bad_file_is_one_clear_error(tmp_path):
    p = tmp_path / "bad.json"
    p.write_text("{not json")
    with pytest.raises(InvalidGraphError, match="not JSON"):
        import_piper(p)
