"""A plan's pieces: micro-batch orders, building, simulation, traces and validation."""
