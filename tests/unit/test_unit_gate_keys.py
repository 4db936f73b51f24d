"""What keep_float (and the thresholds auto aims at) and a model's outputs change in the keys."""

from __future__ import annotations

from unit.support import changed_keys, make_unit_project, task_keys

PIPELINE = """\
name: t
version: 0.0.1
models:
  a:
    python: models.a:build
    inputs: [{name: x, shape: [1, 64]}]
backends:
  xnnpack: {}
quantization: [fp32, 8da4w]
targets: false
"""


def test_keep_float_joins_the_quantize_key_and_auto_its_thresholds(tmp_path):
    project = make_unit_project(tmp_path / "proj", PIPELINE, models=("a",))
    plain = task_keys(project.plan())
    project.write_pipeline(PIPELINE + "quantization_options: {8da4w: {keep_float: [head]}}\n")
    listed = task_keys(project.plan())
    quantized = {n for n in plain if n.startswith(("quantize:", "export:a/xnnpack/8da4w", "validate:a/xnnpack/8da4w"))}
    assert {n for n in changed_keys(plain, listed) if not n.startswith(("sizegate", "benchmark"))} == quantized
    # a listed keep_float does not depend on the thresholds ...
    project.write_pipeline(
        PIPELINE + "quantization_options: {8da4w: {keep_float: [head]}}\n" + "thresholds: {8da4w: {sqnr_db: 30}}\n"
    )
    assert not any(n.startswith("quantize:") for n in changed_keys(listed, task_keys(project.plan())))
    # ... auto aims at them: a changed threshold re-runs the quantization too
    project.write_pipeline(PIPELINE + "quantization_options: {8da4w: {keep_float: auto}}\n")
    auto = task_keys(project.plan())
    project.write_pipeline(
        PIPELINE + "quantization_options: {8da4w: {keep_float: auto}}\n" + "thresholds: {8da4w: {sqnr_db: 30}}\n"
    )
    assert any(n.startswith("quantize:") for n in changed_keys(auto, task_keys(project.plan())))


def test_an_outputs_selection_joins_the_capture_key_and_everything_after_it(tmp_path):
    project = make_unit_project(tmp_path / "proj", PIPELINE, models=("a",))
    before = task_keys(project.plan())
    project.edit_pipeline(
        "    inputs: [{name: x, shape: [1, 64]}]", '    inputs: [{name: x, shape: [1, 64]}]\n    outputs: ["[0]"]'
    )
    assert changed_keys(before, task_keys(project.plan())) == set(before)
