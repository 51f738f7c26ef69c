"""In-situ calibration: what the commands measure beside a node's own times, as the runtime runs it.

For the profiler: the graph's time-model terms (``terms``: per-node overhead, the loss, the
optimizer step), each node's forward timed inside whole forwards on a CPU (``context``), and the
node times scaled to a one-stage plan trained by ``GraphPipeline`` (``insitu``). For the probe:
how its timings are taken in turns and reduced to fits (``probe_fit``)."""
