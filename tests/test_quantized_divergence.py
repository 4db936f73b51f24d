"""First divergent layer of a quantized cell: the layer a test model makes fragile on purpose.

models/fragile_layers.py has one layer, ``blocks.1.proj``, whose rows each carry a weight 400x the
others on a nearly dead input channel: XNNPACK's static int8 (per-channel weights) rounds the rest
of each row away (and 8da4w's 4-bit groups). Real capture, PT2E quantization, XNNPACK lowering and the ExecuTorch runtime,
in-process; the cell misses its threshold and its reason names that layer, with the SQNR there and
after it. The same model without the outlier passes and says nothing about divergence.
"""

from __future__ import annotations

import json

import pytest
from conftest import make_project

from etforge.config.resolve import resolve

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
"""
FRAGILE_LAYER = "blocks.1.proj"


def _validate(project, plan, name: str):
    """(validate's BuildResult, numerics.json) of one int8 cell, built stage by stage in-process."""
    import torch

    from etforge.builders.capture.capture import build_capture
    from etforge.builders.capture.reference import REFERENCE
    from etforge.builders.lowering.lower import build_export
    from etforge.builders.numerics.validate import build_validate
    from etforge.builders.quantization.quantize import _export_quantized, quantize_model
    from etforge.pipeline.stage_results import ExportResult

    cell = next(c for c in plan.cells if c.name == name)
    work = project.root / "work" / name.replace("/", "_")
    dirs = {stage: work / stage for stage in ("capture", "quantize", "export", "validate")}
    for path in dirs.values():
        path.mkdir(parents=True)
    capture = build_capture(cell.model, plan.root, plan.seed, dirs["capture"])
    model, inputs, _ = quantize_model(cell, plan.root, plan.seed, capture.files["model.pt2"], capture.files[REFERENCE])
    quantized = dirs["quantize"] / "model.pt2"
    torch.export.save(_export_quantized(cell, model, inputs), quantized)
    export = build_export(cell, quantized, dirs["export"])
    assert export.status == "ok", export.reason
    result = build_validate(
        cell,
        export.files["program.pte"],
        capture.files[REFERENCE],
        list(export.result.input_dtypes if isinstance(export.result, ExportResult) else ()),
        dirs["validate"],
        program=capture.files["model.pt2"],
        quantized=quantized,
    )
    return result, json.loads((dirs["validate"] / "numerics.json").read_text())


@pytest.fixture(scope="module")
def validated(tmp_path_factory):
    project = make_project(tmp_path_factory.mktemp("qdiv") / "proj", PIPELINE)
    plan = resolve(project.pipeline)
    return {
        name: _validate(project, plan, name)
        for name in ("fragile/xnnpack/int8", "sound/xnnpack/int8", "fragile/xnnpack/8da4w")
    }


def test_a_failing_int8_cell_names_the_fragile_layer_with_its_sqnr_and_the_layers_after(validated):
    result, report = validated["fragile/xnnpack/int8"]
    assert result.status == "failed", result.reason
    found = report["first_divergence"]
    assert found["layer"] == FRAGILE_LAYER, found
    assert found["sqnr_db"] < 20 and found["threshold_db"] == 20
    assert [n["layer"] for n in found["after"]][:2] == ["blocks.1.act", "blocks.2.proj"], found
    earlier = found["layers"][: found["index"]]
    assert earlier and all(n["sqnr_db"] >= 20 for n in earlier), found  # the layers before it hold
    assert f"first divergence at layer {FRAGILE_LAYER} (aten.linear), SQNR {found['sqnr_db']:.1f} dB" in result.reason
    assert "after it: blocks.1.act" in result.reason and "quantized graph, per layer" in result.reason


def test_a_passing_int8_cell_gets_no_divergence_report(validated):
    result, report = validated["sound/xnnpack/int8"]
    assert result.status == "ok", result.reason
    assert "first_divergence" not in report
    assert not result.reason or "divergence" not in result.reason


def test_a_failing_8da4w_cell_names_the_same_layer(validated):
    """torchao's 8da4w graph (dynamic activations, 4-bit groups): the same per-layer replay."""
    result, report = validated["fragile/xnnpack/8da4w"]
    assert result.status == "failed", result.reason
    assert report["first_divergence"]["layer"] == FRAGILE_LAYER, report["first_divergence"]
    assert f"first divergence at layer {FRAGILE_LAYER} (aten.linear)" in result.reason
