"""Model capture: a PyTorch model traced into a ``torch.fx`` graph whose nodes are the planner's
nodes (``tracing``, ``fx_graph``), measured into a ``gpp-graph/1`` (``profiler``), its dropout
draws made reproducible per sample (``dropout``), third-party model packages imported next
to a CPU-only torch (``third_party``), and a traced module moved to a device with what its graph
baked in (``device_move``)."""
