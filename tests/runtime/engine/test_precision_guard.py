"""The runtime trains in the dtypes traced when a pipeline is built: a tensor about to cross stages
in another dtype or shape is an error naming it (never bytes reinterpreted by the receiver), and a
step or a pipeline built under ``torch.autocast`` is refused in one line."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402
from torch import nn  # noqa: E402

from gpp_runtime import GraphPipeline  # noqa: E402
from gpp_runtime.engine.p2p import LeafMeta, check_travelling  # noqa: E402
from gpp_solver.errors import InvalidInputError  # noqa: E402


def test_a_tensor_of_another_dtype_or_shape_is_named_before_it_is_sent():
    metas = [LeafMeta((4,), torch.float32)]
    check_travelling([torch.zeros(2, 4)], metas, 2, "the activation 'fc1'")  # as traced: nothing
    with pytest.raises(InvalidInputError) as e:
        check_travelling([torch.zeros(2, 4, dtype=torch.bfloat16)], metas, 2, "the activation 'fc1'")
    msg = str(e.value)
    assert msg.startswith("the activation 'fc1' is bfloat16 of shape (2, 4)")
    assert "traced float32 of shape (2, 4)" in msg and "torch.autocast" in msg
    two = [LeafMeta((4,), torch.float32), LeafMeta((3,), torch.float32)]
    with pytest.raises(InvalidInputError, match=r"\(tensor 1\) is float32 of shape \(2, 5\)"):
        check_travelling([torch.zeros(2, 4), torch.zeros(2, 5)], two, 2, "the gradient of 'x'")


class _Tiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.act, self.fc2 = nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


def _one_stage_plan() -> dict:
    order = [["F", 0], ["B", 0], ["F", 1], ["B", 1]]
    return {
        "format": "gpp-plan/1",
        "planner": "hand",
        "graph": "tiny",
        "mini_batch_size": 4,
        "stages": [
            {
                "id": 0,
                "nodes": ["fc1", "act", "fc2"],
                "devices": [0],
                "micro_batch_size": 2,
                "schedule": {"kind": "kFkB", "k": 1, "order": order},
            }
        ],
        "edges": [],
    }


@pytest.fixture
def one_rank_world():
    assert not dist.is_initialized()
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def test_autocast_around_a_step_or_the_pipeline_is_refused_in_one_line(one_rank_world):
    torch.manual_seed(0)
    model, x, y = _Tiny(), torch.randn(4, 4), torch.randint(0, 3, (4,))
    loss_fn = nn.CrossEntropyLoss()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        with pytest.raises(InvalidInputError) as e:
            GraphPipeline(model, _one_stage_plan(), loss_fn, (x,), memory_step=None)
    msg = str(e.value)
    assert "\n" not in msg
    assert msg.startswith("GraphPipeline() ran under torch.autocast('cpu', dtype=bfloat16)")
    pipe = GraphPipeline(model, _one_stage_plan(), loss_fn, (x,), memory_step=None)
    before = [p.detach().clone() for p in model.parameters()]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        with pytest.raises(InvalidInputError, match=r"^step\(\) ran under torch.autocast\('cpu', dtype=bfloat16\)"):
            pipe.step(x, target=y)
    assert all(torch.equal(a, p) for a, p in zip(before, model.parameters()))  # nothing ran
    loss = pipe.step(x, target=y)  # outside autocast it trains
    assert loss is not None and torch.isfinite(loss)
