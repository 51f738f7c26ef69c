"""GraphPipe's Algorithm 1 with one micro-batch size per plan: the binary search on TPS over the stage DP
for every ``b``, the depth sweep, the optimistic-transfer second opinion and the pick by simulated
iteration time (see :mod:`gpp_solver.planners.graphpipe.planner` for the whole story)."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import replace

from gpp_solver._backend.progress import ProgressBar
from gpp_solver.binary_search import TpsSearch, search_depths, search_many, trace
from gpp_solver.errors import TimeLimitError
from gpp_solver.planners.graphpipe.dp.needs import infeasible_error
from gpp_solver.planners.graphpipe.dp.stage import DPStage
from gpp_solver.planners.graphpipe.dp.stage_dp import StageDP
from gpp_solver.planners.graphpipe.lower_bound_pruning import least_useful_depths, prune_sizes
from gpp_solver.planners.graphpipe.optimistic import optimistic_proposals
from gpp_solver.planners.graphpipe.options import MAX_DEPTH_BOUND, SIMULATE_TOP
from gpp_solver.planners.graphpipe.staging import build_staging_plan, price_staging, spend_leftover_devices
from gpp_solver.sp_tree import SPDecomposition
from gpp_solver.types import Cluster, Graph, Plan, Status

logger = logging.getLogger(__name__)

#: search only the sizes that may beat a quick seed staging (:func:`prune_sizes`; large trees)
PRUNE_SIZES = True

#: the stagings, best by iteration estimate, that also get a second opinion (the optimistic-transfer
#: DP's proposal, the traceback with separate sink-side stages): each costs DP passes
VARIANTS_TOP = 3


class _Progress(ProgressBar):
    """GraphPipe's DP passes (one bar; see :mod:`gpp_solver._backend.progress`)."""

    def __init__(self, total: int | None, enabled: bool | None) -> None:
        super().__init__(total, "graphpipe: DP passes", "pass", enabled)

    def step(self, active: int) -> None:
        self.set_postfix_str(f"{active} micro-batch sizes open")
        self.update(1)


def plan_uniform(
    graph: Graph,
    cluster: Cluster,
    mini_batch_size: int,
    dec: SPDecomposition,
    sizes: Sequence[int],
    *,
    deadline: float | None,
    progress: bool | None = None,
    search_k: bool = False,
    degree_options: Sequence[int] | None = None,
    depth_tradeoff: bool = True,
    simulate_top: int | None = SIMULATE_TOP,
    shared_sinks: bool = True,
    max_depth_bound: int | None = MAX_DEPTH_BOUND,
    schedule: str = "1f1b",
) -> Plan:
    """The best plan with one micro-batch size from ``sizes`` (``search.seconds`` left at 0, not validated);
    every candidate is built with ``schedule`` (``build_plan``), so the pick is by its iteration time."""
    B = mini_batch_size  # the paper's B
    dp = StageDP(graph, cluster, B, decomposition=dec, degree_options=degree_options, shared_sinks=shared_sinks)
    u = _UniformSearch(
        graph, cluster, B, dec, dp, list(sizes), deadline, search_k, depth_tradeoff, max_depth_bound, schedule
    )
    u.search(progress, simulate_top)
    u.rank(simulate_top)
    cands = u.candidates()
    plan, origin, chosen = u.simulate(cands)
    return u.record(plan, origin, chosen)


class _UniformSearch:
    """The phases of :func:`plan_uniform`, in order: :meth:`search` (the stagings per size and depth
    bound), :meth:`rank` (by iteration estimate), :meth:`candidates` (the variants and optimistic
    proposals of the best ones, leftover devices spent), :meth:`simulate` (the pick by simulated
    iteration time) and :meth:`record` (status and ``search.extra``)."""

    def __init__(
        self,
        graph: Graph,
        cluster: Cluster,
        B: int,
        dec: SPDecomposition,
        dp: StageDP,
        sizes: list[int],
        deadline: float | None,
        search_k: bool,
        depth_tradeoff: bool,
        max_depth_bound: int | None,
        schedule: str = "1f1b",
    ) -> None:
        self.schedule = schedule
        self.graph, self.cluster, self.B, self.dec, self.dp, self.sizes = graph, cluster, B, dec, dp, sizes
        self.deadline, self.search_k, self.depth_tradeoff = deadline, search_k, depth_tradeoff
        self.max_depth_bound = max_depth_bound
        self.searched, self.pruned, self.seeds, self.lbdp, self.quick = list(sizes), [], [], None, {}
        self.proposals: list[dict] = []
        self.proposed = False
        self.cut_short = False  # candidates left unpriced or unsimulated at the deadline
        self.tried: list[dict] = []

    def past_deadline(self) -> bool:
        return self.deadline is not None and time.perf_counter() >= self.deadline

    def search(self, progress: bool | None, simulate_top: int | None) -> None:
        """Per size the least TPS (per depth bound with the depth trade-off) and its staging."""
        dp, sizes, deadline = self.dp, self.sizes, self.deadline
        bar = _Progress(None, progress)
        try:
            if PRUNE_SIZES and simulate_top is None and dp.large() and len(sizes) > 1:
                self.searched, self.pruned, self.seeds, self.lbdp, self.quick = prune_sizes(
                    self.graph,
                    self.cluster,
                    self.B,
                    self.dec,
                    dp,
                    sizes,
                    self.search_k,
                    deadline,
                    bar.step,
                    self.schedule,
                )
            if self.depth_tradeoff:
                per_b = search_depths(
                    dp,
                    self.searched,
                    deadline=deadline,
                    on_pass=bar.step,
                    deepen=self._deepen,
                    max_bound=self.max_depth_bound,
                    feasible={b: (r.tps, max(s.depth for s in r.stages)) for b, r in self.quick.items()},
                )
            else:
                one = search_many(dp, self.searched, deadline=deadline, on_pass=bar.step)
                per_b = {b: [] if one[b] is None else [one[b]] for b in self.searched}
        finally:
            bar.close()
        per_b.update({b: [] for b in self.pruned})
        self.per_b = per_b
        results = [r for b in sizes for r in per_b[b]]
        results += [s for s, _ in self.seeds if all((r.b, r.stages) != (s.b, s.stages) for r in results)]
        if not results:
            if deadline is not None and time.perf_counter() > deadline:  # some sizes may not have been searched
                raise TimeLimitError("graphpipe: time limit reached before the stage DP found a plan")
            raise infeasible_error(dp, sizes, self.cluster, deadline)
        self.results = results
        self.timed_out = any(not r.exact for r in results)  # then a size without a plan may be unsearched
        self.min_tps: dict[
            int, float
        ] = {}  # per size, over its results and the seed (a size cut short may have only it)
        for r in results:
            self.min_tps[r.b] = min(self.min_tps.get(r.b, r.tps), r.tps)

    def _deepen(self, first: dict[int, TpsSearch]) -> list[int]:
        """The sizes where a shallower staging could beat the incumbent: the first phase's best
        staging by estimate, simulated; no plan at ``b`` finishes an iteration in less than
        ``B * dp.lower_bound(b)`` (its busiest device's compute alone)."""
        if not first:
            return []
        graph, cluster, B, dp = self.graph, self.cluster, self.B, self.dp
        r = min(
            first.values(), key=lambda r: (price_staging(graph, cluster, r.stages, r.b, B, dp._costs)[1], r.tps, -r.b)
        )
        inc = build_staging_plan(
            graph, cluster, r.stages, r.b, B, dp, self.search_k, deadline=self.deadline, schedule=self.schedule
        ).predicted.iteration_time
        inc = min([inc] + [s[1] for s in self.seeds])  # the seed stays a candidate
        sizes_left = [b for b in first if B * dp.lower_bound(b) < inc * (1 - 1e-12)]
        return least_useful_depths(
            graph, cluster, B, self.dec, dp, sizes_left, inc, self.max_depth_bound, self.deadline, self.lbdp
        )

    def rank(self, simulate_top: int | None) -> None:
        """The results by iteration estimate; the first ``simulate_top`` go on."""
        graph, cluster, B, tables = self.graph, self.cluster, self.B, self.dp._costs
        self.ranked = sorted(
            self.results, key=lambda r: (price_staging(graph, cluster, r.stages, r.b, B, tables)[1], r.tps, -r.b)
        )
        self.short = self.ranked if simulate_top is None else self.ranked[: max(1, simulate_top)]

    def candidates(self) -> list[tuple[str, TpsSearch, tuple[DPStage, ...]]]:
        """The stagings to simulate: best estimate first, each with its variants and each size's
        optimistic proposals right after its least-TPS staging."""
        dp, short, min_tps = self.dp, self.short, self.min_tps
        optimistic: dict[int, list[tuple[str, TpsSearch, tuple[DPStage, ...]]]] = {}
        self.proposed = dp.placement_sensitive and not self.timed_out and not self.past_deadline()
        if self.proposed:
            least = {r.b: r for r in reversed(short[:VARIANTS_TOP]) if r.tps == min_tps[r.b]}  # one per size
            for c in optimistic_proposals(
                self.graph,
                self.cluster,
                self.B,
                self.dec,
                dp,
                [r for r in short[:VARIANTS_TOP] if least.get(r.b) is r],
                self.deadline,
                self.proposals,
            ):
                optimistic.setdefault(c[1].b, []).append(c)
        cands: list[tuple[str, TpsSearch, tuple[DPStage, ...]]] = []
        for rank, r in enumerate(short):
            if cands and self.past_deadline():
                self.cut_short = True  # the remaining stagings are not priced
                break
            cands.extend(self._variants(rank, r))
            if r.b in optimistic and r.tps == min_tps[r.b]:
                cands.extend(optimistic[r.b])
        self.cut_short |= self.past_deadline()  # a leftover-device pass may have stopped at the deadline
        return cands

    def _variants(self, rank: int, r: TpsSearch) -> list[tuple[str, TpsSearch, tuple[DPStage, ...]]]:
        """``r``'s staging and, among the best, the same optimum traced back with separate sink-side
        stages where both reach it; each with the leftover devices spent."""
        dp, cluster = self.dp, self.cluster
        variants = [("conservative DP", r.stages)]
        if dp.idx.sites and rank < VARIANTS_TOP and not self.past_deadline():
            alt = trace(dp, r, prefer_shared=False)
            if alt != tuple(r.stages):
                variants.append(("conservative DP, separate sink stages", alt))
        out = []
        for origin, st in variants:
            if sum(s.degree for s in st) < cluster.devices:
                st = spend_leftover_devices(
                    self.graph, cluster, st, r.b, self.B, dp.degree_options, dp._costs, self.deadline
                )
            out.append((origin, r, tuple(st)))
        return out

    def simulate(self, cands: list[tuple[str, TpsSearch, tuple[DPStage, ...]]]) -> tuple[Plan, str, TpsSearch]:
        """The candidate of least simulated iteration time (:func:`_better`); one whose lower bound
        cannot beat the best so far, or past the deadline once a plan exists, is not simulated."""
        graph, cluster, B, dp = self.graph, self.cluster, self.B, self.dp
        best = None  # (plan, origin, search result)
        for origin, r, st in cands:
            entry = {"micro_batch_size": r.b, "dp_time_per_sample": r.tps, "stages_from": origin}
            self.tried.append(entry)
            if best is not None and self.past_deadline():
                entry["not_simulated_time_limit"] = True
                self.cut_short = True
                continue
            bound = B * price_staging(graph, cluster, st, r.b, B, dp._costs)[0]  # every stage is busy B * TPS(S)
            if best is not None and bound > best[0].predicted.iteration_time * (1 + 1e-12):
                entry["not_simulated_lower_bound"] = bound  # cannot beat the best simulated plan
                continue
            plan = build_staging_plan(
                graph, cluster, st, r.b, B, dp, self.search_k, leftover=False, schedule=self.schedule
            )
            entry.update(
                depth=plan.depth, stages=len(plan.stages), simulated_iteration_time=plan.predicted.iteration_time
            )
            if best is None or _better(plan, best[0]):
                best = (plan, origin, r)
        assert best is not None
        return best

    def record(self, plan: Plan, origin: str, chosen: TpsSearch) -> Plan:
        """The plan with its status and ``search.extra``."""
        dp, sizes, min_tps = self.dp, self.sizes, self.min_tps
        for p in self.proposals:
            p["accepted"] = origin.startswith("optimistic") and p["micro_batch_size"] == chosen.b
        b_final = chosen.b
        if self.timed_out or self.cut_short:
            status = Status.TIME_LIMIT
        elif chosen.tps <= min_tps[b_final] and not dp.coarsened:
            status = Status.OPTIMAL_WITHIN_SEARCH_SPACE
        else:
            status = Status.FEASIBLE  # a shallower staging at a larger bottleneck (depth_tradeoff)
        extra = {
            "micro_batch_size": b_final,
            "dp_time_per_sample": chosen.tps,
            "dp_min_time_per_sample": min_tps[b_final],
            "dp_runs": max(r.probes for r in self.results),
            "micro_batch_sizes_searched": list(sizes),
            ("micro_batch_sizes_unfinished" if self.timed_out else "micro_batch_sizes_infeasible"): [
                b for b in sizes if not self.per_b[b] and b not in self.pruned
            ],
            "sp_added_dependencies": self.dec.added_pairs,
            "stages_from": origin,
            "objective": "min bottleneck TPS per micro-batch size (DP estimate)"
            + (" and per bound on the stage graph's depth" if self.depth_tradeoff else "")
            + (
                "; of all of them"
                if len(self.short) == len(self.ranked)
                else f"; of the {len(self.short)} with the least iteration estimate"
            )
            + ", the least simulated iteration time",
            "simulated_candidates": self.tried,
        }
        if dp.coarsened:  # the search space was coarsened: its optimum is not GraphPipe's
            extra["coarsened_series"] = {
                "blocks": len(dp.idx.blocks),
                "largest_block": max(dp.idx.blocks),
                "operators_in_blocks": sum(dp.idx.blocks),
                "max_series_children": dp.COARSE_CHILDREN,
                "max_depth": dp.E,
            }
            extra["objective"] += (
                f" (over the SP tree with long series coarsened into blocks of operators "
                f"that share a stage, stage graphs at most {dp.E} deep and no shared-sink stages: a "
                f"staging, not the optimum of the full space)"
            )
        if self.pruned:
            extra["micro_batch_sizes_pruned"] = self.pruned  # no staging of theirs beats a simulated one (prune_sizes)
        if self.depth_tradeoff:
            extra["depth_tradeoff"] = True
            extra["depth_bound"] = chosen.depth_bound
        if self.proposed:
            extra["optimistic_transfer_proposals"] = self.proposals
        plan = replace(plan, search=replace(plan.search, status=status, extra={**plan.search.extra, **extra}))
        if plan.predicted.time_per_sample > chosen.tps * (1 + 1e-9) + 1e-15:
            logger.warning(
                "plan TPS %.9g exceeds the DP's target %.9g: the DP estimate is not an upper bound here",
                plan.predicted.time_per_sample,
                chosen.tps,
            )
        return plan


def _better(plan: Plan, than: Plan) -> bool:
    """Least simulated iteration time; ties (relative 1e-12) by the smaller TPS, then the larger ``b``."""
    a, b = plan.predicted.iteration_time, than.predicted.iteration_time
    if abs(a - b) > 1e-12 * max(abs(a), abs(b)):
        return a < b
    ta, tb = plan.predicted.time_per_sample, than.predicted.time_per_sample
    if abs(ta - tb) > 1e-12 * max(abs(ta), abs(tb)):
        return ta < tb
    return plan.stages[0].micro_batch_size > than.stages[0].micro_batch_size
