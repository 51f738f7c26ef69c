"""Example workloads for ``gpp_runtime.profile`` and ``gpp_runtime.train`` (``--model examples.NAME:FUNCTION``)."""
