"""The cost model's runtime memory overheads (a cluster with ``memory_overheads``) by hand, and
planning under them: every plan ``solve`` returns fits the whole model."""

from __future__ import annotations

import pytest
from three_node_stage import CLUSTER, DOC, memory_graph

import gpp_solver as gs
from gpp_solver.cost.memory import (
    OPTIMIZER_STEP_SCRATCH,
    POSTED_AHEAD,
    TEMPORARY_OUTPUTS,
    _backward_at_nodes,
    boundary_bytes,
    order_memory,
    stage_memory,
)
from gpp_solver.errors import InvalidClusterError
from gpp_solver.plan.build import StageSpec


def _cluster(cluster_dict, **kw):
    return gs.cluster_from_dict({**cluster_dict, **kw})


def test_absent_means_the_model_without_overheads(diamond, cluster_dict):
    g = gs.graph_from_dict(diamond)
    spec = StageSpec(("b", "c"), (2, 3), 4)
    stages = [StageSpec(("a",), (0,), 4), spec, StageSpec(("d",), (1,), 4)]
    off = _cluster(cluster_dict)
    assert not off.memory_overheads
    assert stage_memory(g, off, spec, 12, stages) == stage_memory(g, off, spec, 12) == 4 * 200 + 6 * 20
    assert "memory_overheads" not in gs.cluster_to_dict(off)
    assert gs.cluster_to_dict(_cluster(cluster_dict, memory_overheads=True))["memory_overheads"] is True


def test_overheads_by_hand(diamond, cluster_dict):
    """Stage {b, c} of a -> {b, c} -> d, 2 replicas, micro-batch 4, 12 samples in flight: nodes of
    100 weight bytes, 10 activation and 5 output bytes per sample (tiny_graphs.node)."""
    g = gs.graph_from_dict(diamond)
    spec = StageSpec(("b", "c"), (2, 3), 4)
    stages = [StageSpec(("a",), (0,), 4), spec, StageSpec(("d",), (1,), 4)]
    assert boundary_bytes(g, stages, spec) == (5.0, 10.0)  # a's output received once; b, c send theirs
    sgd = _cluster(cluster_dict, memory_overheads=True, optimizer_state_factor=2.0)
    rows = 4 / 2
    temporaries = 100 + TEMPORARY_OUTPUTS * rows * 5 + POSTED_AHEAD * rows * (5 + 10)
    # in flight: activations and the received value (b and c save what they send: nothing unsaved);
    # one gradient sent back to a's stage in transit
    activations = 12 / 2 * (20 + 5) + rows * 5
    backward = activations + temporaries
    assert stage_memory(g, sgd, spec, 12, stages) == pytest.approx(2 * 200 + max(backward, 200))
    # a larger stage weight: the data-parallel all-reduce's buckets (W_S) are the larger phase
    big = gs.graph_from_dict({**diamond, "nodes": [dict(n, weight_bytes=1e4) for n in diamond["nodes"]]})
    assert stage_memory(big, sgd, spec, 12, stages) == pytest.approx(2 * 2e4 + 2e4)
    # Adam's class (factor >= 4): its step scratch, 3 tensors of the largest weight, is a phase too
    adam = _cluster(cluster_dict, memory_overheads=True, optimizer_state_factor=4.0)
    one = StageSpec(("b", "c"), (2,), 4)
    stages1 = [StageSpec(("a",), (0,), 4), one, StageSpec(("d",), (1,), 4)]
    got = stage_memory(big, adam, one, 4, stages1)
    assert got == pytest.approx(4 * 2e4 + OPTIMIZER_STEP_SCRATCH * 1e4)


def test_cluster_field_is_a_boolean(cluster_dict):
    with pytest.raises(InvalidClusterError, match="memory_overheads"):
        _cluster(cluster_dict, memory_overheads="yes")


@pytest.mark.parametrize("planner", ["graphpipe", "pipedream", "gpp", "piper", "milp"])
def test_every_plan_fits_the_whole_model(planner, chain, cluster_dict):
    """A memory bound that the model without overheads meets with a plan the overheads break: the
    plan returned fits under the whole model (validate checks it), and a plan that was planned
    again under a lowered memory claims no more than feasible."""
    chain = {
        **chain,
        "nodes": [dict(n, weight_bytes=1000.0, activation_bytes=400.0, output_bytes=300.0) for n in chain["nodes"]],
    }
    g = gs.graph_from_dict(chain)
    base = {**cluster_dict, "devices": 4, "memory_bytes": 4 * 2000 + 2 * 800}
    c = gs.cluster_from_dict({**base, "memory_overheads": True})
    try:
        plain = gs.solve(g, base, mini_batch_size=2, planner=planner, time_limit=10)
    except gs.InfeasibleError:  # nothing fits even without the overheads: nothing fits with them
        with pytest.raises(gs.InfeasibleError):
            gs.solve(g, c, mini_batch_size=2, planner=planner, time_limit=10)
        return
    over = [
        s
        for s in plain.stages
        if stage_memory(g, c, s, s.in_flight_samples, plain.stages, mini_batch_size=2) > c.memory_bytes
    ]
    if planner == "graphpipe":
        assert over, "the instance must need the second planning round"
    try:
        plan = gs.solve(g, c, mini_batch_size=2, planner=planner, time_limit=10)
    except gs.InfeasibleError as exc:
        assert "memory overheads" in str(exc)
        return
    for s in plan.stages:
        assert s.predicted.memory_bytes == pytest.approx(order_memory(g, c, s, s.schedule.order, plan.stages))
        assert s.predicted.memory_bytes <= c.memory_bytes
    if over:
        assert plan.search.status == "feasible"
    else:  # the planner's plan fits as it is: the same plan, its status kept
        assert [s.nodes for s in plan.stages] == [s.nodes for s in plain.stages]
        assert plan.search.status == plain.search.status
    gs.validate(plan, g, c)


def test_a_stage_that_runs_every_forward_first_is_priced_by_phase():
    """Weights 100 (node a), 300 (b), 0 (c); activations per sample 50, 20, 10; outputs 5; one
    replica, b = 2, no messages. Each node's backward allocates the gradients it produces:
    T_a = 100 (a reads the model's input), T_b = 300 + 2 * 5 = 310, T_c = 0 + 2 * 5 = 10."""
    g, c = gs.graph_from_dict(DOC), gs.cluster_from_dict(CLUSTER)
    spec = gs.StageSpec(nodes=("a", "b", "c"), devices=(0,), micro_batch_size=2)
    # at v_k: 2 * (activations of v_1 .. v_k + the gradient flowing in, 5) + T_k, beside the weight
    # gradients already produced (first backward: of the nodes after v_k; a later one: all 400)
    at_a, at_b, at_c = 2 * (50 + 5) + 100, 2 * (70 + 5) + 310, 2 * (80 + 5) + 10  # 210, 460, 180
    first = max(at_a + 300, at_b + 0, at_c + 0)  # 510: a's backward, b's gradients of 300 there
    later = max(at_a, at_b, at_c) + 400  # 860: b's backward with every gradient
    # one micro-batch (B = 2): W + max(first backward, after it W = 400)
    assert first == 510 and later == 860
    assert stage_memory(g, c, spec, 2, [spec], mini_batch_size=2) == pytest.approx(400 + max(first, 400))
    # two micro-batches, both in flight before the first backward (B = 4): the first backward beside
    # the other's 2 * 80 = 160, and the second backward with every gradient
    two = 400 + max(160 + first, later, 400)
    assert two == 1260
    assert stage_memory(g, c, spec, 4, [spec], mini_batch_size=4) == pytest.approx(two)
    # forwards and backwards interleave (B = 4, one in flight): a later backward at its largest
    # node beside every gradient, nothing else waiting: 2 * 400 + 460
    assert stage_memory(g, c, spec, 2, [spec], mini_batch_size=4) == pytest.approx(2 * 400 + at_b)
    # no mini-batch given (a planner's check): the gradients, every activation and the temporaries
    whole = 2 * 400 + 160 + 300 + 2 * 2 * 5
    assert stage_memory(g, c, spec, 2, [spec]) == pytest.approx(whole)


#: x (stage 0) -> q, x -> s, q -> s (stage 1) -> y (stage 2): stage 1 receives x (8 bytes per
#: sample; s consumes it after q, so x's gradient waits while q's backward runs) and sends s's output
MESSAGES = memory_graph(
    [("x", 0, 1, 8), ("q", 40, 6, 4), ("s", 20, 10, 2), ("y", 0, 1, 1)],
    [["x", "q"], ["x", "s"], ["q", "s"], ["s", "y"]],
)


def test_every_forward_first_prices_each_node_and_the_messages_where_they_live():
    """Stage {q, s}, b = 2, one replica, SGD: received 8 and sent 2 bytes per sample."""
    g, c = gs.graph_from_dict(MESSAGES), gs.cluster_from_dict({**CLUSTER, "devices": 3})
    stages = [gs.StageSpec(("x",), (0,), 2), gs.StageSpec(("q", "s"), (1,), 2), gs.StageSpec(("y",), (2,), 2)]
    spec = stages[1]
    assert boundary_bytes(g, stages, spec) == (8.0, 2.0)
    # backward of s, then q; T_k = weight_bytes + 2 * (bytes in): T_q = 40 + 16, T_s = 20 + 2 * 12
    # s's one consumer (y) is in another stage: the gradient flowing into s is the received buffer,
    # priced with the messages, not again at s
    at_s = 2 * 16 + 44  # activations of q and s: 76
    # at q: q's activations and incoming gradient, x's gradient from s, and s's output (sent, so a
    # root of the backward: held whole until it ends, where s's activations would free it at s)
    at_q = 2 * (6 + 4 + 8 + 2) + 56  # 96
    first, later = max(at_s, at_q + 20), max(at_s, at_q) + 60  # 116, 156
    # one micro-batch: its received values 16 and the gradient buffer for what it sent 4 (posted
    # before the forward); the activation it sends (s's output, 2 bytes a sample) is saved by a
    # consumer (s's activation_bytes 10 >= 2), so already in the activations
    assert stage_memory(g, c, spec, 2, stages, mini_batch_size=2) == pytest.approx(60 + 16 + 4 + first)
    # three micro-batches in flight at once: a waiting one holds 2 * 16 + 16 = 48, a finished one
    # 16 + 4 (the gradients it sent back, the activations it sent, held until the step ends); the
    # first backward posts 2 more gradient buffers, the second 1
    first_bw = 2 * 48 + 16 + 3 * 4 + first  # 240
    second_bw = 20 + 48 + 16 + 2 * 4 + later  # 248
    assert stage_memory(g, c, spec, 6, stages, mini_batch_size=6) == pytest.approx(60 + max(first_bw, second_bw))
    # a workspace is priced at its node: 100 bytes per sample on s (reached with every activation
    # alive) against the same on q (reached with s's activations freed and its gradients there)
    big_s = gs.graph_from_dict(
        {**MESSAGES, "nodes": [dict(n, workspace_bytes=100 * (n["id"] == "s")) for n in MESSAGES["nodes"]]}
    )
    big_q = gs.graph_from_dict(
        {**MESSAGES, "nodes": [dict(n, workspace_bytes=100 * (n["id"] == "q")) for n in MESSAGES["nodes"]]}
    )
    assert stage_memory(g, c, spec, 2, stages, mini_batch_size=2) < stage_memory(
        big_q, c, spec, 2, stages, mini_batch_size=2
    )
    on_s = 60 + 20 + max(2 * 16 + 200, at_q + 20)  # 2 * 100 > T_s = 44
    on_q = 60 + 20 + max(at_s, 2 * (6 + 4 + 8 + 2) + 200 + 20)  # 2 * 100 > T_q = 56
    assert stage_memory(big_s, c, spec, 2, stages, mini_batch_size=2) == pytest.approx(on_s)
    assert stage_memory(big_q, c, spec, 2, stages, mini_batch_size=2) == pytest.approx(on_q)
    assert on_s == 312 and on_q == 340


def test_a_sent_value_no_consumer_saves_is_held_beside_the_activations():
    """s's output, sent to y, is saved by no consumer when s's activation_bytes (1) is below its
    output (3 bytes a sample): the stage holds the 2 bytes beyond its activations while they live."""
    doc = memory_graph(
        [("x", 0, 1, 8), ("q", 40, 6, 4), ("s", 20, 1, 3), ("y", 0, 1, 1)],
        [["x", "q"], ["x", "s"], ["q", "s"], ["s", "y"]],
    )
    g, c = gs.graph_from_dict(doc), gs.cluster_from_dict({**CLUSTER, "devices": 3})
    stages = [gs.StageSpec(("x",), (0,), 2), gs.StageSpec(("q", "s"), (1,), 2), gs.StageSpec(("y",), (2,), 2)]
    at_s = 2 * (6 + 1) + 20 + 2 * 12  # 58
    at_q = 2 * (6 + 4 + 8 + 1) + 56  # 94: s's output held whole (1 byte a sample of it in its activations)
    unsaved, buffer = 2 * (3 - 1), 2 * 3
    assert stage_memory(g, c, stages[1], 2, stages, mini_batch_size=2) == pytest.approx(
        60 + 16 + unsaved + buffer + max(at_s, at_q + 20)
    )


def test_runtime_memory_is_added_to_every_stage_with_the_overheads(diamond, cluster_dict):
    """``runtime_memory_bytes`` (the libraries' workspaces a rank holds whatever its stage, measured
    by gpp_runtime.probe on CUDA) is one more term of the runtime's overheads: added to every stage's
    memory with ``memory_overheads``, read by nothing without it, written back when set."""
    g = gs.graph_from_dict(diamond)
    spec = StageSpec(("b", "c"), (2, 3), 4)
    stages = [StageSpec(("a",), (0,), 4), spec, StageSpec(("d",), (1,), 4)]
    on = _cluster(cluster_dict, memory_overheads=True)
    held = _cluster(cluster_dict, memory_overheads=True, runtime_memory_bytes=65 * 2**20)
    assert held.runtime_memory_bytes == 65 * 2**20 and on.runtime_memory_bytes == 0.0
    for s in stages:
        assert stage_memory(g, held, s, 12, stages) == pytest.approx(stage_memory(g, on, s, 12, stages) + 65 * 2**20)
    off = _cluster(cluster_dict, runtime_memory_bytes=65 * 2**20)
    assert stage_memory(g, off, spec, 12, stages) == stage_memory(g, _cluster(cluster_dict), spec, 12, stages)
    assert gs.cluster_to_dict(held)["runtime_memory_bytes"] == 65 * 2**20
    assert "runtime_memory_bytes" not in gs.cluster_to_dict(on)
    for bad in (-1, "64MiB", True):
        with pytest.raises(InvalidClusterError, match="runtime_memory_bytes"):
            _cluster(cluster_dict, runtime_memory_bytes=bad)


@pytest.mark.parametrize("planner", ["graphpipe", "pipedream", "gpp", "piper", "alpa"])
def test_plans_fit_with_the_runtime_memory(planner, chain, cluster_dict):
    """A device whose memory the stages fill without the runtime's own bytes: the plan returned
    fits with them (its stages priced with them; validate agrees), or none is returned."""
    g = gs.graph_from_dict(chain)
    base = {**cluster_dict, "devices": 4, "memory_overheads": True}
    plain = gs.solve(g, base, mini_batch_size=4, planner=planner, time_limit=10)
    reserve = 0.5 * plain.predicted.peak_memory_bytes
    c = gs.cluster_from_dict(
        {**base, "runtime_memory_bytes": reserve, "memory_bytes": plain.predicted.peak_memory_bytes}
    )
    try:
        plan = gs.solve(g, c, mini_batch_size=4, planner=planner, time_limit=10)
    except gs.InfeasibleError:
        return
    for s in plan.stages:
        assert s.predicted.memory_bytes == pytest.approx(order_memory(g, c, s, s.schedule.order, plan.stages))
        assert reserve < s.predicted.memory_bytes <= c.memory_bytes * (1 + 1e-9)
    gs.validate(plan, g, c)


def test_one_micro_batch_a_step_has_no_weight_gradient_waiting_beside_grad():
    """With W in the order (the general rule) and one micro-batch a step, a weight gradient becomes
    ``.grad`` itself (gradients set to None between steps): the largest weight's temporary is not
    priced; with two micro-batches it is (the second one's gradients are summed into the first's)."""
    from gpp_solver.cost.memory import memory_with_overheads

    g = gs.graph_from_dict(MESSAGES)
    stage = gs.StageSpec(("q", "s"), (1,), 2)
    one = memory_with_overheads(g, 2.0, stage, 2, 8.0, 2.0, pending_w_samples=2, micro_batches=1)
    two = memory_with_overheads(g, 2.0, stage, 2, 8.0, 2.0, pending_w_samples=2, micro_batches=2)
    assert two - one == pytest.approx(40.0)  # q's weight bytes, the largest


def test_one_micro_batch_a_step_does_not_count_an_operators_weight_gradient_twice():
    """A measured ``workspace_bytes`` holds the weight gradient the operator produces: with one
    micro-batch a step that gradient is ``.grad`` (in ``osf * W_S``), so the transient is priced
    less the node's weight bytes; with two micro-batches whole."""
    from gpp_solver.cost.memory import memory_with_overheads

    doc = {**MESSAGES, "nodes": [dict(n, workspace_bytes=100 * (n["id"] == "q")) for n in MESSAGES["nodes"]]}
    g = gs.graph_from_dict(doc)
    stage = gs.StageSpec(("q", "s"), (1,), 2)
    one = memory_with_overheads(g, 2.0, stage, 2, 8.0, 2.0, pending_w_samples=2, micro_batches=1)
    two = memory_with_overheads(g, 2.0, stage, 2, 8.0, 2.0, pending_w_samples=2, micro_batches=2)
    # 2 rows x 100 = 200 with two micro-batches; less q's 40 weight bytes with one
    assert two - one == pytest.approx(40.0)


def test_unstated_overheads_are_priced_for_a_profiled_graph(chain, cluster_dict):
    """A cluster that does not state ``memory_overheads`` (``gpp cluster``, a file written by hand)
    prices the runtime's overheads for a graph ``gpp_runtime.profile`` measured (``extra.profile``)
    and not for another; a stated value holds either way."""
    from gpp_solver.cost.memory import overheads_priced

    plain = gs.graph_from_dict(chain)
    profiled = gs.graph_from_dict({**chain, "extra": {"profile": {"device": "cpu"}}})
    unstated = gs.cluster_from_dict(cluster_dict)
    assert unstated.memory_overheads is None and "memory_overheads" not in gs.cluster_to_dict(unstated)
    assert overheads_priced(unstated, profiled) and not overheads_priced(unstated, plain)
    off, on = _cluster(cluster_dict, memory_overheads=False), _cluster(cluster_dict, memory_overheads=True)
    assert not overheads_priced(off, profiled) and overheads_priced(on, plain)
    assert gs.cluster_to_dict(off)["memory_overheads"] is False
    spec = StageSpec(tuple(n["id"] for n in chain["nodes"]), (0,), 2)
    assert stage_memory(profiled, unstated, spec, 4, [spec]) == stage_memory(profiled, on, spec, 4, [spec])
    assert stage_memory(plain, unstated, spec, 4, [spec]) == stage_memory(plain, off, spec, 4, [spec])
    assert stage_memory(profiled, on, spec, 4, [spec]) > stage_memory(profiled, off, spec, 4, [spec])
    plan = gs.solve(profiled, unstated, mini_batch_size=8, planner="graphpipe")
    gs.validate(plan, profiled, unstated)  # priced with the overheads, as the validator prices it
    assert plan.predicted.peak_memory_bytes == max(
        stage_memory(profiled, on, s, s.in_flight_samples, plan.stages) for s in plan.stages
    )


def test_an_interleaved_order_prices_the_messages_it_posts_ahead():
    """Stage {q, s} of ``MESSAGES`` (received 8, sent 2 bytes per sample), b = 2, SGD, in a 1F1B
    order of two micro-batches: while B0 runs, the runtime has posted F1's received values and
    B1's gradient buffer (the 2 compute actions after it), not 2 of each."""
    from gpp_solver.cost.memory import posted_ahead

    g, c = gs.graph_from_dict(MESSAGES), gs.cluster_from_dict({**CLUSTER, "devices": 3})
    stages = [gs.StageSpec(("x",), (0,), 2), gs.StageSpec(("q", "s"), (1,), 2), gs.StageSpec(("y",), (2,), 2)]
    one_f_one_b = [("F", 0), ("B", 0), ("F", 1), ("B", 1)]
    assert posted_ahead(one_f_one_b) == ((0, 0), (1, 1))
    assert posted_ahead([("F", 0), ("F", 1), ("B", 0), ("B", 1), ("F", 2), ("B", 2)]) == ((0, 0), (1, 1))
    assert posted_ahead([("F", 0), ("F", 1), ("F", 2), ("B", 0), ("B", 1), ("B", 2)]) == ((0, 0), (0, 1), (0, 2))
    h = 2 * (6 + 4 + 8 + 2) + 56  # the backward at q (Example 2 of docs/cost-model.md): 96
    posted = 2 * 2 + (2 * 8 + 2 * 2)  # its own gradient buffer, F1's received values, B1's buffer: 24
    expected = 2 * 60 + 2 * 8 + 2 * 8 + posted + h  # weights and gradients, received, in transit: 272
    assert order_memory(g, c, stages[1], one_f_one_b, stages) == pytest.approx(expected) == 272
    # a planner's estimate, before the order is made, posts 2 of each: 16 more
    assert stage_memory(g, c, stages[1], 2, stages, mini_batch_size=4) == pytest.approx(expected + 16)


def test_a_concatenations_gradient_is_held_whole_until_its_last_view_is_consumed():
    """docs/cost-model.md's example (``views_k``): x1 and x2 concatenated, then a head; one stage,
    ``b = 2``. Backward order head, cat, x2, x1: at x1 (workspace 200 a sample) the gradient flowing
    in is x1's view of cat's gradient (10 a sample), whose storage still holds x2's consumed part (30)."""

    def graph(views: bool):
        node = {"fw_time": [1], "bw_time": [1], "weight_bytes": 0}
        cat = {"grad_views": True} if views else {}
        nodes = [
            {**node, "id": "x1", "activation_bytes": 5, "output_bytes": 10, "workspace_bytes": 200},
            {**node, "id": "x2", "activation_bytes": 5, "output_bytes": 30},
            {**node, "id": "cat", "activation_bytes": 0, "output_bytes": 40, **cat},
            {**node, "id": "head", "activation_bytes": 40, "output_bytes": 1},
        ]
        edges = [["x1", "cat"], ["x2", "cat"], ["cat", "head"]]
        return gs.graph_from_dict(
            {"format": "gpp-graph/1", "name": "cat", "micro_batch_sizes": [1], "nodes": nodes, "edges": edges}
        )

    stage = StageSpec(("x1", "x2", "cat", "head"), (0,), 2)
    # without: H_x1 = 2 * (5 + 10) + 2 * 200 = 430 (x2: 2 * (10 + 30 + 10) = 100; cat: 2 * (10 + 40) + 2 * 40 = 180;
    # head: 2 * (50 + 1) + 2 * 40 = 182); with: views_x1 = 30, H_x1 = 2 * (5 + 10 + 30) + 400 = 490
    assert _backward_at_nodes(graph(False), stage, 2.0) == (430.0, 430.0)
    assert _backward_at_nodes(graph(True), stage, 2.0) == (490.0, 490.0)
    doc = gs.graph_to_dict(graph(True))
    assert [n.get("grad_views") for n in doc["nodes"]] == [None, None, True, None]  # written only when true
