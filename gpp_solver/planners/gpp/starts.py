"""Where a ``gpp`` run's local searches start, as functions of its record
(:class:`~gpp_solver.planners.gpp.run.GppRun`): the seed plans (the seed planners' and those
given) and the micro-batch sizes to search (:func:`run_seeds`), then the start states per size —
its own chains and the seed plans' partitions, best first (:func:`find_starts`)."""

from __future__ import annotations

from gpp_solver.cost.micro_batch import check_micro_batch_sizes
from gpp_solver.cost.tables import CostTables
from gpp_solver.errors import InvalidInputError
from gpp_solver.plan.validate import validate
from gpp_solver.planners.gpp.chains import chain_states
from gpp_solver.planners.gpp.options import candidate_micro_batch_sizes
from gpp_solver.planners.gpp.partition_eval import Problem, State, canonical
from gpp_solver.planners.gpp.plans import states_from_plan, uniform_micro_batch
from gpp_solver.planners.gpp.run import GppRun, Start
from gpp_solver.planners.gpp.seeds import run_seed_planners, within_sizes


def run_seeds(run: GppRun) -> None:
    """The seed planners' plans and the plans given (``seed_plans``), and the sizes to search."""
    graph, cluster, B, o = run.graph, run.cluster, run.B, run.o
    given = dict(o.seed_plans or {})
    allowed = None if o.micro_batch_sizes is None else check_micro_batch_sizes(B, o.micro_batch_sizes)
    run.allowed = allowed
    seeds, run.seed_partitions, run.seed_info, seeds_cut = run_seed_planners(
        graph,
        cluster,
        B,
        [n for n in run.seed_planners if n not in given],
        run.budget,
        progress=run.progress,
        micro_batch_sizes=allowed,
    )
    for name, p in given.items():
        try:
            validate(p, graph, cluster)
        except InvalidInputError as exc:
            run.seed_info[name] = {"status": f"error: {type(exc).__name__}", "given": True}
            continue
        if p.mini_batch_size != B:
            run.seed_info[name] = {"status": "error: mini_batch_size differs", "given": True}
            continue
        if not within_sizes(p, allowed):
            run.seed_info[name] = {"status": "dropped: micro-batch size not allowed", "given": True}
            continue
        seeds[name] = p
        run.seed_info[name] = {
            "status": p.search.status,
            "given": True,
            "seconds": p.search.seconds,
            "time_per_sample": p.predicted.time_per_sample,
            "iteration_time": p.predicted.iteration_time,
        }
    run.seeds = seeds
    run.lap("seeds")
    from_seeds = [*seeds.values(), *run.seed_partitions.values()]
    extra_b = [b for b in (uniform_micro_batch(p) for p in from_seeds) if b is not None]
    if allowed is not None:
        run.bs = list(allowed)
    else:
        run.bs = candidate_micro_batch_sizes(B, extra_b)
    run.tables = CostTables(graph)
    run.timed_out = seeds_cut
    checks = [r["validate_seconds"] for r in run.seed_info.values() if "validate_seconds" in r]
    run.keep_for_answer(max(checks, default=0.0))


def find_starts(run: GppRun) -> None:
    """Start states per ``b``: own chains + the seed plans' partitions, best first (distinct)."""
    run.starts = {}
    run.by_estimate = {}  # per b: the start with the least estimate
    for b in run.bs:
        _starts_at(run, b)
        if run.past_deadline() and (run.by_estimate or run.starts):  # out of time, and a start to search from
            run.timed_out = True
            break
    starts = run.starts
    run.order = sorted(starts, key=lambda b: (starts[b][1][0][2].key[0], starts[b][1][0][2].estimate, b))
    run.lap("starts")


def _starts_at(run: GppRun, b: int) -> None:
    P = Problem(run.graph, run.cluster, run.B, b, run.tables)
    seeded = [(name, st) for name, p in run.seeds.items() for st in states_from_plan(P, p)]
    seeded += [(f"{name} (relaxed)", st) for name, p in run.seed_partitions.items() for st in states_from_plan(P, p)]
    evald: list[Start] = []
    seen: set[State] = set()
    for label, st in chain_states(P):  # generated lazily: out of time, no more own chain states
        if (run.by_estimate or evald or seeded) and run.past_deadline():
            run.timed_out = True
            break
        _consider(P, label, st, seen, evald)
    for label, st in seeded:
        _consider(P, label, st, seen, evald)
    evald.sort(key=lambda x: x[2].key)
    if evald:
        run.starts[b] = (P, evald[: max(1, run.restarts)])
        fits = [x for x in evald if x[2].key[0] == 0]
        if fits:
            run.by_estimate[b] = min(fits, key=lambda x: (x[2].estimate, x[2].key))


def _consider(P: Problem, label: str, st: State, seen: set[State], evald: list[Start]) -> None:
    """``st`` as a start at ``P``'s size: evaluated, in canonical form, once (``seen``)."""
    e = P.evaluate(st.assign, st.devs)
    if e is not None:
        c = canonical(st, e)
        if c not in seen:
            seen.add(c)
            evald.append((label, c, P.evaluate(c.assign, c.devs)))
