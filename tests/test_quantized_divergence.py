"""First divergent layer of a quantized cell: the layer a test model makes fragile on purpose.

models/fragile_layers.py has one layer, ``blocks.1.proj``, whose rows each carry a weight 400x the
others on a nearly dead input channel: XNNPACK's static int8 (per-channel weights) rounds the rest
of each row away (and 8da4w's 4-bit groups). Real capture, PT2E quantization, XNNPACK lowering and the ExecuTorch runtime,
through one `etforge validate`; the cell misses its threshold and its reason names that layer, with the SQNR there and
after it. The same model without the outlier passes and says nothing about divergence.
"""

from __future__ import annotations

import json

import pytest
from conftest import make_project

PIPELINE = """\
name: t
models:
  fragile:
    python: models.fragile_layers:build
    inputs: [{name: x, shape: [1, 64]}]
  sound:
    python: models.fragile_layers:build
    kwargs: {fragile: false}
    inputs: [{name: x, shape: [1, 64]}]
backends:
  xnnpack: {}
quantization: [int8, 8da4w]
thresholds:
  int8: {sqnr_db: 20}
  8da4w: {sqnr_db: 20}
targets: false
"""
FRAGILE_LAYER = "blocks.1.proj"


@pytest.fixture(scope="module")
def validated(tmp_path_factory):
    """name -> (the cell's reason in the run's table, numerics.json), from one real `etforge validate`."""
    project = make_project(tmp_path_factory.mktemp("qdiv") / "proj", PIPELINE)
    run = project.doit("validate")
    assert run.returncode == 1, run.stdout + run.stderr  # the two fragile cells fail
    out = {}
    for name in ("fragile/xnnpack/int8", "sound/xnnpack/int8", "fragile/xnnpack/8da4w"):
        row = next(line for line in run.stdout.splitlines() if line.startswith(name + " "))
        stem = name.replace("/", "_")
        report = json.loads((project.out / name.split("/")[0] / f"{stem}.numerics.json").read_text())
        out[name] = (row, report)
    return out


def test_a_failing_int8_cell_names_the_fragile_layer_with_its_sqnr_and_the_layers_after(validated):
    row, report = validated["fragile/xnnpack/int8"]
    assert " failed " in row, row
    found = report["first_divergence"]
    assert found["layer"] == FRAGILE_LAYER, found
    assert found["sqnr_db"] < 20 and found["threshold_db"] == 20
    assert [n["layer"] for n in found["after"]][:2] == ["blocks.1.act", "blocks.2.proj"], found
    earlier = found["layers"][: found["index"]]
    assert earlier and all(n["sqnr_db"] >= 20 for n in earlier), found  # the layers before it hold
    assert f"first divergence at layer {FRAGILE_LAYER} (aten.linear), SQNR {found['sqnr_db']:.1f} dB" in row
    assert "after it: blocks.1.act" in row and "quantized graph, per layer" in row


def test_a_passing_int8_cell_gets_no_divergence_report(validated):
    row, report = validated["sound/xnnpack/int8"]
    assert " failed " not in row, row
    assert "first_divergence" not in report
    assert "divergence" not in row


def test_a_failing_8da4w_cell_names_the_same_layer(validated):
    """torchao's 8da4w graph (dynamic activations, 4-bit groups): the same per-layer replay."""
    row, report = validated["fragile/xnnpack/8da4w"]
    assert " failed " in row, row
    assert report["first_divergence"]["layer"] == FRAGILE_LAYER, report["first_divergence"]
    assert f"first divergence at layer {FRAGILE_LAYER} (aten.linear)" in row
