"""``StagingPricer`` (the leftover-device pass's vectorised pricing) against the straightforward
per-stage loop it replaces: the same floats, bit for bit, on random stagings and clusters."""

from __future__ import annotations

import random

import pytest

from gpp_solver.cost.model import comm_time, stage_transfers, time_per_sample
from gpp_solver.cost.tables import CostTables
from gpp_solver.cost.time_terms import allreduce_time
from gpp_solver.formats.cluster import v100_cluster
from gpp_solver.plan.build import stage_graph_edges
from gpp_solver.planners.graphpipe.dp.stage import DPStage, assign_devices
from gpp_solver.planners.graphpipe.staging import StagingPricer, spend_leftover_devices
from gpp_solver.types import Cluster
from gpp_solver.workloads import build_model


def reference_price(graph, cluster, stages, b, B, tables):
    devs = assign_devices(stages, cluster.devices_per_node)
    stage_of = {v: i for i, s in enumerate(stages) for v in s.nodes}
    transfers = stage_transfers(graph, stage_of)
    per_mb, allreduce, tps = [], [], 0.0
    for i, (st, dv) in enumerate(zip(stages, devs)):
        d = len(dv)
        ix = [graph.index[v] for v in st.nodes]
        comm_half = sum(
            comm_time(nb, b / d, cluster.bandwidth(dv + devs[peer]), cluster.latency)
            for peer, nb in transfers.get(i, [])
        )
        a = allreduce_time(float(tables.weight[ix].sum()), d, cluster.bandwidth(dv))
        m = float(tables.compute_at(b / d)[ix].sum()) + 2 * comm_half
        per_mb.append(m)
        allreduce.append(a)
        tps = max(tps, time_per_sample(m, b, a, B))
    preds = {i: [] for i in range(len(stages))}
    for u, v in stage_graph_edges(graph, stage_of):
        preds[v].append(u)
    longest = {}

    def path(i):
        if i not in longest:
            longest[i] = per_mb[i] + max((path(u) for u in preds[i]), default=0.0)
        return longest[i]

    L = max(path(i) for i in range(len(stages)))
    return tps, L + (B // b - 1) * max(per_mb) + max(allreduce)


CLUSTERS = [
    v100_cluster(64),
    Cluster(devices=64, memory_bytes=16e9, inter_node_bandwidth=1e10),  # flat network
    Cluster(
        devices=64,
        memory_bytes=16e9,
        inter_node_bandwidth=1e10,
        intra_node_bandwidth=5e10,
        devices_per_node=8,
        latency=3e-5,
    ),
]


@pytest.mark.parametrize("name", ["transformer", "mmt", "dlrm", "candle-uno"])
@pytest.mark.parametrize("ci", range(len(CLUSTERS)))
def test_pricer_equals_the_per_stage_loop(name: str, ci: int) -> None:
    graph, cluster = build_model(name), CLUSTERS[ci]
    tables = CostTables(graph)
    order = list(graph.topo_order)
    rng = random.Random(hash((name, ci)) & 0xFFFF)
    for _ in range(12):
        cuts = sorted(rng.sample(range(1, len(order)), rng.randint(1, min(10, len(order) - 1))))
        parts = [order[i:j] for i, j in zip([0] + cuts, cuts + [len(order)])]
        b = rng.choice([4, 8, 16])
        stages = tuple(DPStage(tuple(p), rng.choice([1, 2, 4]), 1, 0.0, graph.index[p[0]]) for p in parts)
        pricer = StagingPricer(graph, cluster, stages, b, 256, tables)
        assert pricer.price(stages) == reference_price(graph, cluster, stages, b, 256, tables)
        for _ in range(3):  # other degrees, the same partition
            other = tuple(DPStage(s.nodes, rng.choice([1, 2, 4, 8]), 1, 0.0, s.first) for s in stages)
            assert pricer.price(other) == reference_price(graph, cluster, other, b, 256, tables)
        spent = spend_leftover_devices(graph, cluster, stages, b, 256, (1, 2, 4, 8, 16), tables)
        assert sum(s.degree for s in spent) <= cluster.devices
