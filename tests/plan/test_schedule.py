"""GraphPipe's scheduler: ComputeInFlight (Appendix A.1, Table 2) row by row, and Algorithm 2."""

from __future__ import annotations

import itertools

import pytest

from gpp_solver.cost.model import in_flight_from_order
from gpp_solver.errors import InvalidInputError
from gpp_solver.plan.schedule import compute_in_flight, kfkb_order, schedule_stage_graph, warmup_micro_batches

# Table 2 of the paper, transcribed row by row: (condition, result) on (kx, bx, ky, by, iy).
TABLE2 = {
    1: (lambda kx, bx, ky, by: max(bx, by) < kx * bx < ky * by, lambda kx, bx, ky, by, iy: iy + 2 * max(bx, by)),
    2: (lambda kx, bx, ky, by: max(bx, by) == kx * bx < ky * by, lambda kx, bx, ky, by, iy: iy + max(bx, by)),
    3: (
        lambda kx, bx, ky, by: bx <= by < ky * by < kx * bx,
        lambda kx, bx, ky, by, iy: iy + kx * bx - ky * by + 2 * by,
    ),
    4: (lambda kx, bx, ky, by: bx <= by == ky * by < kx * bx, lambda kx, bx, ky, by, iy: iy + kx * bx),
    5: (
        lambda kx, bx, ky, by: by <= bx < ky * by < kx * bx,
        lambda kx, bx, ky, by, iy: iy + kx * bx - ky * by + 2 * bx,
    ),
    6: (lambda kx, bx, ky, by: by <= bx == ky * by < kx * bx, lambda kx, bx, ky, by, iy: iy + kx * bx),
    7: (lambda kx, bx, ky, by: max(bx, by) == ky * by == kx * bx, lambda kx, bx, ky, by, iy: iy + ky * by),
    8: (lambda kx, bx, ky, by: max(bx, by) < ky * by == kx * bx, lambda kx, bx, ky, by, iy: iy + 2 * max(bx, by)),
    9: (lambda kx, bx, ky, by: bx <= kx * bx < by <= ky * by, lambda kx, bx, ky, by, iy: iy + by),
    10: (lambda kx, bx, ky, by: by <= ky * by < bx <= kx * bx, lambda kx, bx, ky, by, iy: iy + kx * bx - ky * by + bx),
}

# One instance (kx, bx, ky, by, iy) per row, chosen so the row's condition holds.
EXAMPLES = {
    1: (2, 2, 4, 2, 6),  # max=2 < 4 < 8
    2: (1, 4, 4, 2, 8),  # max=4 == 4 < 8
    3: (8, 1, 3, 2, 5),  # 1 <= 2 < 6 < 8
    4: (4, 1, 1, 2, 3),  # 1 <= 2 == 2 < 4
    5: (4, 2, 3, 1, 7),  # 1 <= 2 < 3 < 8
    6: (3, 2, 2, 1, 1),  # 1 <= 2 == 2 < 6
    7: (1, 4, 2, 2, 9),  # max=4 == 4 == 4
    8: (3, 2, 2, 3, 4),  # max=3 < 6 == 6
    9: (2, 1, 1, 4, 4),  # 1 <= 2 < 4 <= 4
    10: (1, 8, 3, 1, 2),  # 1 <= 3 < 8 <= 8
}


@pytest.mark.parametrize("row", sorted(TABLE2))
def test_table2_row(row: int) -> None:
    cond, result = TABLE2[row]
    kx, bx, ky, by, iy = EXAMPLES[row]
    assert cond(kx, bx, ky, by), f"example for row {row} does not satisfy its condition"
    assert compute_in_flight(kx, bx, ky, by, iy) == result(kx, bx, ky, by, iy)


def test_table2_rows_cover_every_case_and_agree() -> None:
    """On a grid, at least one row applies, and every row that applies gives the function's value."""
    vals = [1, 2, 3, 4, 8]
    for kx, bx, ky, by in itertools.product([1, 2, 3, 4], vals, [1, 2, 3, 4], vals):
        iy = 5
        rows = [r for r, (c, _) in TABLE2.items() if c(kx, bx, ky, by)]
        assert rows, (kx, bx, ky, by)
        got = compute_in_flight(kx, bx, ky, by, iy)
        for r in rows:
            assert got == TABLE2[r][1](kx, bx, ky, by, iy), (r, kx, bx, ky, by)


def test_compute_in_flight_rejects_non_positive() -> None:
    with pytest.raises(InvalidInputError):
        compute_in_flight(0, 1, 1, 1, 0)


def test_equal_batches_k1_is_one_more_micro_batch() -> None:
    for b in (1, 2, 8):
        for iy in (b, 3 * b):
            assert compute_in_flight(1, b, 1, b, iy) == iy + b


def test_algorithm2_chain_is_1f1b() -> None:
    """Chain, one micro-batch size, k=1: stage at depth j from the sink holds (j+1)*b samples,
    and its kFkB order is 1F1B: j+1 warm-up forwards, then B/F alternating."""
    b, stages, n_micro = 4, 5, 8
    succs = {i: [i + 1] if i + 1 < stages else [] for i in range(stages)}
    res = schedule_stage_graph(succs, {i: b for i in range(stages)})
    for i in range(stages):
        depth = stages - 1 - i
        k, inflight = res[i]
        assert k == 1 and inflight == (depth + 1) * b
        order = kfkb_order(n_micro, warmup_micro_batches(inflight, b, n_micro))
        w = depth + 1
        assert order[:w] == tuple(("F", j) for j in range(w))
        assert order[w] == ("B", 0)
        # steady state alternates B j, F j+w
        for j in range(n_micro - w):
            assert order[w + 2 * j] == ("B", j) and order[w + 2 * j + 1] == ("F", j + w)
        assert in_flight_from_order(order, b) == min(depth + 1, n_micro) * b


def test_algorithm2_diamond_takes_the_larger_branch() -> None:
    #   0 -> 1 -> 3 -> 4,  0 -> 2 -> 4   (branch through 1 is longer)
    succs = {0: [1, 2], 1: [3], 2: [4], 3: [4], 4: []}
    res = schedule_stage_graph(succs, {i: 2 for i in succs})
    assert {s: i for s, (_, i) in res.items()} == {4: 2, 3: 4, 2: 4, 1: 6, 0: 8}


def test_algorithm2_mixed_micro_batch_sizes() -> None:
    succs = {0: [1], 1: []}
    res = schedule_stage_graph(succs, {0: 1, 1: 2})
    assert res[1] == (1, 2)  # sink: k*b
    assert res[0] == (1, compute_in_flight(1, 1, 1, 2, 2))  # row 9: 2 + 2
    assert res[0][1] == 4


def test_algorithm2_chooses_k_minimising_in_flight() -> None:
    succs = {0: [1], 1: []}
    # with k free, the sink takes k=1 (k*b smallest) and so does stage 0
    res = schedule_stage_graph(succs, {0: 2, 1: 2}, None, k_options=(1, 2, 4))
    assert res == {1: (1, 2), 0: (1, 4)}
    # a fixed k is used as given
    fixed = schedule_stage_graph(succs, {0: 2, 1: 2}, {0: 2, 1: 1})
    assert fixed[0] == (2, compute_in_flight(2, 2, 1, 2, 2))
