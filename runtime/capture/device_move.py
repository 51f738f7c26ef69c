"""A stage's traced module moved to the device its rank trains on, with what its graph baked in.

``nn.Module.to`` moves parameters and buffers. A traced graph holds more that names a device:

- ``torch.export`` (the fallback for models plain fx cannot trace, e.g. HuggingFace CLIP) writes
  the device the model was traced on into the graph's calls: ``aten.arange(..., device=cpu)``,
  ``aten.to.device(x, cpu)``, ``aten._assert_tensor_metadata(..., device=cpu)``;
- fx keeps tensors the code creates at trace time as plain attributes (``_tensor_constant0``),
  neither parameter nor buffer.

The runtime traces every model on the CPU (``gpp_runtime.train`` builds before it picks the device), so
on a GPU both would run on the CPU or fail ("Expected all tensors to be on the same device").
:func:`move_module` moves the module, rewrites every ``torch.device`` of the CPU in its graphs'
calls to the target device (recompiling them) and moves the plain tensor attributes they read.
"""

from __future__ import annotations

import torch
import torch.fx as fx


def _retarget(value, device: torch.device):
    if isinstance(value, torch.device):
        return device if value.type == "cpu" else value
    if isinstance(value, tuple):
        return tuple(_retarget(v, device) for v in value)
    if isinstance(value, list):
        return [_retarget(v, device) for v in value]
    if isinstance(value, dict):
        return {k: _retarget(v, device) for k, v in value.items()}
    return value


def move_module(module: torch.nn.Module, device: torch.device | str) -> torch.nn.Module:
    """``module.to(device)``, its fx graphs' CPU devices and tensor constants moved too (module docstring)."""
    device = torch.device(device)
    module = module.to(device)
    if device.type == "cpu":
        return module
    for gm in module.modules():
        if not isinstance(gm, fx.GraphModule):
            continue
        changed = False
        for node in gm.graph.nodes:
            if node.op == "call_function" or node.op == "call_method":
                args, kwargs = _retarget(node.args, device), _retarget(node.kwargs, device)
                if args != node.args or kwargs != node.kwargs:
                    node.args, node.kwargs = args, kwargs
                    changed = True
            elif node.op == "get_attr":
                owner, _, name = str(node.target).rpartition(".")
                holder = gm.get_submodule(owner) if owner else gm
                value = getattr(holder, name, None)
                held = name in holder._parameters or name in holder._buffers
                if isinstance(value, torch.Tensor) and not held and value.device != device:
                    setattr(holder, name, value.to(device))
        if changed:
            gm.recompile()
    return module
