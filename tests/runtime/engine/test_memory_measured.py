"""Each rank's peak memory, measured, beside the cost model's prediction (``gpp_runtime.engine.memory``).

The meter is checked on allocations of known size; ``gpp_runtime.train --json`` reports every rank with
the contract's field names; and on planned models trained on 1-2 CPU ranks (SGD and Adam) the
measured peak of every rank is within the targets: measured <= 1.05 x predicted (no surprise out
of memory) and predicted <= 1.25 x measured (no wasted devices).
"""

from __future__ import annotations

import json

import pytest
import torch
from runtime_plans import torchrun, write_cluster

from gpp_runtime.capture.fx_graph import load_workload
from gpp_runtime.capture.profiler import profile
from gpp_runtime.engine.memory import MemoryMeter, state_factor_of, storage_bytes
from gpp_solver import save_plan, solve

RANK_FIELDS = {"rank", "stage", "peak_memory_bytes", "predicted_peak_memory_bytes"}


def test_meter_counts_resident_tensors_and_the_peak_of_allocations():
    resident = [torch.zeros(1000), torch.zeros(500)]
    meter = MemoryMeter(torch.device("cpu"), first=1, steps=1)
    meter.step_starts(0, lambda: resident)
    assert not meter._open  # step 0 is not measured
    meter.step_starts(1, lambda: resident + [resident[0][:10]])  # a view: its storage once
    a = torch.ones(20000)  # 80 kB
    b = torch.ones(10000)  # 40 kB
    del a
    c = torch.ones(5000)  # 20 kB, while b is alive: the peak is a + b
    del b, c
    meter.step_starts(2, lambda: resident)  # closes the window
    base = storage_bytes(resident)
    assert base == 6000
    assert base + 120_000 <= meter.peak <= base + 120_000 + 4096
    assert meter.measured_steps == [1]


def test_the_window_closes_after_the_last_measured_steps_optimizer_step():
    """What the caller's loop allocates after the optimizer step (the next mini-batch's inputs:
    host data, not the stage's) is not in the peak; before the last measured step, nothing closes."""
    resident = [torch.zeros(1000)]
    meter = MemoryMeter(torch.device("cpu"), first=1, steps=2)
    meter.step_starts(1, lambda: resident)
    meter.optimizer_stepped(1)  # step 2 is measured too: still open
    assert meter.measuring
    meter.step_starts(2, lambda: resident)
    a = torch.ones(10000)  # 40 kB during the step
    del a
    meter.optimizer_stepped(2)
    assert not meter.measuring
    inputs = torch.ones(50000)  # 200 kB made for step 3, after the window
    meter.step_starts(3, lambda: resident)
    assert 4000 + 40_000 <= meter.peak <= 4000 + 40_000 + 4096
    assert meter.measured_steps == [1, 2]
    del inputs


def test_state_factor_of_the_optimizers():
    p = [torch.nn.Parameter(torch.zeros(3))]
    assert state_factor_of(torch.optim.SGD(p, lr=0.1)) == 2.0
    assert state_factor_of(torch.optim.SGD(p, lr=0.1, momentum=0.9)) == 3.0
    assert state_factor_of(torch.optim.Adam(p)) == 4.0
    assert state_factor_of(torch.optim.AdamW(p, amsgrad=True)) == 5.0
    assert state_factor_of(torch.optim.Adagrad(p)) is None


def _planned(
    tmp_path,
    spec: str,
    batch: int,
    sizes: list[int],
    devices: int,
    fraction: float | None = None,
    planner: str = "graphpipe",
    **options,
):
    """Profile ``spec``, plan it on ``devices`` CPU ranks (memory ``fraction`` of one stage's need,
    to force a pipeline), and return (plan, graph path, cluster path)."""
    doc = profile(load_workload(spec), sizes, warmup=0, repeats=1, name=spec)
    gpath = tmp_path / "graph.json"
    gpath.write_text(json.dumps(doc))
    need = 4 * sum(n["weight_bytes"] for n in doc["nodes"]) + batch * sum(n["activation_bytes"] for n in doc["nodes"])
    cluster = {
        "format": "gpp-cluster/1",
        "devices": devices,
        "memory_bytes": need * fraction if fraction else 1e12,
        "inter_node_bandwidth": 1e9,
        "latency": 1e-5,
        "optimizer_state_factor": 4.0,
        "memory_overheads": True,
    }
    cpath = tmp_path / "cluster.json"
    cpath.write_text(json.dumps(cluster))
    plan = solve(doc, cluster, mini_batch_size=batch, planner=planner, time_limit=20, **options)
    save_plan(plan, tmp_path / "plan.json")
    return plan, gpath, cpath


def _train_ranks(tmp_path, spec: str, plan, gpath, cpath, optimizer: str, extra: tuple = ()) -> list[dict]:
    res = torchrun(
        plan.devices_used,
        [
            "--plan",
            str(tmp_path / "plan.json"),
            "--model",
            spec,
            "--steps",
            "3",
            "--warmup-steps",
            "2",
            "--optimizer",
            optimizer,
            "--json",
            "--quiet",
            "--graph",
            str(gpath),
            "--cluster",
            str(cpath),
            *extra,
        ],
        timeout=300,
    )
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    doc = json.loads(res.stdout.strip().splitlines()[-1])["gpp_runtime"]
    assert doc["predicted_iteration_seconds"] == pytest.approx(plan.predicted.iteration_time)
    ranks = doc["ranks"]
    assert sorted(r["rank"] for r in ranks) == list(range(plan.devices_used))
    assert all(set(r) == RANK_FIELDS for r in ranks)
    return ranks


def _assert_targets(ranks: list[dict]) -> None:
    for r in ranks:
        meas, pred = r["peak_memory_bytes"], r["predicted_peak_memory_bytes"]
        assert meas > 0 and pred > 0, r
        assert meas <= 1.05 * pred, f"rank {r['rank']}: measured {meas} > 1.05 x predicted {pred}"
        assert pred <= 1.25 * meas, f"rank {r['rank']}: predicted {pred} > 1.25 x measured {meas}"


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_two_stage_mlp_within_targets(tmp_path, optimizer):
    """examples.sequential:bench (width 512) on 2 ranks, memory forcing two stages."""
    spec = "examples.sequential:bench"
    plan, g, c = _planned(tmp_path, spec, 64, [16, 32], 2, fraction=0.7)
    assert len(plan.stages) == 2 and plan.devices_used == 2  # the shape, before training
    _assert_targets(_train_ranks(tmp_path, spec, plan, g, c, optimizer))


@pytest.mark.slow
@pytest.mark.parametrize(
    "spec,batch,sizes,devices",
    [
        ("examples.real_models:resnet18", 8, [2, 4], 2),
        ("examples.real_models:bert_tiny", 16, [4, 8], 2),
        # one stage on 2 replicas, one micro-batch of 16 rows each: its convolutions' workspace priced
        # at their node of the backward, not on top of the whole forward's activations
        ("examples.real_models:two_tower", 32, [8, 16], 2),
        ("examples.two_branch:bench", 64, [16, 32], 2),
    ],
)
@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_real_models_within_targets(tmp_path, spec, batch, sizes, devices, optimizer):
    plan, g, c = _planned(tmp_path, spec, batch, sizes, devices)
    assert plan.devices_used <= devices
    _assert_targets(_train_ranks(tmp_path, spec, plan, g, c, optimizer))


@pytest.mark.slow
@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_tied_gpt2_across_two_stages_within_targets(tmp_path, optimizer):
    """HuggingFace GPT-2 with its head tied to the embedding, memory forcing two stages of micro-batch
    2 with the embedding and the head on different stages: each stage holds the tied weight, its
    gradient and its optimizer state, and the measured peaks hold the targets on both ranks."""
    spec = "examples.real_models:gpt2_tiny_tied"
    # zero off: two replicas sharding the optimizer state would fit one stage (ZeRO-1 has its own test)
    plan, g, c = _planned(tmp_path, spec, 4, [2], 2, fraction=0.65, zero="off")
    assert len(plan.stages) == 2 and plan.devices_used == 2  # the shape, before training
    assert [s.micro_batch_size for s in plan.stages] == [2, 2]
    stage_of = {v: s.id for s in plan.stages for v in s.nodes}
    assert stage_of["embedding"] != stage_of["linear"]  # the tied weight on both stages
    _assert_targets(_train_ranks(tmp_path, spec, plan, g, c, optimizer))


@pytest.mark.slow
@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_googlenet_pipeline_within_targets(tmp_path, optimizer):
    """torchvision googlenet (inception blocks: four parallel branches concatenated), memory forcing a
    two-stage pipeline on 2 ranks."""
    spec = "examples.real_models:googlenet"
    plan, g, c = _planned(tmp_path, spec, 4, [1, 2], 2, fraction=0.7)
    assert len(plan.stages) == 2 and plan.devices_used == 2  # the shape, before training
    _assert_targets(_train_ranks(tmp_path, spec, plan, g, c, optimizer))


def test_one_micro_batch_is_priced_by_phase_within_targets(tmp_path):
    """torchvision mobilenet_v3_small, one device, one micro-batch of 8 (SGD): the gradients, freed
    between steps, never coexist with all the activations; pricing both for the whole step put the
    prediction at 1.30 x the measured peak."""
    spec = "examples.real_models:mobilenet_v3_small"
    plan, g, c = _planned(tmp_path, spec, 8, [8], 1)
    assert len(plan.stages) == 1 and plan.devices_used == 1 and plan.stages[0].micro_batch_size == 8
    _assert_targets(_train_ranks(tmp_path, spec, plan, g, c, "sgd"))


def test_a_concatenations_gradient_stays_whole_until_its_last_branch_within_targets(tmp_path):
    """Two conv towers concatenated, one stage, one micro-batch of 64 (Adam): ``torch.cat``'s backward
    hands each tower a view of one gradient, whose storage lives until the last tower's backward;
    priced as parts freed one by one, the stage measured 1.067x its prediction (the profile now
    marks the concatenation ``grad_views``)."""
    spec = "tests.runtime.memory_models:conv_towers"
    plan, g, c = _planned(tmp_path, spec, 64, [16, 64], 1)
    assert len(plan.stages) == 1 and plan.devices_used == 1 and plan.stages[0].micro_batch_size == 64
    assert [n["id"] for n in json.loads(g.read_text())["nodes"] if n.get("grad_views")] == ["cat"]
    _assert_targets(_train_ranks(tmp_path, spec, plan, g, c, "adam"))


def test_zero_bubble_stage_within_targets_with_kept_gradients(tmp_path):
    """bert tiny on 2 ranks, its last stage's W put off until both B ran (2 micro-batches' kept
    gradients at once): measured within the targets of the prediction that prices them, and the
    prediction without them (the in-flight activations alone) too low."""
    from gpp_solver import cluster_from_dict, graph_from_dict, validate
    from gpp_solver.action import parse_order
    from gpp_solver.cost import kept_gradient_bytes, stage_memory
    from gpp_solver.plan.build import StageSpec, build_plan
    from gpp_solver.types import SearchInfo

    spec = "examples.real_models:bert_tiny"
    doc = profile(load_workload(spec), [4, 8], warmup=0, repeats=1, name=spec)
    (tmp_path / "graph.json").write_text(json.dumps(doc))
    ids = [n["id"] for n in doc["nodes"]]
    cut = ids.index("encoder.encoder.layer.1")
    cdoc = write_cluster(tmp_path, 2, 4.0)
    graph, cluster = graph_from_dict(doc), cluster_from_dict(cdoc)
    specs = [
        StageSpec(tuple(ids[:cut]), (0,), 8, order=parse_order("F0 F1 B0 W0 B1 W1")),
        StageSpec(tuple(ids[cut:]), (1,), 8, order=parse_order("F0 B0 F1 B1 W0 W1")),
    ]
    plan = build_plan(graph, cluster, specs, 16, planner="manual", search=SearchInfo(0.0, "feasible"))
    validate(plan, graph, cluster)
    last = plan.stages[1]
    assert len(plan.stages) == 2 and plan.devices_used == 2 and last.in_flight_samples == 16  # the shape
    assert kept_gradient_bytes(graph, plan.stages[0]) == 0  # fed by the model's inputs alone
    kept = kept_gradient_bytes(graph, last)
    assert kept > 0
    without = stage_memory(graph, cluster, last, 16, plan.stages)
    assert last.predicted.memory_bytes == pytest.approx(without + 16 * kept)
    save_plan(plan, tmp_path / "plan.json")
    ranks = _train_ranks(tmp_path, spec, plan, tmp_path / "graph.json", tmp_path / "cluster.json", "adam")
    _assert_targets(ranks)
    measured = next(r["peak_memory_bytes"] for r in ranks if r["stage"] == 1)
    assert measured > 1.05 * without  # the kept gradients are real: the rule without them misses


def test_a_cut_before_an_in_place_relu_within_targets(tmp_path):
    """The two-tower model cut between its image tower's first convolution and the in-place ReLU
    after it (PipeDream's pick on 2 CPU ranks), one micro-batch of 32, SGD. Before 2026-11-26 the
    runtime held the received value three times on the second stage (the buffer, a copy of every
    received piece, a copy for the ReLU: measured 1.09 x predicted) and the model priced the first
    stage's sent activation and the gradient flowing into it twice (predicted 1.37 x measured)."""
    from gpp_solver import cluster_from_dict, graph_from_dict
    from gpp_solver.plan.build import StageSpec, build_plan
    from gpp_solver.types import SearchInfo

    spec = "examples.real_models:two_tower"
    doc = profile(load_workload(spec), [16, 32], warmup=0, repeats=1, name=spec)
    (tmp_path / "graph.json").write_text(json.dumps(doc))
    ids = [n["id"] for n in doc["nodes"]]
    first = ("embed", "text", "image.0")
    assert set(first) <= set(ids)
    graph, cluster = graph_from_dict(doc), cluster_from_dict(write_cluster(tmp_path, 2, 2.0))
    specs = [StageSpec(first, (0,), 32), StageSpec(tuple(v for v in ids if v not in first), (1,), 32)]
    plan = build_plan(graph, cluster, specs, 32, planner="manual", search=SearchInfo(0.0, "feasible"))
    assert len(plan.stages) == 2 and plan.devices_used == 2 and plan.stages[0].micro_batch_size == 32
    save_plan(plan, tmp_path / "plan.json")
    ranks = _train_ranks(tmp_path, spec, plan, tmp_path / "graph.json", tmp_path / "cluster.json", "sgd")
    _assert_targets(ranks)


def test_many_micro_batches_of_one_hold_no_more_than_a_few(tmp_path):
    """Two conv towers on two stages, micro-batches of one sample: 12 micro-batches a step hold what 2
    do (each send is waited for once its receiver has posted the receive, not when the step ends:
    before, each micro-batch's sent activation and returned gradient stayed until the step's end,
    4.3x and 7.2x the prediction on a 64-micro-batch step), and both within the targets."""
    from gpp_solver import cluster_from_dict, graph_from_dict
    from gpp_solver.plan.build import StageSpec, build_plan
    from gpp_solver.types import SearchInfo

    spec = "tests.runtime.memory_models:conv_towers"
    doc = profile(load_workload(spec), [1, 2], warmup=0, repeats=1, name=spec)
    (tmp_path / "graph.json").write_text(json.dumps(doc))
    ids = [n["id"] for n in doc["nodes"]]
    first = tuple(v for v in ids if v.startswith(("a1", "a2", "gelu")))
    assert first and len(first) < len(ids)
    graph, cluster = graph_from_dict(doc), cluster_from_dict(write_cluster(tmp_path, 2, 4.0))
    peaks = {}
    for n in (2, 12):
        specs = [StageSpec(first, (0,), 1), StageSpec(tuple(v for v in ids if v not in first), (1,), 1)]
        plan = build_plan(graph, cluster, specs, n, planner="manual", search=SearchInfo(0.0, "feasible"))
        assert len(plan.stages) == 2 and plan.devices_used == 2  # the shape, before training
        assert all(s.micro_batch_size == 1 for s in plan.stages) and plan.mini_batch_size == n
        save_plan(plan, tmp_path / "plan.json")
        ranks = _train_ranks(tmp_path, spec, plan, tmp_path / "graph.json", tmp_path / "cluster.json", "adam")
        _assert_targets(ranks)
        peaks[n] = {r["stage"]: r["peak_memory_bytes"] for r in ranks}
    for stage in (0, 1):
        assert peaks[12][stage] <= 1.1 * peaks[2][stage], peaks


def _conv_towers_recomputing(tmp_path, order: str | None, recompute: tuple[bool, bool]):
    """The two conv towers on two stages, four micro-batches of 2 (``order`` on both stages, else
    1F1B), each stage recomputing or not; the plan and its ranks, trained with Adam."""
    from gpp_solver import cluster_from_dict, graph_from_dict
    from gpp_solver.action import parse_order
    from gpp_solver.plan.build import StageSpec, build_plan
    from gpp_solver.types import SearchInfo

    spec = "tests.runtime.memory_models:conv_towers"
    gpath = tmp_path / "graph.json"
    if not gpath.exists():
        gpath.write_text(json.dumps(profile(load_workload(spec), [2], warmup=0, repeats=1, name=spec)))
    doc = json.loads(gpath.read_text())
    ids = [n["id"] for n in doc["nodes"]]
    first = tuple(v for v in ids if v.startswith(("a1", "a2", "gelu")))
    graph, cluster = graph_from_dict(doc), cluster_from_dict(write_cluster(tmp_path, 2, 4.0))
    parsed = parse_order(order) if order else None
    specs = [
        StageSpec(first, (0,), 2, order=parsed, recompute=recompute[0]),
        StageSpec(tuple(v for v in ids if v not in first), (1,), 2, order=parsed, recompute=recompute[1]),
    ]
    plan = build_plan(graph, cluster, specs, 8, planner="manual", search=SearchInfo(0.0, "feasible"))
    assert len(plan.stages) == 2 and plan.devices_used == 2  # the shape, before training
    assert [s.recompute for s in plan.stages] == list(recompute)
    save_plan(plan, tmp_path / "plan.json")
    return plan, _train_ranks(tmp_path, spec, plan, gpath, tmp_path / "cluster.json", "adam")


def test_a_stage_that_recomputes_holds_less_within_targets(tmp_path):
    """1F1B on the two conv towers: the first stage holds two micro-batches; recomputing, it keeps
    neither's activations while they wait (its inputs are the model's), and one again in its
    backward: measured lower, and every rank within the targets, with and without."""
    peaks = {}
    for recompute in (False, True):
        plan, ranks = _conv_towers_recomputing(tmp_path, None, (recompute, False))
        assert plan.stages[0].in_flight_samples == 4  # two micro-batches of 2, the shape
        _assert_targets(ranks)
        peaks[recompute] = {r["stage"]: r["peak_memory_bytes"] for r in ranks}
    assert peaks[True][0] < 0.9 * peaks[False][0], peaks


@pytest.mark.slow  # four trainings; the 1F1B test above runs by default
def test_stages_that_recompute_every_forward_first_never_hold_more_than_predicted(tmp_path):
    """Every forward first on both stages (four micro-batches in flight): recomputing, both stages
    measure lower and never above 1.05x their prediction. The prediction is on the safe side here
    (0.72x the first stage's measured peak on 2026-12-07, below the 0.8 the targets ask for: the
    values a waiting micro-batch sent are priced until its backward, where the receiver's posted
    receives free them before; docs/results.md)."""
    peaks, predicted = {}, {}
    for recompute in (False, True):
        order = "F0 F1 F2 F3 B0 B1 B2 B3"
        plan, ranks = _conv_towers_recomputing(tmp_path, order, (recompute, recompute))
        assert [s.in_flight_samples for s in plan.stages] == [8, 8]
        for r in ranks:
            assert r["peak_memory_bytes"] <= 1.05 * r["predicted_peak_memory_bytes"], r
        peaks[recompute] = {r["stage"]: r["peak_memory_bytes"] for r in ranks}
        predicted[recompute] = {s.id: s.predicted.memory_bytes for s in plan.stages}
    for stage in (0, 1):
        assert predicted[True][stage] < predicted[False][stage]
        assert peaks[True][stage] < peaks[False][stage], (peaks, predicted)


def test_values_a_stage_sends_stay_whole_until_its_backward_ends(tmp_path):
    """Development seed 4 of the model suite (an MLP tower beside a pre-norm attention block), cut
    inside the block after its MLP's first linear, one micro-batch of 16: the first stage sends
    that linear's output and the residual stream, the roots of its backward, which stay whole
    until the backward ends. Priced as freed where the backward passes their producers, the
    first stage measured 1.094x its prediction (0.77 MB over, at the attention's softmax)."""
    from gpp_solver import cluster_from_dict, graph_from_dict
    from gpp_solver.plan.build import StageSpec, build_plan
    from gpp_solver.types import SearchInfo

    spec = "benchmarks.model_suite:seed_4"
    doc = profile(load_workload(spec), [16], warmup=0, repeats=1, name=spec)
    (tmp_path / "graph.json").write_text(json.dumps(doc))
    ids = [n["id"] for n in doc["nodes"]]
    cut = ids.index("branches.1.1.up") + 1
    graph, cluster = graph_from_dict(doc), cluster_from_dict(write_cluster(tmp_path, 2, 4.0))
    specs = [StageSpec(tuple(ids[:cut]), (0,), 16), StageSpec(tuple(ids[cut:]), (1,), 16)]
    plan = build_plan(graph, cluster, specs, 16, planner="manual", search=SearchInfo(0.0, "feasible"))
    assert len(plan.stages) == 2 and plan.devices_used == 2  # the shape, before training
    assert plan.mini_batch_size == 16 and all(s.micro_batch_size == 16 for s in plan.stages)
    save_plan(plan, tmp_path / "plan.json")
    ranks = _train_ranks(tmp_path, spec, plan, tmp_path / "graph.json", tmp_path / "cluster.json", "adam")
    _assert_targets(ranks)


def test_autocast_weight_copies_are_held_per_micro_batch_in_flight(tmp_path):
    """A wide MLP in bf16-autocast on two stages, micro-batches of one sample: each micro-batch's
    forward casts its stage's weights to bfloat16 and its backward reads the copies, so every
    micro-batch in flight holds a set. Counted per sample at the profile's largest size (8), as
    activations were before ``weight_copy_bytes``, the copies of 1F1B's in-flight micro-batches
    were priced at an eighth: with SGD both stages measured 1.15x that prediction, 1.00x this one."""
    from gpp_solver import cluster_from_dict, graph_from_dict
    from gpp_solver.plan.build import StageSpec, build_plan
    from gpp_solver.types import SearchInfo

    spec = "tests.runtime.memory_models:wide_mlp"
    doc = profile(load_workload(spec), [1, 8], warmup=0, repeats=1, name=spec, precision="bf16-autocast")
    (tmp_path / "graph.json").write_text(json.dumps(doc))
    nodes = {n["id"]: n for n in doc["nodes"]}
    # the three layers whose input needs grad save their bf16 weight (256 x 256 x 2 bytes); the
    # first, fed the model's input, computes no input gradient and saves none
    assert [nodes[f"layers.{i}"].get("weight_copy_bytes", 0) for i in range(4)] == [0, 131072, 131072, 131072]
    ids = [n["id"] for n in doc["nodes"]]
    cut = ids.index("layers.2")
    # SGD: no optimizer-step scratch, so the backward's phase, with the copies, is the peak
    graph, cluster = graph_from_dict(doc), cluster_from_dict(write_cluster(tmp_path, 2, 2.0))
    specs = [StageSpec(tuple(ids[:cut]), (0,), 1), StageSpec(tuple(ids[cut:]), (1,), 1)]
    plan = build_plan(graph, cluster, specs, 8, planner="manual", search=SearchInfo(0.0, "feasible"))
    assert len(plan.stages) == 2 and plan.devices_used == 2  # the shape, before training
    assert plan.mini_batch_size == 8 and all(s.micro_batch_size == 1 for s in plan.stages)
    assert sum(1 for kind, _ in plan.stages[0].schedule.order[:3] if kind == "F") >= 2  # 1F1B: 2 in flight
    save_plan(plan, tmp_path / "plan.json")
    extra = ("--precision", "bf16-autocast")
    ranks = _train_ranks(tmp_path, spec, plan, tmp_path / "graph.json", tmp_path / "cluster.json", "sgd", extra)
    _assert_targets(ranks)


def test_memory_warnings_name_the_rank_and_the_excess():
    from gpp_runtime.engine.memory import memory_warnings

    ranks = [
        {"rank": 1, "stage": 1, "peak_memory_bytes": 1_200_000, "predicted_peak_memory_bytes": 1_000_000},
        {"rank": 0, "stage": 0, "peak_memory_bytes": 900_000, "predicted_peak_memory_bytes": 800_000},
        {"rank": 2, "stage": 2, "peak_memory_bytes": 500_000, "predicted_peak_memory_bytes": 490_000},
        {"rank": 3, "stage": 2, "peak_memory_bytes": None, "predicted_peak_memory_bytes": 490_000},
    ]
    lines = memory_warnings(ranks, limit=1_000_000)
    assert len(lines) == 2
    assert lines[0].startswith("rank 0 (stage 0)") and "1.12x the 800,000 bytes" in lines[0]
    assert lines[1].startswith("rank 1 (stage 1)") and "200,000 bytes (20.0%) over the 1,000,000 bytes" in lines[1]
    assert "conservative" not in " ".join(lines)
    assert memory_warnings(ranks[2:], limit=None) == []


def _data_parallel(graph_path, cluster_path, batch: int, micro_batch: int, zero: int):
    """The whole graph as one stage on 2 replicas, its optimizer state sharded (``zero`` 1) or not."""
    import gpp_solver as gs
    from gpp_solver.plan.build import StageSpec, build_plan
    from gpp_solver.types import SearchInfo

    graph, cluster = gs.load_graph(graph_path), gs.load_cluster(cluster_path)
    spec = StageSpec(tuple(n.id for n in graph.nodes), (0, 1), micro_batch, zero=zero)
    return build_plan(graph, cluster, [spec], batch, planner="hand", search=SearchInfo(0.0, "feasible"))


@pytest.mark.parametrize("optimizer", [pytest.param("sgd", marks=pytest.mark.slow), "adam"])
def test_replicas_that_shard_the_optimizer_state_within_targets(tmp_path, optimizer):
    """examples.sequential:bench (width 512, weight-heavy) as one stage on 2 replicas, its optimizer
    state sharded: each rank holds the weights, the gradients and half the state, within targets."""
    spec = "examples.sequential:bench"
    _plan, g, c = _planned(tmp_path, spec, 64, [16, 32], 2)
    whole, sharded = (_data_parallel(g, c, 64, 32, zero) for zero in (0, 1))
    assert [(len(s.devices), s.zero) for s in sharded.stages] == [(2, 1)]  # the shape, before training
    assert sharded.predicted.peak_memory_bytes < whole.predicted.peak_memory_bytes
    save_plan(sharded, tmp_path / "plan.json")
    _assert_targets(_train_ranks(tmp_path, spec, sharded, g, c, optimizer))


#: the real models issue-level lever tests train (spec, mini-batch, profiled micro-batch sizes)
LEVER_MODELS = [
    ("examples.real_models:resnet18", 8, [2, 4]),
    ("examples.real_models:bert_tiny", 16, [4, 8]),
    ("examples.real_models:gpt2_tiny_tied", 4, [1, 2]),
    ("examples.real_models:two_tower", 32, [8, 16]),
]


def _halves_recomputing(graph_path, cluster_path, batch: int, micro_batch: int):
    """The graph cut in two at the middle of its node order (a topological prefix and the rest, one
    rank each), 1F1B, both stages recomputing."""
    import gpp_solver as gs
    from gpp_solver.plan.build import StageSpec, build_plan
    from gpp_solver.types import SearchInfo

    graph, cluster = gs.load_graph(graph_path), gs.load_cluster(cluster_path)
    ids = [n.id for n in graph.nodes]
    first = tuple(ids[: len(ids) // 2])
    specs = [
        StageSpec(first, (0,), micro_batch, recompute=True),
        StageSpec(tuple(ids[len(ids) // 2 :]), (1,), micro_batch, recompute=True),
    ]
    return build_plan(graph, cluster, specs, batch, planner="hand", search=SearchInfo(0.0, "feasible"))


@pytest.mark.slow
@pytest.mark.parametrize("spec,batch,sizes", LEVER_MODELS)
@pytest.mark.parametrize("lever", ["recompute", "zero"])
def test_real_models_with_each_lever_within_targets(tmp_path, spec, batch, sizes, lever):
    """Each memory lever on four real models, Adam, 2 CPU ranks: two stages that both recompute
    (the model cut at the middle of its node order, micro-batches of the smaller size), or the
    whole model as one stage on 2 replicas with its optimizer state sharded (ZeRO-1)."""
    _plan, g, c = _planned(tmp_path, spec, batch, sizes, 2)
    if lever == "recompute":
        plan = _halves_recomputing(g, c, batch, sizes[0])
        assert [(len(s.devices), s.recompute) for s in plan.stages] == [(1, True), (1, True)]  # the shape
    else:
        plan = _data_parallel(g, c, batch, batch // 2, 1)
        assert [(len(s.devices), s.zero) for s in plan.stages] == [(2, 1)]  # the shape, before training
    save_plan(plan, tmp_path / "plan.json")
    _assert_targets(_train_ranks(tmp_path, spec, plan, g, c, "adam"))
