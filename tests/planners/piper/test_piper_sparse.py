"""Piper's breakpoint DP update (``planners/piper/sparse.py``) against the dense update: every table
equal, bit for bit, on small random instances (knapsack, sync-cost and tensor-parallel paths)."""

from __future__ import annotations

import numpy as np
import pytest

import gpp_solver as gs
from gpp_solver.planners.piper import dp as piper_dp
from gpp_solver.planners.piper.planner import build_instance, count_downsets
from gpp_solver.planners.piper.sparse import Breakpoints, dominators
from gpp_solver.types import Cluster


def random_graph(rng: np.random.Generator, n: int) -> dict:
    nodes = []
    for i in range(n):
        f = float(rng.uniform(0.5, 3.0))
        w, act = float(rng.uniform(10, 100)), float(rng.uniform(5, 60))
        nodes.append(
            {
                "id": f"n{i}",
                "fw_time": [f],
                "bw_time": [2 * f],
                "weight_bytes": w,
                "activation_bytes": act,
                "output_bytes": float(rng.uniform(1, 8)),
                "tmpc": [
                    {
                        "t": 1,
                        "recompute": False,
                        "fw_time": [f],
                        "bw_time": [2 * f],
                        "weight_bytes": w,
                        "activation_bytes": act,
                    },
                    {
                        "t": 1,
                        "recompute": True,
                        "fw_time": [f],
                        "bw_time": [float(rng.uniform(2.2, 3.5)) * f],
                        "weight_bytes": w,
                        "activation_bytes": act * float(rng.uniform(0.05, 0.4)),
                    },
                    {
                        "t": 2,
                        "recompute": False,
                        "fw_time": [float(rng.uniform(0.5, 0.8)) * f],
                        "bw_time": [float(rng.uniform(1.0, 1.6)) * f],
                        "weight_bytes": w / 2,
                        "activation_bytes": act / 2,
                    },
                ],
            }
        )
    edges = [{"src": f"n{i}", "dst": f"n{i + 1}"} for i in range(n - 1)]
    edges += [{"src": f"n{i}", "dst": f"n{i + 2}"} for i in range(n - 2) if rng.random() < 0.3]
    return {"format": "gpp-graph/1", "name": "rand", "micro_batch_sizes": [1], "nodes": nodes, "edges": edges}


def tables(inst, downsets, share: float, monkeypatch) -> tuple[list[np.ndarray], float]:
    seen = []

    class Recording(Breakpoints):
        def add(self, j, table):
            seen.append(table.copy())
            super().add(j, table)

    monkeypatch.setattr(piper_dp, "Breakpoints", Recording)
    monkeypatch.setattr(piper_dp, "SPARSE_SHARE", share)
    res = piper_dp.run_dp(inst, downsets)
    return seen, res.value


@pytest.mark.parametrize("seed", range(8))
def test_breakpoint_update_gives_the_dense_tables(seed, monkeypatch):
    rng = np.random.default_rng(seed)
    g = gs.graph_from_dict(random_graph(rng, int(rng.integers(4, 7))))
    k = int(rng.choice([6, 12, 16, 24]))
    n_mb = int(rng.choice([4, 12, 24, 60]))
    mem = float(rng.uniform(150, 900))
    inst = build_instance(g, Cluster(devices=k, memory_bytes=mem, inter_node_bandwidth=20.0), n_mb, mode="piper")
    if seed % 2:  # sync costs: the general knapsack path
        degs = tuple(type(o)(**{**o.__dict__, "sfw": o.sfw + rng.uniform(0, 3, o.sfw.shape)}) for o in inst.degrees)
        inst = type(inst)(**{**inst.__dict__, "degrees": degs})
    ds = count_downsets(g)
    dense, v_dense = tables(inst, ds, 0.0, monkeypatch)
    sparse, v_sparse = tables(inst, ds, np.inf, monkeypatch)
    assert len(dense) == len(sparse) == len(ds)
    for a, b in zip(dense, sparse):
        assert np.array_equal(a, b)
    assert v_dense == v_sparse or (np.isinf(v_dense) and np.isinf(v_sparse))


def test_dominators_are_the_immediate_ones():
    offs = sorted([(1, 1), (2, 2), (2, 1), (4, 4), (4, 2), (4, 1), (3, 3)])
    preds = dominators(offs)
    got = {offs[c]: sorted(offs[p] for p in preds[c]) for c in range(len(offs))}
    assert got[(1, 1)] == []
    assert got[(2, 1)] == [(1, 1)]
    assert got[(2, 2)] == [(2, 1)]
    assert got[(4, 2)] == [(2, 2), (4, 1)]
    assert got[(3, 3)] == [(2, 2)]
    assert got[(4, 4)] == [(3, 3), (4, 2)]
    assert all(p < c for c in range(len(offs)) for p in preds[c])


def random_table(rng: np.random.Generator, K1: int, F: int) -> np.ndarray:
    t = np.round(rng.uniform(0, 20, (K1, F)))  # ties and plateaus
    t[: rng.integers(0, K1 // 2 + 1)] = np.inf
    t[:, : rng.integers(0, 2)] = np.inf
    np.minimum.accumulate(t, axis=0, out=t)
    np.minimum.accumulate(t, axis=1, out=t)
    return t


@pytest.mark.parametrize("seed", range(60))
def test_update_equals_dense_on_random_tables_and_costs(seed):
    # stage costs need not rise with s here (drops, inf gaps): the k-drop path and every pruning rule
    from gpp_solver.planners.piper.sparse import update

    rng = np.random.default_rng(100 + seed)
    K, S1 = int(rng.integers(3, 14)), int(rng.integers(2, 12))
    K1, F = K + 1, S1 + 1
    subs_tables = [np.zeros((K1, F))] + [random_table(rng, K1, F) for _ in range(int(rng.integers(1, 5)))]
    bps = Breakpoints(np.stack(subs_tables))
    for j, t in enumerate(subs_tables):
        bps.add(j, t)
    ts, dsl = [1, 2, 3], [d for d in range(1, S1 + 1) if rng.random() < 0.7] or [1]
    offsets = sorted((d * t, d) for t in ts for d in dsl if d * t <= K)
    preds = dominators(offsets)
    subs = np.arange(len(subs_tables))
    staged, dense = {}, np.full((K1, F), np.inf)
    for c, (dt, d) in enumerate(offsets):
        if rng.random() < 0.15:
            continue  # a (t, d) with no stage at all
        pos = np.flatnonzero(rng.random(len(subs)) < 0.8)
        cost = np.round(rng.uniform(0, 20, (len(pos), F - d)))
        cost[rng.random(cost.shape) < 0.2] = np.inf
        if rng.random() < 0.5:
            cost = np.sort(cost, axis=1)  # the usual case: rising with s
        staged[c] = (pos, cost)
        for p, row in zip(pos, cost):
            cand = np.maximum(subs_tables[p][: K1 - dt, : F - d], row[None, :])
            np.minimum(dense[dt:, d:], cand, out=dense[dt:, d:])
    got = np.full((K1, F), np.inf)
    update(got, bps, subs, offsets, preds, staged)
    for a in (got, dense):
        np.minimum.accumulate(a, axis=0, out=a)
        np.minimum.accumulate(a, axis=1, out=a)
    assert np.array_equal(got, dense)


def test_first_at_most_with_nothing_asked():
    """A pass whose (table, column) triples are all filtered out asks about no corner (it crashed
    with an IndexError on the 96-layer Transformer at 64 devices)."""
    tables = np.full((2, 3, 4), 5.0)
    tables[:, 0, :] = np.inf
    bps = Breakpoints(tables)
    bps.add(0, tables[0])
    empty = np.zeros(0, dtype=np.int64)
    assert len(bps.first_at_most(empty, empty, np.zeros(0), strict=False)) == 0
    assert len(bps.first_at_most(empty, empty, np.zeros(0), strict=True)) == 0


@pytest.mark.slow
def test_transformer_96_at_64_devices_sparse_equals_dense(monkeypatch):
    from gpp_solver.formats.cluster import v100_cluster
    from gpp_solver.planners.piper.planner import plan_piper
    from gpp_solver.workloads import build_model

    graph = build_model("transformer", layers=96)
    sparse = plan_piper(graph, v100_cluster(64), 1024)
    monkeypatch.setattr(piper_dp, "SPARSE_SHARE", 0.0)
    dense = plan_piper(graph, v100_cluster(64), 1024)
    assert [s.nodes for s in sparse.stages] == [s.nodes for s in dense.stages]
    assert sparse.predicted.time_per_sample == dense.predicted.time_per_sample


def test_first_best_is_the_published_scan():
    """``_first_best`` (binary search per row) against the published double loop, near-ties included."""

    def scan(t):
        best, bk, bs = np.inf, 0, 0
        for k in range(t.shape[0]):
            for s in range(1, t.shape[1]):
                v = t[k, s]
                if v + 1e-9 * max(1.0, abs(v)) < best:
                    best, bk, bs = float(v), k, s
        return best, bk, bs

    rng = np.random.default_rng(3)
    vals = [np.inf, 1.0, 1.0 + 1e-10, 1.0 + 5e-10, 2.0, 0.5, 0.5 - 1e-10, 3.0, 1e-12, 0.0]
    for _ in range(500):
        K, S = rng.integers(1, 12, size=2)
        t = rng.choice(vals, size=(K, S + 1)) * (rng.uniform(0.5, 2) if rng.random() < 0.3 else 1.0)
        t = np.minimum.accumulate(np.minimum.accumulate(t, axis=0), axis=1)
        assert piper_dp._first_best(t) == scan(t)


def _reference_two_slot(tps, mem, in_s, f, limit):
    """The two-slot heuristic in its plain form (every quantity per instance over every node): the
    reference the per-stage form must equal bit for bit."""
    H, n, L = tps.shape
    rows, cols = np.arange(H)[:, None], np.arange(n)[None, :]
    o = 1 - f if L == 2 else f
    tps_f, mem_f, tps_o, mem_o = tps[rows, cols, f], mem[rows, cols, f], tps[rows, cols, o], mem[rows, cols, o]
    with np.errstate(invalid="ignore", divide="ignore"):
        sav = np.where(in_s, mem_f - mem_o, 0.0)
        cand = in_s & np.isfinite(mem_o) & (sav > 1e-9)
        dtps = np.where(cand, tps_o - tps_f, 0.0)
        ratio = np.where(cand, dtps / np.where(cand, sav, 1.0), np.inf)
    order = np.argsort(ratio, axis=1, kind="stable")
    sav_sorted = np.take_along_axis(np.where(cand, sav, 0.0), order, axis=1)
    cand_sorted = np.take_along_axis(cand, order, axis=1)
    need = np.where(in_s, mem_f, 0.0).sum(axis=1) - limit
    done = cand_sorted & (need[:, None] - np.cumsum(sav_sorted, axis=1) < 1e-9)
    ok, kstar = done.any(axis=1), np.argmax(done, axis=1)
    base = np.where(in_s, tps_f, 0.0).sum(axis=1)
    dsum = np.cumsum(np.take_along_axis(dtps, order, axis=1), axis=1)
    applied = np.zeros((H, n), dtype=bool)
    np.put_along_axis(applied, order, (np.arange(n)[None, :] <= kstar[:, None]) & cand_sorted & ok[:, None], axis=1)
    return np.where(ok, base + dsum[np.arange(H), kstar], np.inf), np.where(applied, o, f)


@pytest.mark.parametrize("seed", range(6))
def test_two_slot_heuristic_per_stage_is_the_reference_bit_for_bit(seed):
    """``StageCostKernel.two_values`` (per-stage slots, only the batch's nodes) and ``fill_many``
    (all d of a degree in one call) against the per-instance form on random stages with sync costs."""
    from gpp_solver.planners.piper.cost import StageCostKernel, fill_many

    rng = np.random.default_rng(200 + seed)
    g = gs.graph_from_dict(random_graph(rng, int(rng.integers(6, 11))))
    checked = 0
    for memory in (800.0, 1600.0):
        inst = build_instance(g, Cluster(devices=16, memory_bytes=memory, inter_node_bandwidth=20.0), 24, mode="piper")
        degs = tuple(type(o)(**{**o.__dict__, "sfw": o.sfw + rng.uniform(0, 3, o.sfw.shape)}) for o in inst.degrees)
        inst = type(inst)(**{**inst.__dict__, "degrees": degs})
        ker = StageCostKernel(inst)
        for opt in inst.degrees:
            S = rng.random((30, inst.n)) < rng.uniform(0.2, 0.9)
            S[:, ~opt.supported] = False
            S[~S.any(axis=1), 0] = True
            ds = [d for d in ker.ds if d * opt.t <= inst.devices]
            cs = ker.costs_many(opt, S, ds, defer=True)
            ref = []
            for d, c in zip(ds, cs):
                r, yi = np.nonzero(c.hard)
                tps = c.tps_full[r]
                with np.errstate(invalid="ignore"):
                    mem = np.where(opt.avail[None], opt.a[None] * yi[:, None, None] + opt.b[None], np.inf)
                ref.append((r, yi, *_reference_two_slot(tps, mem, S[r], np.argmin(tps, axis=2), inst.memory)))
                got, choice = ker.hard_values(opt, S, d, r, yi, c.tps_full, want_choice=True)
                assert np.array_equal(got, ref[-1][2]) and np.array_equal(choice, ref[-1][3])
            fill_many(cs)
            for c, (r, yi, best, _) in zip(cs, ref):
                assert np.array_equal(c.out[r, yi], best + c.cut[r])
            checked += sum(len(x[0]) for x in ref)
    assert checked > 30
