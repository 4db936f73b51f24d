"""Dynamic shapes: a shared `seq` dim exported with torch.export.Dim, validated
at min, an interior non-power-of-two size and max on XNNPACK and portable, in fp32 and quantized
(int8 static, 8da8w: the quantized graph keeps the capture's Dims); backends without
`dynamic_shapes: true` are rejected at plan time with the reason."""

from __future__ import annotations

import json

import pytest

from tests.conftest import make_project

PIPELINE = """\
name: t
version: 0.0.1
models:
  seq:
    python: models.token_seq:build
    inputs:
      - {name: ids, shape: [1, {min: 1, max: 64, name: seq}], dtype: int64, range: [0, 50]}
      - {name: x, shape: [1, {min: 1, max: 64, name: seq}, 16]}
backends:
  xnnpack: {}
  portable: {}
  openvino: {}
quantization: [fp32, int8, 8da8w]
targets: false  # aarch64 verdicts: tests/test_aarch64_targets.py
matrix:
  exclude: [{backend: portable, quantization: int8}]
"""


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    project = make_project(tmp_path_factory.mktemp("io_dynamic") / "proj", PIPELINE)
    run = project.doit()
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    return project


def test_dynamic_model_is_validated_at_min_interior_and_max(built):
    reports = {
        (r["cell"]["backend"], r["cell"]["quantization"]): r
        for r in map(lambda p: json.loads(p.read_text()), built.root.rglob("numerics.json"))
    }
    assert set(reports) == {("xnnpack", "fp32"), ("xnnpack", "int8"), ("xnnpack", "8da8w"), ("portable", "fp32")}
    for report in reports.values():
        assert report["passed"], report["misses"]
        sizes = sorted({o["input_shapes"][0][1] for o in report["outputs"]})
        assert sizes == [1, 33, 64]
        assert all(o["input_shapes"][1] == [1, o["input_shapes"][0][1], 16] for o in report["outputs"])
        scores = [o for o in report["outputs"] if o["path"] == "[0]"]
        assert sorted(o["shape"][1] for o in scores) == [1, 33, 64]  # outputs follow the input size


def test_backends_without_dynamic_shapes_are_rejected_at_plan_time(tmp_path, monkeypatch):
    from etforge.config.resolve import resolve

    project = make_project(tmp_path / "proj", PIPELINE)
    plan = resolve(project.pipeline)
    assert sorted(c.name for c in plan.cells) == [
        "seq/portable/fp32",
        "seq/xnnpack/8da8w",
        "seq/xnnpack/fp32",
        "seq/xnnpack/int8",
    ]
    reasons = {r.name: r.reason for r in plan.rejected}
    assert "openvino cannot lower dynamic shapes" in reasons["seq/openvino/fp32"]
    (ids, x) = plan.models["seq"].inputs
    assert ids.shape == (1, 64) and ids.dims == ((1, 1, 64, "seq"),) and x.dims == ((1, 1, 64, "seq"),)


@pytest.mark.parametrize(
    "dim,message",
    [
        ("{min: 8, max: 8}", "a dynamic dim needs min < max, got min 8, max 8"),
        ("{min: 1, max: 32, name: seq}", "dim 'seq' is [1, 64] on an earlier input, [1, 32] here"),
        ("{min: 0, max: 8}", "shape[1].min: expected a number >= 1, got 0"),
        ("{max: 8}", "expected a positive integer, or a dynamic dim"),
    ],
)
def test_a_bad_dynamic_dim_is_one_line_with_file_line_key(dim, message, tmp_path, monkeypatch):
    from etforge.config.resolve import resolve
    from etforge.core.errors import PipelineError

    text = PIPELINE.replace("[1, {min: 1, max: 64, name: seq}, 16]", f"[1, {dim}, 16]")
    project = make_project(tmp_path / "proj", text)
    monkeypatch.chdir(project.root)
    with pytest.raises(PipelineError) as info:
        resolve(project.pipeline)
    assert str(info.value).startswith("pipeline.yaml:8: models.seq.inputs[1].shape[1]"), str(info.value)
    assert message in str(info.value)


def test_measured_sizes_step_off_powers_of_two():
    from etforge.config.model import measured_sizes

    assert measured_sizes(1, 512) == [1, 257, 512]
    assert measured_sizes(1, 64) == [1, 33, 64]
    assert measured_sizes(2, 3) == [2, 3]
    assert measured_sizes(4, 12) == [4, 9, 12]


def test_a_dim_torch_export_cannot_take_fails_the_capture_with_its_suggested_fix(tmp_path):
    project = make_project(
        tmp_path / "proj",
        """\
name: t
version: 0.0.1
models:
  audio:
    python: models.strided:build
    inputs: [{name: wave, shape: [1, 2, {min: 1, max: 64, name: T}]}]
backends:
  portable: {}
quantization: [fp32]
targets: false  # aarch64 verdicts: tests/test_aarch64_targets.py
""",
    )
    (project.root / "models" / "strided.py").write_text(
        "import torch\n\ndef build():\n    return torch.nn.Sequential(torch.nn.Conv1d(2, 4, 3, stride=2, padding=1), torch.nn.GELU())\n"
    )
    run = project.doit("capture")
    assert run.returncode != 0
    state = json.loads(next((project.out / ".state").glob("capture__audio*.json")).read_text())
    assert state["reason"].startswith("model 'audio': torch.export rejects its dynamic dims:"), state["reason"]
    assert "\n" not in state["reason"] and "(change min/max in pipeline.yaml)" in state["reason"]
    assert "Not all values of T" in state["reason"]  # torch.export's own words on what fails


def test_manifests_carry_the_dim_ranges(built):
    run = built.doit("manifest")
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    index = json.loads((built.out / "manifests" / "index.json").read_text())
    entry = next(e for e in index["models"] if e["backend"] == "xnnpack")
    ids, x = entry["inputs"]
    assert ids["shape"] == [1, 64] and ids["dynamic"] == [{"axis": 1, "min": 1, "max": 64, "name": "seq"}]
    assert x["dynamic"] == [{"axis": 1, "min": 1, "max": 64, "name": "seq"}]
    assert [o["path"] for o in entry["outputs"]] == ["[0]", "[1]"]
    # The planned arena is sized at the dims' upper bound, and the manifests say so.
    portable = next(e for e in index["models"] if e["backend"] == "portable")
    assert portable["costs"]["planned_note"] == "at the maximum shape (dynamic dims are planned at their upper bound)"
    assert (
        entry["costs"]["planned_note"].startswith("at the maximum shape")
        and "lower bound" in entry["costs"]["planned_note"]
    )
    assert portable["costs"]["planned_peak_bytes"] >= 64 * 16 * 4  # at least one [1, 64, 16] float32 activation


def test_benchmark_reports_latency_at_each_measured_size(built):
    benches = [json.loads(p.read_text()) for p in built.root.rglob("bench.json")]
    assert {(b["cell"]["backend"], b["cell"]["quantization"]) for b in benches} >= {
        ("xnnpack", "fp32"),
        ("xnnpack", "int8"),
    }
    for bench in benches:
        sizes = [p["input_shapes"][0][1] for p in bench["per_size"]]
        assert sizes == [1, 33, 64]
        assert all(p["latency_ms"]["p50"] > 0 and p["iterations"] >= 1 for p in bench["per_size"])


def test_provisional_note_asks_for_data_in_the_form_the_model_takes(built):
    cells = {r["cell"]: r for r in json.loads((built.out / "summary.json").read_text())}
    note = cells["seq/xnnpack/fp32"]["note"]
    assert cells["seq/xnnpack/fp32"]["status"] == "provisional"
    assert "name one npz per shape under models.seq.validation.shapes" in note  # (etforge.config.validation_data)
