"""Runtime: profile a PyTorch model into a gpp-graph/1 and train it with a gpp-plan/1 under torchrun.

``gpp_runtime.GraphPipeline`` runs a plan inside the user's own training loop (``runtime/engine/pipeline.py``),
in one of ``PRECISIONS`` (``runtime/capture/precision.py``).
"""

from .capture.precision import PRECISIONS
from .engine.pipeline import GraphPipeline

__all__ = ["PRECISIONS", "GraphPipeline"]
