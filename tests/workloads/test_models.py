"""The built-in workloads: valid graphs, counts that follow the parameters, sane costs, clear errors."""

from __future__ import annotations

import inspect
import math

import networkx as nx
import pytest

from gpp_solver.errors import InvalidInputError
from gpp_solver.formats.graph import graph_from_dict, graph_to_dict
from gpp_solver.workloads import (
    MODELS,
    V100,
    V100_FP32,
    OpCost,
    build_model,
    candle_uno_dict,
    dlrm_dict,
    forward_time,
    mmt_dict,
    ops,
    transformer_dict,
)

TINY = {
    "mmt": dict(branches=2, layers=2, seq=8, hidden=16, heads=2, ffn=32, vocab=50, max_micro_batch=8),
    "dlrm": dict(
        dense_branches=2,
        sparse_branches=3,
        dense_layers=2,
        hidden=16,
        dense_features=8,
        table_rows=100,
        embed_dim=4,
        bag_size=3,
        top_layers=2,
        max_micro_batch=16,
    ),
    "candle-uno": dict(branches=3, layers=2, hidden=16, top_layers=2, input_features=8, max_micro_batch=16),
    "transformer": dict(layers=3, seq=8, hidden=16, heads=2, ffn=32, vocab=50, max_micro_batch=4),
}


def expected_counts(name: str, p: dict) -> tuple[int, int]:
    if name == "mmt":
        return p["branches"] * (1 + 3 * p["layers"]) + 2, p["branches"] * (4 * p["layers"] + 1) + 1
    if name == "transformer":
        return 3 * p["layers"] + 2, 4 * p["layers"] + 1
    if name == "dlrm":
        dense = p["dense_branches"] * p["dense_layers"]
        return dense + p["sparse_branches"] + 2 + p["top_layers"], dense + p["sparse_branches"] + 1 + p["top_layers"]
    dense = p["branches"] * p["layers"]
    return dense + 1 + p["top_layers"], dense + p["top_layers"]


def defaults(name: str) -> dict:
    return {k: v.default for k, v in MODELS[name].params.items()}


@pytest.mark.parametrize("name", sorted(MODELS))
@pytest.mark.parametrize("size", ["default", "tiny"])
def test_model_validates_and_counts_follow_parameters(name, size):
    params = TINY[name] if size == "tiny" else {}
    g = build_model(name, **params)
    assert graph_from_dict(graph_to_dict(g)) == g  # round-trips through the validating reader
    n, m = expected_counts(name, {**defaults(name), **params})
    assert (len(g.nodes), len(g.edges)) == (n, m)
    nxg = g.to_networkx()
    assert nx.is_directed_acyclic_graph(nxg) and nx.is_weakly_connected(nxg)
    assert len(set(g.ids)) == len(g.ids)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_micro_batch_sizes_are_powers_of_two_up_to_the_maximum(name):
    g = build_model(name, **TINY[name])
    top = TINY[name]["max_micro_batch"]
    assert list(g.micro_batch_sizes) == [2**i for i in range(int(math.log2(top)) + 1)]
    assert build_model(name).micro_batch_sizes[-1] == MODELS[name].params["max_micro_batch"].default


def test_max_micro_batch_not_a_power_of_two_is_included():
    g = build_model("candle-uno", **{**TINY["candle-uno"], "max_micro_batch": 12})
    assert list(g.micro_batch_sizes) == [1, 2, 4, 8, 12]


@pytest.mark.parametrize("name", sorted(MODELS))
def test_time_per_sample_never_rises_with_micro_batch_size(name):
    g = build_model(name)
    sizes = g.micro_batch_sizes
    for node in g.nodes:
        for times in (node.fw_time, node.bw_time):
            per_sample = [t / b for t, b in zip(times, sizes)]
            assert all(a >= b for a, b in zip(per_sample, per_sample[1:])), node.id
            assert all(a <= b for a, b in zip(times, times[1:])), node.id  # bigger batch, longer kernel
        assert node.bw_time == tuple(2 * t for t in node.fw_time)
        assert min(node.fw_time) > 0


def test_model_level_time_per_sample_falls_a_lot_for_row_sized_samples():
    g = build_model("dlrm")
    total = [sum(n.fw_time[i] + n.bw_time[i] for n in g.nodes) / b for i, b in enumerate(g.micro_batch_sizes)]
    assert total[-1] < total[0] / 10  # b=1 is weight-streaming bound, b=512 is compute bound


def test_mmt_branches_are_symmetric():
    d = mmt_dict(branches=4, layers=3, seq=16, hidden=32, heads=4, ffn=64, vocab=10, max_micro_batch=4)
    graph_from_dict(d)
    by_id = {n["id"]: n for n in d["nodes"]}

    def strip(node_id: str) -> str:
        return node_id.split(".", 1)[1]

    branch = {
        i: {strip(k): {f: v for f, v in n.items() if f != "id"} for k, n in by_id.items() if k.startswith(f"b{i}.")}
        for i in range(4)
    }
    assert len(branch[0]) == 1 + 3 * 3
    for i in range(1, 4):
        assert branch[i] == branch[0]
    edges = {
        i: sorted(
            (strip(e["src"]), strip(e["dst"]) if e["dst"].startswith("b") else e["dst"])
            for e in d["edges"]
            if e["src"].startswith(f"b{i}.")
        )
        for i in range(4)
    }
    for i in range(1, 4):
        assert edges[i] == edges[0]
    assert {"b0.embed", "b0.l0.attn", "b0.l0.fc1", "b0.l0.fc2", "b3.l2.fc2", "concat", "head"} <= set(by_id)


def test_mmt_with_one_branch_costs_like_the_sequential_transformer_layers():
    a = mmt_dict(branches=1, layers=2, seq=16, hidden=32, heads=4, ffn=64, vocab=10, max_micro_batch=4)
    b = transformer_dict(layers=2, seq=16, hidden=32, heads=4, ffn=64, vocab=10, max_micro_batch=4)
    graph_from_dict(a), graph_from_dict(b)
    na = {n["id"]: n for n in a["nodes"]}
    nb = {n["id"]: n for n in b["nodes"]}
    for j in range(2):
        for part in ("attn", "fc1", "fc2"):
            assert na[f"b0.l{j}.{part}"]["fw_time"] == nb[f"l{j}.{part}"]["fw_time"]


def test_transformer_layer_activation_matches_megatron_accounting():
    s, h, a = 256, 1024, 16
    kept = sum(
        op(s, h, *rest, V100).activation_bytes
        for op, rest in ((ops.attention, (a,)), (ops.ffn_in, (4 * h,)), (ops.ffn_out, (4 * h,)))
    )
    assert kept == 34 * s * h + 5 * a * s * s


def test_dlrm_tables_and_widths():
    d = dlrm_dict(
        dense_branches=1,
        sparse_branches=2,
        dense_layers=1,
        hidden=8,
        dense_features=8,
        table_rows=1000,
        embed_dim=4,
        bag_size=5,
        top_layers=1,
        max_micro_batch=2,
    )
    graph_from_dict(d)
    nodes = {n["id"]: n for n in d["nodes"]}
    assert nodes["sparse0.emb"]["weight_bytes"] == 1000 * 4 * 4  # fp32 table
    assert nodes["sparse0.emb"]["output_bytes"] == 2 * 5 * 4  # bag concatenated, fp16
    assert nodes["concat"]["output_bytes"] == 2 * (8 + 2 * 5 * 4)
    assert nodes["concat"]["activation_bytes"] == 0
    default = dlrm_dict()
    emb = next(n for n in default["nodes"] if n["id"] == "sparse0.emb")
    assert emb["weight_bytes"] == 1e6 * 64 * 4


def test_candle_uno_concat_width_and_top_input():
    d = candle_uno_dict(branches=3, layers=1, hidden=8, top_layers=1, input_features=4, max_micro_batch=1)
    graph_from_dict(d)
    nodes = {n["id"]: n for n in d["nodes"]}
    assert nodes["concat"]["output_bytes"] == 2 * 3 * 8
    assert nodes["top.fc0"]["weight_bytes"] == 4 * (3 * 8 * 8 + 8)


def test_forward_time_formula_by_hand():
    op = OpCost(flops=1e9, rows=4, gemm_params=1e3, elementwise_bytes=1e6, kernels=3)
    b = 8
    eff = 0.7 * 32 / (32 + 128)
    expect = 3 * 1e-5 + max(1e9 * 8 / (125e12 * eff), 2e3 / (0.7 * 900e9)) + 8e6 / (0.7 * 900e9)
    assert forward_time(op, V100, b) == pytest.approx(expect, rel=1e-12)
    weight_bound = OpCost(flops=1.0, gemm_params=1e8)
    assert forward_time(weight_bound, V100, 1) == pytest.approx(1e-5 + 2e8 / (0.7 * 900e9))
    assert forward_time(op, V100_FP32, b) > forward_time(op, V100, b)


@pytest.mark.parametrize(
    "name,params,word",
    [
        ("mmt", {"layers": 0}, "layers"),
        ("mmt", {"branches": -1}, "branches"),
        ("mmt", {"heads": 3}, "heads"),
        ("mmt", {"seq": 2.5}, "seq"),
        ("dlrm", {"bag_size": 0}, "bag_size"),
        ("dlrm", {"top_layers": True}, "top_layers"),
        ("candle-uno", {"max_micro_batch": 0}, "max_micro_batch"),
        ("transformer", {"hidden": "big"}, "hidden"),
        ("transformer", {"branches": 2}, "branches"),
    ],
)
def test_bad_parameters_are_rejected_by_name(name, params, word):
    with pytest.raises(InvalidInputError, match=word):
        build_model(name, **params)


def test_unknown_model_lists_valid_names():
    with pytest.raises(InvalidInputError) as exc:
        build_model("resnet")
    for valid in MODELS:
        assert valid in str(exc.value)


def test_none_parameters_mean_default():
    assert len(build_model("candle-uno", branches=None, layers=2).nodes) == 7 * 2 + 1 + 4


def test_registry_documents_the_builders_defaults():
    builders = {"mmt": mmt_dict, "dlrm": dlrm_dict, "candle-uno": candle_uno_dict, "transformer": transformer_dict}
    for key, spec in MODELS.items():
        sig = inspect.signature(builders[key])
        for p, doc in spec.params.items():
            assert sig.parameters[p].default == doc.default, (key, p)
            assert doc.help
        builder, params = spec  # (builder, documented parameters)
        assert callable(builder) and params is spec.params
