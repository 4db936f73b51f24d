"""First divergent layer of a quantized cell: the layer a test model makes fragile on purpose.

models/fragile_layers.py has one layer, ``blocks.1.proj``, whose rows each carry a weight 400x the
others on a nearly dead input channel: XNNPACK's static int8 (per-channel weights) rounds the rest
of each row away (and 8da4w's 4-bit groups). Real capture, PT2E quantization, XNNPACK and portable
lowering and the ExecuTorch runtime, through one `etforge validate`; the cell misses its threshold and
its reason names that layer, with the SQNR there and after it. The portable int8 program shows every
layer in its own ETDump, so its report is read from the program's intermediate outputs; the XNNPACK
delegate is opaque to ETDump, so that cell's report is the quantized graph's replay and says why.
The same model without the outlier passes and says nothing about divergence. With ``keep_float:
auto`` the per-layer reading names that layer at quantize time, so auto keeps it in float after
one measurement of the model so quantized instead of measuring every layer alone first; the cell
passes, and its report still reads the program's own outputs.
"""

from __future__ import annotations

import json

import pytest
from conftest import make_project, state

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
  portable: {}
quantization: [int8, 8da4w]
matrix:
  exclude:  # one portable cell: it shares the xnnpack int8 cell's quantized graph
    - {backend: portable, quantization: 8da4w}
    - {model: sound, backend: portable}
thresholds:
  int8: {sqnr_db: 20}
  8da4w: {sqnr_db: 20}
targets: false
"""
FRAGILE_LAYER = "blocks.1.proj"


def _cells(project, run, names) -> dict:
    """name -> (the cell's row in the run's table, its numerics.json)."""
    out = {}
    for name in names:
        row = next(line for line in run.stdout.splitlines() if line.startswith(name + " "))
        stem = name.replace("/", "_")
        out[name] = (row, json.loads((project.out / name.split("/")[0] / f"{stem}.numerics.json").read_text()))
    return out


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    project = make_project(tmp_path_factory.mktemp("qdiv") / "proj", PIPELINE)
    run = project.doit("validate")
    assert run.returncode == 1, run.stdout + run.stderr  # the fragile cells fail
    names = ("fragile/xnnpack/int8", "sound/xnnpack/int8", "fragile/xnnpack/8da4w", "fragile/portable/int8")
    return project, _cells(project, run, names)


@pytest.fixture(scope="module")
def validated(built):
    """name -> (the cell's reason in the run's table, numerics.json), from one real `etforge validate`."""
    return built[1]


@pytest.fixture(scope="module")
def rescued(built):
    """The same project with keep_float auto on int8, its portable cell validated: (the quantize record's
    rescue, name -> cell)."""
    project = built[0]
    project.write_pipeline(PIPELINE + "quantization_options: {int8: {keep_float: auto}}\n")
    run = project.doit("validate", "--models", "fragile", "--schemes", "int8", "--backends", "portable")
    assert run.returncode == 0, run.stdout + run.stderr
    rescue = state(project, "quantize:fragile/int8/xnnpack_int8_static")["info"]["rescue"]
    return rescue, _cells(project, run, ("fragile/portable/int8",))


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
    # the delegate runs every layer and logs only its outputs: the replay, and the report says why
    assert found["method"] == "quantized graph replayed per layer against eager fp32", found
    assert found["why"] == "the program's XnnpackBackend delegate is opaque to ETDump (7 of 7 layers inside it)"
    assert "against eager fp32: the program's XnnpackBackend delegate is opaque to ETDump" in row


def test_a_portable_int8_cell_names_the_fragile_layer_from_its_own_etdump(validated):
    """No delegate: every portable kernel logs its output, mapped to layers through the ETRecord."""
    row, report = validated["fragile/portable/int8"]
    assert " failed " in row, row
    found = report["first_divergence"]
    assert found["method"] == "program's own intermediate outputs (ETDump) per layer against eager fp32", found
    assert "why" not in found, found
    assert found["layer"] == FRAGILE_LAYER and found["sqnr_db"] < 20, found
    assert [n["layer"] for n in found["layers"]] == [
        "blocks.0.proj", "blocks.0.act", "blocks.1.proj", "blocks.1.act", "blocks.2.proj", "blocks.2.act", "head",
    ]  # fmt: skip
    assert all(n["sqnr_db"] >= 20 for n in found["layers"][: found["index"]]), found
    assert f"first divergence at layer {FRAGILE_LAYER} (aten.linear), SQNR {found['sqnr_db']:.1f} dB" in row
    assert "(the program's own intermediate outputs (ETDump), per layer, against eager fp32)" in row


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
    assert report["first_divergence"]["why"].startswith("the program's XnnpackBackend delegate is opaque")
    assert f"first divergence at layer {FRAGILE_LAYER} (aten.linear)" in row


def test_keep_float_auto_keeps_the_layer_the_divergence_names_after_fewer_measurements(rescued):
    rescue, cells = rescued
    assert [e["layer"] for e in rescue["kept"]] == [FRAGILE_LAYER], rescue
    assert rescue["reached"] and rescue["before_db"] < 20 <= rescue["after_db"], rescue
    assert rescue["search"] == "first divergence", rescue
    assert rescue["divergence"]["layer"] == FRAGILE_LAYER and rescue["divergence"]["tried"] == FRAGILE_LAYER
    candidates = len(rescue["sensitivity"])
    assert candidates == 4 and rescue["measurements"] == 2 < 1 + candidates, rescue  # the search: 1 + L + k
    for name in cells:
        row, report = cells[name]
        assert " failed " not in row and report["passed"], row


def test_a_rescued_cell_reports_its_layers_from_its_own_etdump(rescued):
    """keep_float auto changed the cell: its report is kept although it passes, and names no failure."""
    _, cells = rescued
    row, report = cells["fragile/portable/int8"]
    found = report["first_divergence"]
    assert found["method"] == "program's own intermediate outputs (ETDump) per layer against eager fp32", found
    assert "divergence" not in row, row
