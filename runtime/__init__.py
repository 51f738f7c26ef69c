"""Runtime: profile a PyTorch model into a gpp-graph/1 and train it with a gpp-plan/1 under torchrun."""
