"""ZeRO-1 for one stage: its optimizer state sharded over the stage's data-parallel replicas.

A plan stage with ``"zero": 1`` (``docs/cost-model.md``, *Sharded optimizer state*) is stepped by
a :class:`ShardedOptimizer` (``GraphPipeline.optimizer`` builds it), as torch's
``ZeroRedundancyOptimizer`` and DeepSpeed's stage 1 do, with one flat part per replica:

- at construction the stage's parameters become views of one flat buffer, padded to a multiple of ``d`` elements; replica ``r`` of the stage owns elements
  ``[r * P, (r + 1) * P)``, ``P = ceil(N / d)``;
- the user's optimizer class steps one tensor, the replica's part of that buffer (a parameter
  sharing its storage), so its state (SGD's momentum, Adam's moments) is ``1/d`` of a replica's;
- ``step()``: the part's gradient is copied from the stage's gradients (already summed over the
  replicas by the pipeline's all-reduce), the stage's gradients are released, the part is stepped,
  and the parts are all-gathered into the buffer, so every replica holds the updated weights.

A stage holding a weight tied to another stage is refused (``GraphPipeline.optimizer``): its copies
must stay bitwise equal, which a part stepped apart from the other copies does not promise.

The update must be elementwise (each weight's update depends on its own gradient and state, as in
SGD, Adam, AdamW, RMSprop, Adagrad): then sharding changes no result. ``LBFGS``, ``SparseAdam``
and ``Adafactor`` are refused. The hyperparameters of ``param_groups[0]`` (what an LR scheduler
changes) are passed to the part's optimizer at each step.

``state_dict()`` is a collective of the stage's replicas: each part's state is all-gathered into
full-length tensors (the checkpoint is a replica's whole state, the same on every replica);
``load_state_dict`` takes that and keeps this replica's part.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist

from gpp_solver.errors import InvalidInputError

#: torch's all-gather into one tensor (``all_gather_into_tensor``, deprecated for this name in newer
#: torch, with a warning printed on every rank at its first call)
_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor

#: optimizers whose update is not elementwise (or not over dense tensors)
NOT_ELEMENTWISE = ("LBFGS", "SparseAdam", "Adafactor")


class ShardedOptimizer(torch.optim.Optimizer):
    """``optimizer_class`` over this replica's part of the stage's parameters ``params`` (module
    docstring); ``group``: the stage's data-parallel process group (``None``: one replica)."""

    def __init__(self, params, optimizer_class, group, **defaults) -> None:
        if not (isinstance(optimizer_class, type) and issubclass(optimizer_class, torch.optim.Optimizer)):
            raise InvalidInputError(f"optimizer_class must be a torch.optim.Optimizer class, got {optimizer_class!r}")
        if optimizer_class.__name__ in NOT_ELEMENTWISE:
            raise InvalidInputError(
                f"{optimizer_class.__name__} does not update each weight from its own gradient and state: "
                "its state cannot be sharded (zero 1); plan the stage with zero 0"
            )
        params = list(params)
        super().__init__(params, defaults)
        self.optimizer_class = optimizer_class
        self.group = group
        self.shards = dist.get_world_size(group) if group is not None else 1
        self.index = dist.get_rank(group) if group is not None else 0
        self._sharded = params
        self._flat, self.part = self._flatten(params)
        self.inner = optimizer_class([self.part] if self.part is not None else [], **defaults)

    def _flatten(self, params: list[torch.nn.Parameter]):
        """One flat buffer behind ``params`` (now views of it) and this replica's part of it."""
        if not params:
            return None, None
        dtypes = {p.dtype for p in params}
        if len(dtypes) > 1:
            names = ", ".join(sorted(str(t) for t in dtypes))
            raise InvalidInputError(f"zero 1 shards one flat buffer of one dtype; the stage's parameters are {names}")
        total = sum(p.numel() for p in params)
        part = math.ceil(total / self.shards)
        flat = torch.zeros(part * self.shards, dtype=params[0].dtype, device=params[0].device)
        offset = 0
        self._layout = []
        for p in params:
            n = p.numel()
            flat[offset : offset + n].copy_(p.detach().reshape(-1))
            p.data = flat[offset : offset + n].view_as(p)
            self._layout.append((p, offset, n))
            offset += n
        lo = self.index * part
        return flat, torch.nn.Parameter(flat[lo : lo + part])

    def _part_gradient(self) -> torch.Tensor:
        """This replica's part of the stage's gradients, one flat tensor (zeros where a parameter has none)."""
        part = self.part
        lo, hi = self.index * part.numel(), (self.index + 1) * part.numel()
        grad = torch.zeros_like(part)
        for p, offset, n in self._layout:
            a, b = max(lo, offset), min(hi, offset + n)
            if a < b and p.grad is not None:
                grad[a - lo : b - lo].copy_(p.grad.reshape(-1)[a - offset : b - offset])
        return grad

    @torch.no_grad()
    def step(self, closure=None):
        if closure is not None:
            raise InvalidInputError("ShardedOptimizer.step() takes no closure")
        settings = {k: v for k, v in self.param_groups[0].items() if k != "params"}
        for g in self.inner.param_groups:
            g.update(settings)
        if self.part is not None:
            self.part.grad = self._part_gradient()
            for p in self._sharded:  # released: the part's gradient is all the step needs
                p.grad = None
        self.inner.step()
        if self.part is not None:
            self.part.grad = None
            if self.shards > 1:
                _all_gather(self._flat, self.part.detach().clone(), group=self.group)
        return None

    def zero_grad(self, set_to_none: bool = True) -> None:
        super().zero_grad(set_to_none)
        self.inner.zero_grad(set_to_none)

    def state_bytes(self) -> int:
        """Bytes of optimizer state this replica holds (its part's)."""
        return sum(
            v.numel() * v.element_size()
            for st in self.inner.state.values()
            for v in st.values()
            if isinstance(v, torch.Tensor) and v.dim() > 0
        )

    def state_tensors(self):
        """The tensors of this replica's optimizer state."""
        for st in self.inner.state.values():
            yield from (v for v in st.values() if isinstance(v, torch.Tensor))

    def state_dict(self) -> dict:
        """The part's optimizer's state with each of the part's state tensors all-gathered to the
        whole buffer's length (a collective: every replica of the stage calls it)."""
        sd = self.inner.state_dict()
        if self.part is None or self.shards == 1:
            return sd
        state = dict(sd["state"])
        mine = dict(state.get(0, {}))
        for k, v in mine.items():
            if isinstance(v, torch.Tensor) and v.shape == self.part.shape:
                whole = torch.empty(v.numel() * self.shards, dtype=v.dtype, device=v.device)
                _all_gather(whole, v.contiguous(), group=self.group)
                mine[k] = whole
        state[0] = mine
        return {**sd, "state": state}

    def load_state_dict(self, state_dict: dict) -> None:
        """Load what :meth:`state_dict` returned: this replica's part of each whole-length tensor."""
        if self.part is None or self.shards == 1:
            self.inner.load_state_dict(state_dict)
            return
        n = self.part.numel()
        state = dict(state_dict["state"])
        mine = dict(state.get(0, {}))
        for k, v in mine.items():
            if isinstance(v, torch.Tensor) and v.dim() == 1 and v.numel() == n * self.shards:
                mine[k] = v[self.index * n : (self.index + 1) * n].clone()
        state[0] = mine
        self.inner.load_state_dict({**state_dict, "state": state})
