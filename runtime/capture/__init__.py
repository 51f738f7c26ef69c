"""Model capture: a PyTorch model traced into a ``torch.fx`` graph whose nodes are the planner's
nodes (``tracing``, ``fx_graph``), its dropout draws made reproducible per sample (``dropout``),
and third-party model packages imported next to a CPU-only torch (``third_party``)."""
