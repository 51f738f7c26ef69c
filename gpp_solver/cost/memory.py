"""The memory of one device of a stage (``docs/cost-model.md``, *Memory of one device*):

* ``M(S) = optimizer_state_factor * W_S + in_flight(S)/d * sum_v activation_bytes_v``
  (:func:`~gpp_solver.cost.model.memory_per_device`, the pricing core's formula);
* in a stage whose order holds ``W`` (split backward), plus ``pending_w(S)/d * kept(S)``: the
  gradients ``B`` keeps for ``W`` (:func:`kept_gradient_bytes`, ``docs/zero-bubble.md``);
* in a stage whose replicas shard the optimizer state (``zero`` 1), ``held_factor`` in place of
  ``osf`` and the step's own part (:func:`held_factor`, :func:`step_bytes`);
* in a stage that recomputes (``recompute``), ``osf * W_S + in_flight/d * received + b/d * act_S``
  (:func:`recomputed_memory`), and with the overheads a waiting micro-batch holds its received and
  sent values alone (:func:`waiting_bytes`);
* with the cluster's ``memory_overheads``, beside it what the runtime measurably holds: the
  received buffers, the gradient buckets, the temporaries and, under autocast, each in-flight
  micro-batch's low-precision weight copies (:func:`memory_with_overheads`), and the cluster's
  ``runtime_memory_bytes`` (the libraries' workspaces, whatever the stage).
"""

from __future__ import annotations

from collections.abc import Sequence

from gpp_solver.cost.model import (
    StageLike,
    data_parallel,
    in_flight_from_order,
    interpolate,
    memory_per_device,
    optimizer_shards,
    pending_weight_samples,
    recomputes,
    split_region,
    stage_activation_bytes,
    stage_configs,
    stage_weight_bytes,
    stage_weight_copy_bytes,
)
from gpp_solver.types import Cluster, Graph


def stage_memory(
    graph: Graph,
    cluster: Cluster,
    stage: StageLike,
    in_flight_samples: float,
    stages: Sequence[StageLike] | None = None,
    pending_w_samples: float = 0.0,
    mini_batch_size: int | None = None,
    posted_ahead: Sequence[tuple[int, int]] | None = None,
) -> float:
    """``M(S)``: weights + state of a full replica, activations of in-flight samples split over ``d``,
    and with ``pending_w_samples`` (samples whose ``W`` is pending, :func:`pending_weight_samples`)
    the gradients kept for them, ``pending_w / d * kept(S)``; with ``cluster.memory_overheads``,
    :func:`memory_with_overheads` (the received buffers need the plan's ``stages``; the plan's
    ``mini_batch_size`` tells whether every micro-batch's forward runs before the stage's first
    backward; ``posted_ahead``, from the stage's order: :func:`posted_ahead`)."""
    if overheads_priced(cluster, graph):
        boundary = boundary_bytes(graph, stages, stage) if stages is not None else (0.0, 0.0)
        n = mini_batch_size // stage.micro_batch_size if mini_batch_size else None
        return cluster.runtime_memory_bytes + memory_with_overheads(
            graph,
            cluster.optimizer_state_factor,
            stage,
            in_flight_samples,
            *boundary,
            pending_w_samples,
            n,
            posted_ahead,
        )
    if recomputes(stage):
        received = boundary_bytes(graph, stages, stage)[0] if stages is not None else 0.0
        return recomputed_memory(graph, cluster.optimizer_state_factor, stage, in_flight_samples, received)
    kept = pending_w_samples / data_parallel(stage) * kept_gradient_bytes(graph, stage) if pending_w_samples else 0.0
    return kept + memory_per_device(
        held_factor(cluster.optimizer_state_factor, stage),
        stage_weight_bytes(graph, stage),
        in_flight_samples,
        data_parallel(stage),
        stage_activation_bytes(graph, stage),
    )


def recomputed_memory(
    graph: Graph, osf: float, stage: StageLike, in_flight_samples: float, received_per_sample: float
) -> float:
    """``M(S)`` of a stage that recomputes, without the runtime's overheads: ``osf * W_S +
    in_flight / d * received + b / d * act_S``: each micro-batch in flight keeps its received values
    alone, and one at a time holds its activations again, in its backward."""
    d = data_parallel(stage)
    rows = stage.micro_batch_size / d
    return (
        held_factor(osf, stage) * stage_weight_bytes(graph, stage)
        + in_flight_samples / d * received_per_sample
        + (rows * stage_activation_bytes(graph, stage) if in_flight_samples else 0.0)
    )


def held_factor(osf: float, stage: StageLike) -> float:
    """Bytes per weight byte a replica holds for the whole step: ``osf`` (weights, gradients and
    optimizer state); when the stage's replicas shard the optimizer state over ``d``
    (:func:`~gpp_solver.cost.model.optimizer_shards`), ``2 + (osf - 2) / d``: the weights and
    gradients whole, ``1/d`` of the state."""
    shards = optimizer_shards(stage)
    return osf if shards == 1 else 2.0 + max(osf - 2.0, 0.0) / shards


def step_bytes(osf: float, stage: StageLike, weights: float, largest_weight: float) -> float:
    """What the optimizer step holds beyond :func:`held_factor` ``* W_S``: ``OPTIMIZER_STEP_SCRATCH
    * max_v weight_bytes_v`` for Adam's class (``osf >= 4``), 0 for SGD; when the replicas shard
    the optimizer state (``d`` parts), the step runs on the replica's part, one flat tensor of
    ``W_S / d``: its gradient (``W_S / d``, copied from the gradients, which are then released)
    and the step's scratch on it, ``W_S / d + max(0, OPTIMIZER_STEP_SCRATCH * W_S / d - W_S)``
    (0 scratch for SGD)."""
    shards = optimizer_shards(stage)
    if shards == 1:
        return OPTIMIZER_STEP_SCRATCH * largest_weight if osf >= 4 else 0.0
    part = weights / shards
    scratch = OPTIMIZER_STEP_SCRATCH * part if osf >= 4 else 0.0
    return part + max(0.0, scratch - weights)


def waiting_bytes(graph: Graph, stage: StageLike, rows: float, received: float, configs=None) -> tuple[float, float]:
    """With the runtime's overheads, what one micro-batch of ``rows`` samples holds between its
    forward and its backward, and the part of it that is sent values beyond its activations (held
    in its backward too): its activations, weight copies, received values (``received`` bytes)
    and :func:`unsaved_sent_bytes`; in a stage that recomputes, its received values, every
    value it sends (:func:`sent_value_bytes`) and :data:`RANDOM_STATE_BYTES`, nothing else."""
    configs = configs if configs is not None else stage_configs(graph, stage)
    if recomputes(stage):  # and the random state its recomputation restores
        values = rows * sent_value_bytes(graph, stage)
        return received + values + RANDOM_STATE_BYTES, values
    unsaved = rows * unsaved_sent_bytes(graph, stage, configs)
    activations = rows * sum(c.activation_bytes for c in configs) + stage_weight_copy_bytes(graph, stage)
    return activations + received + unsaved, unsaved


def overheads_priced(cluster: Cluster, graph: Graph) -> bool:
    """Whether the runtime's memory overheads are priced: the cluster's ``memory_overheads`` where
    it states it; unstated (a cluster from ``gpp cluster`` or written by hand), on for a graph that
    ``gpp_runtime.profile`` measured (its ``extra.profile``: a model the runtime trains, whose plan
    must not under-predict), off for another (the paper's workloads, a hand-made graph: GraphPipe's
    model)."""
    if cluster.memory_overheads is not None:
        return cluster.memory_overheads
    return bool(graph.extra.get("profile"))


def order_memory(
    graph: Graph,
    cluster: Cluster,
    stage: StageLike,
    order: Sequence[tuple[str, int]],
    stages: Sequence[StageLike] | None = None,
) -> float:
    """:func:`stage_memory` of ``stage`` under ``order``: its in-flight peak and, in an order with
    ``W``, its pending weight gradients (both of the order, times the stage's micro-batch size)."""
    b = stage.micro_batch_size
    forwards = [a[0] for a in order].count("F")  # the step's micro-batches
    return stage_memory(
        graph,
        cluster,
        stage,
        in_flight_from_order(order, b),
        stages,
        pending_weight_samples(order, b),
        mini_batch_size=forwards * b if forwards else None,
        posted_ahead=posted_ahead(order),
    )


def posted_ahead(order: Sequence[tuple[str, int]]) -> tuple[tuple[int, int], ...]:
    """Per backward of ``order``, ``(forwards, backwards)`` among the :data:`POSTED_AHEAD` actions
    after it, each distinct pair once: the micro-batches whose messages the runtime has posted
    (a received value for a forward, a gradient buffer for a backward) while that backward runs
    (``gpp_runtime.lowering.posting``'s eager posting, ``lookahead`` compute actions ahead)."""
    kinds = [a[0] for a in order]
    pairs = set()
    for i, kind in enumerate(kinds):
        if kind == "B":
            ahead = kinds[i + 1 : i + 1 + POSTED_AHEAD]
            pairs.add((ahead.count("F"), ahead.count("B")))
    return tuple(sorted(pairs))


def kept_gradient_bytes(graph: Graph, stage: StageLike) -> float:
    """``kept(S)``: bytes per sample that ``B`` keeps until ``W`` in a split backward — the gradient
    flowing into each weighted operator that ``B`` reaches, i.e. of the stage's nodes with weights
    downstream (within the stage) of a value received from another stage; a stage fed by the
    model's inputs alone keeps nothing (its ``W`` runs the whole backward).  Per node
    ``max(output_bytes_v, activation_bytes_v)``: exact for a node of one weighted operator (its
    output's size), an estimate for a node of several, whose weighted operators' outputs the
    operators after them mostly save (``docs/zero-bubble.md``, *Memory rule*)."""
    seen = split_region(graph, stage.nodes)
    total = 0.0
    for v, c in zip(stage.nodes, stage_configs(graph, stage)):
        if v in seen and c.weight_bytes > 0:
            total += max(graph.node(v).output_bytes, c.activation_bytes)
    return total


#: tensors of one micro-batch's rows, each the size of the stage's largest node output, that a
#: backward holds beside the saved activations: the gradient flowing into a node and the one it
#: produces (at the sink: the loss's temporaries and gradient)
TEMPORARY_OUTPUTS = 2
#: micro-batches whose messages the runtime posts before the compute that needs them
#: (``GraphPipeline``'s default ``lookahead``)
POSTED_AHEAD = 2
#: tensors of the largest parameter's size an Adam-class optimizer step allocates at once
OPTIMIZER_STEP_SCRATCH = 3
#: bytes of the random state a recomputing stage keeps per micro-batch from its forward to its
#: recomputation (``torch.get_rng_state()``: the CPU generator's, as ``torch.utils.checkpoint``
#: keeps it; a GPU's own state is 16 bytes more, in host memory, not priced)
RANDOM_STATE_BYTES = 5056


def random_state_bytes(stage: StageLike) -> float:
    """:data:`RANDOM_STATE_BYTES` for a stage that recomputes, else 0."""
    return RANDOM_STATE_BYTES if recomputes(stage) else 0.0


def boundary_bytes(graph: Graph, stages: Sequence[StageLike], stage: StageLike) -> tuple[float, float]:
    """Bytes per sample ``stage`` receives from and sends to other stages: its incoming and its
    outgoing transfers (one per producer node and consumer stage, as in :func:`stage_transfers`)."""
    stage_of = {v: i for i, s in enumerate(stages) for v in s.nodes}
    mine = stage_of[stage.nodes[0]] if stage.nodes else -1
    pairs: dict[tuple[str, int], float] = {}
    for (u, v), nbytes in graph.edge_bytes_map.items():
        su, sv = stage_of[u], stage_of[v]
        if su != sv and mine in (su, sv):
            pairs[(u, sv)] = max(pairs.get((u, sv), 0.0), nbytes)
    received = sum(b for (u, sv), b in pairs.items() if sv == mine)
    return received, sum(pairs.values()) - received


def workspace_at(graph: Graph, v: str, rows: float) -> float | None:
    """Bytes node ``v``'s largest transient takes at a call of ``rows`` samples (None: not
    measured): ``rows`` times its ``workspace_bytes`` when that is one figure; when it is one per
    micro-batch size, the totals (per sample times size) interpolated by the graph format's rule
    (:func:`~gpp_solver.cost.model.interpolate`: below the smallest size, the smallest's total,
    since a transient of one call (a convolution's unfolded input on a CPU) need not shrink with
    the rows; above the largest, constant per sample)."""
    ws = graph.node(v).workspace_bytes
    if ws is None or not isinstance(ws, tuple):
        return None if ws is None else rows * ws
    sizes = graph.micro_batch_sizes
    return float(interpolate(lambda i: ws[i] * sizes[i], sizes, rows))


def workspace_temporaries(
    graph: Graph, stage: StageLike, rows: float, largest_output: float, posted: float, own_gradients: bool = False
) -> float:
    """The temporaries measured per operator: ``rows * max_v workspace_bytes_v + rows *
    largest_output + posted`` (the largest operator's transient, the gradient flowing into it, the
    messages posted ahead) when a node of ``stage`` has ``workspace_bytes``; else 0. With
    ``own_gradients`` (one micro-batch a step: the weight gradient an operator produces becomes
    ``.grad``, already priced with the weights) each operator's transient is less its weight bytes."""
    measured = [
        max(0.0, w - (graph.node(v).weight_bytes if own_gradients else 0.0))
        for v in stage.nodes
        if (w := workspace_at(graph, v, rows)) is not None
    ]
    if not measured:
        return 0.0
    return max(measured) + rows * largest_output + posted


def memory_with_overheads(
    graph: Graph,
    osf: float,
    stage: StageLike,
    in_flight_samples: float,
    received_per_sample: float,
    sent_per_sample: float = 0.0,
    pending_w_samples: float = 0.0,
    micro_batches: int | None = None,
    posted_ahead: Sequence[tuple[int, int]] | None = None,
) -> float:
    """The memory of one device of ``stage`` with the runtime's overheads (``memory_overheads``):

    ``osf * W_S + max(in_flight / d * (sum_v act_v + received) + in_flight / b * copies +
    pending_w / d * kept + temporaries, buckets, step)`` where

    * ``copies``: :func:`~gpp_solver.cost.model.stage_weight_copy_bytes`, the low-precision weight
      copies autocast makes in each micro-batch's forward and its backward reads (one set per
      micro-batch in flight on each replica; 0 outside autocast);

    * ``kept``: :func:`kept_gradient_bytes`, the gradients ``B`` keeps for the ``pending_w`` samples
      whose ``W`` is pending (0 in an order without ``W``);

    * ``received``: bytes per sample of the values received from other stages (their copies stay
      until the backward of their micro-batch);
    * ``temporaries = max_v weight_bytes_v + TEMPORARY_OUTPUTS * b / d * max_v output_bytes_v +
      POSTED_AHEAD * b / d * (received + sent)``: a node's weight gradient before it is added into
      ``.grad`` (not with one micro-batch a step, ``micro_batches == 1``: it becomes ``.grad``
      itself), the gradients of one micro-batch's activations during a backward, and the buffers
      of the messages the runtime posts ahead of the compute that reads them (activations to
      receive, gradients of the values it sent);
    * ``buckets = W_S`` when ``d > 1``: the data-parallel all-reduce's flat copy of the gradients,
      alive after the last backward, when the activations are gone (so the largest of the phases);
    * ``step = OPTIMIZER_STEP_SCRATCH * max_v weight_bytes_v`` when ``osf >= 4`` (Adam's class):
      the optimizer step's temporaries (``sqrt`` of the second moment, the quotient, the previous
      parameter's quotient not yet freed); SGD, with or without momentum, updates in place.

    When every micro-batch of the step is in flight at once (``micro_batches`` given and
    ``in_flight = micro_batches * b``: no forward follows a backward, e.g. a single micro-batch),
    the gradients, freed between steps (``zero_grad``'s default ``set_to_none``, as
    ``gpp_runtime.train`` runs), never coexist with all the activations, and
    :func:`_all_forwards_first` prices each backward at each node, with the transients and the
    message buffers where they occur.
    """
    if (
        not pending_w_samples
        and micro_batches is not None
        and in_flight_samples >= micro_batches * stage.micro_batch_size
    ):
        return _all_forwards_first(graph, osf, stage, micro_batches, received_per_sample, sent_per_sample)
    if not pending_w_samples and micro_batches is not None and in_flight_samples > 0:
        return _interleaved(graph, osf, stage, in_flight_samples, received_per_sample, sent_per_sample, posted_ahead)
    d = data_parallel(stage)
    configs = stage_configs(graph, stage)
    weights = sum(c.weight_bytes for c in configs)
    largest_weight = max((c.weight_bytes for c in configs), default=0.0)
    largest_output = max((graph.node(v).output_bytes for v in stage.nodes), default=0.0)
    rows = stage.micro_batch_size / d
    posted = POSTED_AHEAD * rows * (received_per_sample + sent_per_sample)
    # a weight gradient waits beside .grad only to be summed into an earlier micro-batch's: with one
    # micro-batch a step (gradients set to None between steps) it becomes .grad as it is
    summed = 0.0 if micro_batches == 1 else largest_weight
    temporaries = max(
        summed + TEMPORARY_OUTPUTS * rows * largest_output + posted,
        workspace_temporaries(graph, stage, rows, largest_output, posted, own_gradients=micro_batches == 1),
    )
    # per micro-batch in flight: its activations, its received values and the values it sends
    # beyond what its activations hold; one gradient it sent back in transit (``send_releases``)
    copies = stage_weight_copy_bytes(graph, stage)
    act = sum(c.activation_bytes for c in configs)
    if recomputes(stage):  # each waits with its received and sent values; one holds its activations again
        activations = in_flight_samples / d * (received_per_sample + sent_value_bytes(graph, stage))
        activations += in_flight_samples / stage.micro_batch_size * RANDOM_STATE_BYTES
        if in_flight_samples:
            activations += rows * received_per_sample + rows * act + copies
    else:
        activations = in_flight_samples / d * (act + received_per_sample + unsaved_sent_bytes(graph, stage, configs))
        if in_flight_samples:
            activations += rows * received_per_sample + in_flight_samples / stage.micro_batch_size * copies
    if pending_w_samples:
        activations += pending_w_samples / d * kept_gradient_bytes(graph, stage)
    step = step_bytes(osf, stage, weights, largest_weight)
    return held_factor(osf, stage) * weights + max(activations + temporaries, weights if d > 1 else 0.0, step)


def unsaved_sent_bytes(graph: Graph, stage: StageLike, configs=None) -> float:
    """Bytes per sample of the values ``stage`` sends to other stages beyond what its own
    activations hold: ``sum_u max(0, output_bytes_u - act_u)`` over its nodes ``u`` with a consumer
    in another stage (a sent value is held from its forward until its send is waited for, at the
    latest when the gradient for it comes back; a node that saves it already holds it)."""
    configs = configs if configs is not None else stage_configs(graph, stage)
    mine = set(stage.nodes)
    return sum(
        max(0.0, graph.node(v).output_bytes - c.activation_bytes)
        for v, c in zip(stage.nodes, configs)
        if any(w not in mine for w in graph.succs(v))
    )


def sent_value_bytes(graph: Graph, stage: StageLike) -> float:
    """Bytes per sample of the values ``stage`` sends, each once: ``sum_u output_bytes_u`` over its
    nodes ``u`` with a consumer in another stage."""
    mine = set(stage.nodes)
    return sum(graph.node(v).output_bytes for v in stage.nodes if any(w not in mine for w in graph.succs(v)))


def _interleaved(
    graph: Graph,
    osf: float,
    stage: StageLike,
    in_flight_samples: float,
    received_per_sample: float,
    sent_per_sample: float,
    posted_ahead: Sequence[tuple[int, int]] | None = None,
) -> float:
    """The memory of a stage whose forwards and backwards interleave (1F1B, kFkB) without ``W``,
    priced where each term occurs (``docs/cost-model.md``, *A stage whose forwards and backwards
    interleave*): ``osf * W_S`` plus the largest of

    * a backward at its largest node (:func:`_backward_at_nodes`, a later backward: every weight
      gradient exists, counted in ``osf * W_S``), beside the other micro-batches in flight (each
      its activations, weight copies, received values and unsaved sent values), its own received and unsaved sent
      values, one gradient sent back in transit, and the messages posted: its own gradient buffer
      and, with the order's ``posted_ahead`` (:func:`posted_ahead`), a received value per forward
      and a gradient buffer per backward among the actions posted ahead of it, the most over its
      backwards (without the order: ``POSTED_AHEAD`` micro-batches' received values and gradient
      buffers in all); a forward holds no more than the backward of the same micro-batch at the
      same node;
    * the data-parallel flat copy (``W_S`` when ``d > 1``), after the last backward;
    * the optimizer step's temporaries (:data:`OPTIMIZER_STEP_SCRATCH`)."""
    d = data_parallel(stage)
    rows = stage.micro_batch_size / d
    configs = stage_configs(graph, stage)
    weights = sum(c.weight_bytes for c in configs)
    received, sent = rows * received_per_sample, rows * sent_per_sample
    waiting, unsaved = waiting_bytes(graph, stage, rows, received, configs)
    others = max(0.0, in_flight_samples / stage.micro_batch_size - 1)  # micro-batches waiting beside it
    _first, later = _backward_at_nodes(graph, stage, rows)
    if posted_ahead:
        posted = sent + max(f * received + b * sent for f, b in posted_ahead)
    else:
        posted = POSTED_AHEAD * (received + sent)
    backward = others * waiting + received + unsaved + received + posted + (later - weights) + random_state_bytes(stage)
    largest_weight = max((c.weight_bytes for c in configs), default=0.0)
    step = step_bytes(osf, stage, weights, largest_weight)
    return held_factor(osf, stage) * weights + max(backward, weights if d > 1 else 0.0, step)


def _all_forwards_first(
    graph: Graph, osf: float, stage: StageLike, n: int, received_per_sample: float, sent_per_sample: float
) -> float:
    """The memory of a stage that runs all ``n`` forwards of a step before its first backward,
    priced where each term occurs (``docs/cost-model.md``, *A stage that runs every forward first*):
    ``(osf - 1) * W_S`` (weights and optimizer state; the gradients are freed between steps) plus
    the largest of

    * the backward of the first micro-batch and of the second (if ``n > 1``), at their largest
      node (:func:`_backward_at_nodes`), with the other micro-batches and the messages; a later
      backward holds no more than the second, a forward no more than the first's backward at the
      same node;
    * after the last backward: the gradients ``W_S``, the messages held until the step ends, and
      the data-parallel flat copy (``W_S`` when ``d > 1``);
    * the optimizer step: ``W_S`` and its temporaries (:data:`OPTIMIZER_STEP_SCRATCH`).

    Per micro-batch of ``rows = b / d`` the runtime holds its activations and weight copies until
    its backward, its received values (``received``) from
    its forward to the end of its backward, the activations it sends (``sent``) and the gradients
    it sends back (``received``) until the step ends, and the buffer of each gradient it receives
    (``sent``) from up to ``POSTED_AHEAD`` compute actions before its backward to its end."""
    d = data_parallel(stage)
    rows = stage.micro_batch_size / d
    configs = stage_configs(graph, stage)
    weights = sum(c.weight_bytes for c in configs)
    received, sent = rows * received_per_sample, rows * sent_per_sample
    first, second = _backward_at_nodes(graph, stage, rows)
    # the values it sends, each once: in act_S where a consumer saves them (charged to their
    # producer), beyond it (unsaved) while the activations live; whole after the backward
    values = rows * sent_value_bytes(graph, stage)
    waiting, unsaved = waiting_bytes(graph, stage, rows, received, configs)  # before its backward
    done = received + values  # a micro-batch after its backward, until the step ends

    def backward(j: int, at_nodes: float) -> float:
        """Backward ``j`` (0-based): ``j`` micro-batches done, ``n - 1 - j`` waiting, its own
        messages, its gradient buffer and up to ``POSTED_AHEAD`` more posted, and ``at_nodes``."""
        posted = (1 + min(POSTED_AHEAD, n - 1 - j)) * sent
        return j * done + (n - 1 - j) * waiting + received + unsaved + posted + at_nodes + random_state_bytes(stage)

    phases = [backward(0, first)] + ([backward(1, second)] if n > 1 else [])
    largest_weight = max((c.weight_bytes for c in configs), default=0.0)
    step = step_bytes(osf, stage, weights, largest_weight)
    held = held_factor(osf, stage) - 1  # the gradients are freed between steps
    return held * weights + max(*phases, weights + n * done + (weights if d > 1 else 0.0), weights + step)


def _backward_at_nodes(graph: Graph, stage: StageLike, rows: float) -> tuple[float, float]:
    """The most one micro-batch's backward holds at a node of ``stage`` beside the messages, in the
    step's first backward and in a later one: over the stage's nodes ``v_1 .. v_m`` in graph order
    (the backward runs them in reverse), at ``v_k``

    ``rows * (sum_{i <= k} act_i + out_k + live_k + views_k + held_k) + sum_{i <= k} copies_i + T_k`` plus
    ``sum_{i > k} weight_bytes_i``
    (the weight gradients the first backward has produced) or ``W_S`` (a later one: every
    gradient; ``v_k``'s new one, in ``T_k``, is added into ``.grad`` after), where

    * ``act_i``: the activations of the nodes not yet reached, ``copies_i`` their weight copies
      (``weight_copy_bytes``, per micro-batch);
    * ``out_k``: the gradient flowing into ``v_k`` (0 when every consumer of ``v_k`` is in another
      stage: the received gradient buffer, priced with the messages, is the gradient itself);
    * ``T_k = max(weight_bytes_k + rows * in_k, rows * ws_k)``: what ``v_k``'s backward
      allocates: at least the gradients it produces (of its weights, and of its inputs, ``in_k``
      bytes per sample on its incoming edges), and its ``workspace_bytes`` ``ws_k`` where measured
      (the transient with those gradients, per sample of the size it was measured at);
    * ``live_k``: the gradients of the values produced before ``v_k`` (by a node of the stage, or
      received) that a node after it consumes, already flowing back;
    * ``views_k``: where a node ``c`` after ``v_k`` has ``grad_views``, the parts of its output's
      gradient already consumed while a view of it is still waiting (or flowing into ``v_k``): the
      storage stays whole until its first producer's backward (producers of the stage whose last
      consumer is ``c``);
    * ``held_k``: the values the stage sends that nodes after ``v_k`` produced, ``sum min(out_u,
      act_u)`` over them: the backward starts from them (its roots), so they stay whole until it
      ends, where ``act_u`` would free them at ``u`` (the rest of each, ``out_u - act_u``, is in
      ``unsaved``, priced by the callers)."""
    config = dict(zip(stage.nodes, stage_configs(graph, stage)))
    position = {v: i for i, v in enumerate(graph.topo_order)}  # file order where it is topological
    order = sorted(stage.nodes, key=position.__getitem__)
    at = {v: k for k, v in enumerate(order)}
    # live_k by differences: a value produced at p (-1: received) and last consumed at q is live
    # for p < k < q
    live = [0.0] * (len(order) + 1)
    produced: dict[str, tuple[int, float]] = {}  # value -> (position, gradient bytes per sample)
    last: dict[str, int] = {}
    for (u, v), nbytes in graph.edge_bytes_map.items():
        if v in at:
            p = at.get(u, -1)
            size = graph.node(u).output_bytes if p >= 0 else nbytes
            produced[u] = (p, max(produced.get(u, (p, 0.0))[1], size))
            last[u] = max(last.get(u, -1), at[v])
    for u, (p, size) in produced.items():
        if last[u] > p + 1:
            live[p + 1] += size
            live[last[u]] -= size
    # views_k by differences: a node c with grad_views hands its producers (of the stage, c their
    # last consumer) views of one gradient storage, alive until the last of them (the first
    # producer, at p_1) is consumed; a part consumed (at p_i > k) is still in it for p_1 <= k < p_i
    views = [0.0] * (len(order) + 1)
    for c in order:
        if graph.node(c).grad_views:
            parts = sorted((at[u], graph.edge_bytes(u, c)) for u in graph.preds(c) if u in at and last[u] == at[c])
            for p, size in parts[1:]:
                views[parts[0][0]] += size
                views[p] -= size
    weights = [config[v].weight_bytes for v in order]
    total_w = sum(weights)
    # the sent values' shares of their producers' activations, held until the backward ends
    sent_share = {
        v: min(graph.node(v).output_bytes, config[v].activation_bytes)
        for v in order
        if any(w not in at for w in graph.succs(v))
    }
    first = second = 0.0
    reached = flowing = viewed = copies = 0.0  # activations and weight copies of v_1 .. v_k; live_k; views_k
    held = sum(sent_share.values())  # held_k
    later_w = total_w  # weight gradients of v_{k+1} .. v_m
    for k, v in enumerate(order):
        reached += config[v].activation_bytes
        copies += graph.node(v).weight_copy_bytes
        flowing += live[k]
        viewed += views[k]
        held -= sent_share.get(v, 0.0)
        later_w -= weights[k]
        node = graph.node(v)
        produces = weights[k] + rows * sum(graph.edge_bytes(u, v) for u in graph.preds(v))
        ws = workspace_at(graph, v, rows)
        transient = produces if ws is None else max(produces, ws)
        consumers = graph.succs(v)
        into = 0.0 if consumers and all(w not in at for w in consumers) else node.output_bytes
        here = rows * (reached + into + flowing + viewed + held) + copies + transient
        first = max(first, here + later_w)
        second = max(second, here + total_w)
    return first, second
