"""Two more models the project did not write, end to end (profile -> plan forced to >= 2 stages ->
torchrun with ``--verify``): torchvision's ``mobilenet_v3_small`` and a HuggingFace ``CLIPModel``
from a tiny random config (text and vision towers, traced with ``torch.export``)."""

from __future__ import annotations

from test_real_models import _plan, _profile, _train_verify


def test_mobilenet_v3_small_as_shipped(tmp_path):
    doc = _profile(tmp_path, "mobilenet_v3_small")
    assert len(doc["nodes"]) > 100 and doc["optimizer_time_per_byte"] > 0
    plan = _plan(tmp_path, doc, batch=4, devices=2, fraction=0.7)
    _train_verify(tmp_path, "mobilenet_v3_small", plan)


def test_clip_two_towers(tmp_path):
    doc = _profile(tmp_path, "clip_tiny")
    ids = [n["id"] for n in doc["nodes"]]
    # both towers are in the graph: nodes reading the text ids and the pixels
    assert len(ids) > 50 and "op_overhead" in doc
    sinks = [n for n in doc["nodes"] if "loss_time" in n["extra"]]
    assert len(sinks) == 1
    plan = _plan(tmp_path, doc, batch=4, devices=2, fraction=0.7)
    _train_verify(tmp_path, "clip_tiny", plan)
