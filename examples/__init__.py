"""Example workloads for ``runtime.profile`` and ``runtime.train`` (``--model examples.NAME:FUNCTION``)."""
