"""Trace a workload's model into an ``fx.GraphModule``, with the workload's own tracer hooks.

A workload (``MODULE:FUNCTION`` returning a namespace with ``model``, ``sample``, ``loss``) may
also carry, all optional:

- ``graph_module``: an ``fx.GraphModule`` already traced by the user (any tracer), used as is;
- ``tracer``: a callable ``model -> fx.GraphModule`` (e.g. a library's own fx tracer);
- ``leaf_modules``: module classes (or qualified module names) kept whole as one node each, for
  blocks fx cannot trace through (HuggingFace attention, timm blocks with asserts);
- ``concrete_args``: ``{argument: value}`` specialised at trace time (torch.fx ``concrete_args``);
- ``autowrap_functions``: functions called by the model's code that become one node each instead
  of being traced through (torch.fx ``autowrap_functions``; e.g. a library's mask builder).

Optional forward arguments whose default is ``None`` are specialised to ``None`` unless the
workload names them in ``concrete_args``, so they never become graph inputs (the model's inputs
are the arguments ``sample()`` provides). When plain fx fails and example inputs are at
hand, the model is exported with ``torch.export`` (non-strict, batch dimension dynamic) and its
ATen-level graph is used (``workload.export = False`` turns this off). A model neither can trace
raises ``InvalidInputError`` with one line naming the construct and where it is (file, line,
source), and what to do.
"""

from __future__ import annotations

import inspect
import linecache
import logging
import traceback

import torch
import torch.fx as fx

from gpp_solver.errors import InvalidInputError

logger = logging.getLogger(__name__)
_FX_FILES = ("torch/fx/", "torch/nn/modules/module.py", "torch/_", "runtime/capture/tracing.py")


class _HookTracer(fx.Tracer):
    """``fx.Tracer`` that also keeps the workload's ``leaf_modules`` whole."""

    def __init__(self, leaves: tuple, autowrap: tuple = ()) -> None:
        super().__init__(autowrap_functions=autowrap)
        self._leaf_types = tuple(x for x in leaves if isinstance(x, type))
        self._leaf_names = {x for x in leaves if isinstance(x, str)}

    def is_leaf_module(self, m: torch.nn.Module, qualname: str) -> bool:
        if isinstance(m, self._leaf_types) or qualname in self._leaf_names:
            return True
        return super().is_leaf_module(m, qualname)


def _none_defaults(model: torch.nn.Module, given: dict, n_inputs: int | None) -> dict:
    """``{name: None}`` for every forward argument defaulting to None, not in ``given`` and not
    among the first ``n_inputs`` positional arguments (those the workload's ``sample`` passes)."""
    out = dict(given)
    try:
        params = list(inspect.signature(model.forward).parameters.values())
    except (TypeError, ValueError):
        return out
    for i, p in enumerate(params):
        if n_inputs is not None and i < n_inputs and p.kind != p.KEYWORD_ONLY:
            continue
        if p.default is None and p.name not in out and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY):
            out[p.name] = None
    return out


def _drop_specialised(gm: fx.GraphModule) -> fx.GraphModule:
    """Remove fx's ``_assert_is_none`` checks and the placeholders nothing reads any more."""
    g = gm.graph
    for n in list(g.nodes):
        if n.op == "call_function" and getattr(n.target, "__name__", "") == "_assert_is_none":
            g.erase_node(n)
    for n in list(g.nodes):
        if n.op == "placeholder" and not n.users and n.args and n.args[0] is None:
            g.erase_node(n)  # an optional argument specialised to its default None
    g.lint()
    gm.recompile()
    return gm


def _where(exc: BaseException) -> str:
    """``file:line in function: `source``` of the innermost frame of model code in ``exc``."""
    frames = [
        f
        for f in traceback.extract_tb(exc.__traceback__)
        if not any(s in f.filename.replace("\\", "/") for s in _FX_FILES)
    ]
    if not frames:
        return "an unknown place"
    f = frames[-1]
    src = (f.line or linecache.getline(f.filename, f.lineno)).strip()
    parts = f.filename.replace("\\", "/").split("/")
    short = "/".join(parts[-3:])
    return f"{short}:{f.lineno} in {f.name}: `{src}`"


def _construct(exc: BaseException) -> str:
    text = str(exc).split("\n")[0]
    if "control flow" in text:
        return "data-dependent control flow (an `if`/`while` on a tensor value)"
    if "iterate" in text or "len(" in text or "__len__" in text:
        return "iteration over, or len() of, a traced value"
    if "Proxy" in text and ("int" in text or "bool" in text or "float" in text):
        return "a traced value converted to a Python number"
    return f"{type(exc).__name__}: {text}"


def _export(model: torch.nn.Module, example_inputs: tuple) -> fx.GraphModule:
    """``torch.export`` (non-strict) with a dynamic batch dimension; the unlifted GraphModule."""
    batch = torch.export.Dim("batch", min=1, max=1 << 16)
    shapes = tuple({0: batch} if isinstance(x, torch.Tensor) and x.dim() else None for x in example_inputs)
    ep = torch.export.export(model, tuple(example_inputs), strict=False, dynamic_shapes=shapes)
    return ep.module()


def trace_module(
    model: torch.nn.Module,
    *,
    leaf_modules=(),
    concrete_args: dict | None = None,
    tracer=None,
    graph_module: fx.GraphModule | None = None,
    n_inputs: int | None = None,
    autowrap_functions=(),
    example_inputs: tuple | None = None,
    export: bool = True,
) -> fx.GraphModule:
    """The model as an ``fx.GraphModule`` using the hooks above; InvalidInputError if it cannot.
    ``n_inputs``: how many positional inputs the caller passes (None: those without a default);
    ``example_inputs`` allow the ``torch.export`` fallback."""
    if graph_module is not None:
        if not isinstance(graph_module, fx.GraphModule):
            raise InvalidInputError(
                f"workload graph_module must be a torch.fx.GraphModule, got {type(graph_module).__name__}"
            )
        return graph_module
    if tracer is not None:
        gm = tracer(model)
        if not isinstance(gm, fx.GraphModule):
            raise InvalidInputError(f"workload tracer must return a torch.fx.GraphModule, got {type(gm).__name__}")
        return gm
    args = _none_defaults(model, dict(concrete_args or {}), n_inputs)
    t = _HookTracer(tuple(leaf_modules), tuple(autowrap_functions))
    try:
        graph = t.trace(model, concrete_args=args or None)
    except Exception as exc:  # noqa: BLE001 - fx raises many kinds
        msg = (
            f"torch.fx cannot trace the model: {_construct(exc)} at {_where(exc)}; give the "
            "workload `leaf_modules` (keep that block whole), `concrete_args`, or a traced "
            "`graph_module`"
        )
        if not export or example_inputs is None:
            raise InvalidInputError(msg) from exc
        try:
            gm = _export(model, example_inputs)
        except Exception as exc2:  # noqa: BLE001 - export raises many kinds
            raise InvalidInputError(
                f"{msg} (torch.export failed too: {type(exc2).__name__}: "
                f"{str(exc2).splitlines()[0] if str(exc2) else ''})"
            ) from exc
        logger.info(
            "torch.fx cannot trace the model (%s at %s); using torch.export's graph", _construct(exc), _where(exc)
        )
        return gm
    name = model.__class__.__name__
    return _drop_specialised(fx.GraphModule(t.root, graph, name))


def workload_hooks(workload) -> dict:
    """The tracing hooks a workload may carry (``leaf_modules``, ``concrete_args``,
    ``autowrap_functions``, ``tracer``, ``graph_module``, ``export``), as keywords of :func:`trace_module`."""
    return {
        "export": bool(getattr(workload, "export", True)),
        "leaf_modules": tuple(getattr(workload, "leaf_modules", ()) or ()),
        "concrete_args": getattr(workload, "concrete_args", None),
        "autowrap_functions": tuple(getattr(workload, "autowrap_functions", ()) or ()),
        "tracer": getattr(workload, "tracer", None),
        "graph_module": getattr(workload, "graph_module", None),
    }


def workload_graph_module(workload, example_inputs: tuple | None = None) -> fx.GraphModule:
    """:func:`trace_module` of ``workload.model`` with the workload's optional hooks."""
    return trace_module(
        workload.model,
        example_inputs=example_inputs,
        n_inputs=None if example_inputs is None else len(example_inputs),
        **workload_hooks(workload),
    )
