"""Several methods in one program (encode and decode), each validated and
benchmarked, in fp32 and with a weight scheme (8da8w: one quantized model, each method exported from
it); PT2E schemes and on-device cells of such a model are rejected at plan time."""

from __future__ import annotations

import json

import pytest

from tests.conftest import make_project

PIPELINE = """\
name: t
version: 0.0.1
models:
  seq2seq:
    python: models.encoder_decoder:build
    methods:
      encode: {inputs: [{name: x, shape: [1, 8, 16]}]}
      decode: {inputs: [{name: ids, shape: [1, 4], dtype: int64, range: [0, 20]}, {name: memory, shape: [1, 16]}]}
backends:
  xnnpack: {}
  portable: {}
quantization: [fp32, int8, 8da8w]
targets: false  # aarch64 verdicts: tests/test_aarch64_targets.py
matrix:
  exclude: [{backend: portable, quantization: 8da8w}]
"""


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    project = make_project(tmp_path_factory.mktemp("io_methods") / "proj", PIPELINE)
    run = project.doit()
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    return project


def test_each_method_is_lowered_into_one_program_and_validated(built):
    from executorch.runtime import Runtime

    reports = [json.loads(p.read_text()) for p in built.root.rglob("numerics.json")]
    assert sorted((r["cell"]["backend"], r["cell"]["quantization"]) for r in reports) == [
        ("portable", "fp32"),
        ("xnnpack", "8da8w"),
        ("xnnpack", "fp32"),
    ]
    for report in reports:
        assert report["passed"] and report["methods"] == ["encode", "decode"]
        assert [(o["method"], o["shape"]) for o in report["outputs"]] == [("encode", [1, 16]), ("decode", [1, 4, 20])]
    pte = built.out / "seq2seq" / "seq2seq_xnnpack_fp32.pte"
    # the two methods, and etforge's metadata constant methods (etforge.program.metadata)
    methods = {"encode", "decode", "etforge_meta_json", "etforge_meta_version"}
    assert set(Runtime.get().load_program(pte.read_bytes()).method_names) == methods
    quantized = built.out / "seq2seq" / "seq2seq_xnnpack_8da8w.pte"
    assert set(Runtime.get().load_program(quantized.read_bytes()).method_names) == methods
    assert quantized.stat().st_size < pte.stat().st_size  # one int8 copy of the shared weights


def test_each_method_is_benchmarked(built):
    benches = [json.loads(p.read_text()) for p in built.root.rglob("bench.json")]
    assert len(benches) == 3
    for bench in benches:
        assert bench["options"]["method"] == "encode" and bench["latency_ms"]["p50"] > 0
        assert set(bench["per_method"]) == {"decode"} and bench["per_method"]["decode"]["latency_ms"]["p50"] > 0


def test_plan_rejects_what_several_methods_cannot_do_yet_and_bad_declarations(tmp_path, monkeypatch):
    from etforge.config.resolve import resolve
    from etforge.core.errors import PipelineError

    project = make_project(tmp_path / "proj", PIPELINE)
    plan = resolve(project.pipeline)
    assert sorted(c.name for c in plan.cells) == [
        "seq2seq/portable/fp32",
        "seq2seq/xnnpack/8da8w",
        "seq2seq/xnnpack/fp32",
    ]
    assert all("several methods are not calibrated yet" in r.reason for r in plan.rejected if "int8" in r.name)
    spec = plan.models["seq2seq"]
    assert spec.method_names == ("encode", "decode") and [i.name for i in spec.inputs] == ["x"]
    monkeypatch.chdir(project.root)
    project.write_pipeline(PIPELINE.replace("    methods:", "    inputs: [{shape: [1, 2]}]\n    methods:"))
    with pytest.raises(PipelineError, match=r"^pipeline\.yaml:4: models\.seq2seq: declare either 'inputs'.*not both"):
        resolve(project.pipeline)
    project.write_pipeline(PIPELINE.replace("encode: {inputs:", "encode: {input:"))
    with pytest.raises(
        PipelineError,
        match=r"^pipeline\.yaml:7: models\.seq2seq\.methods\.encode\.input: unknown key 'input'; did you mean 'inputs'",
    ):
        resolve(project.pipeline)


def test_manifests_list_methods_and_their_io(built):
    run = built.doit("manifest")
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    index = json.loads((built.out / "manifests" / "index.json").read_text())
    entry = next(e for e in index["models"] if e["backend"] == "xnnpack")
    assert [m["name"] for m in entry["methods"]] == ["encode", "decode"]
    encode, decode = entry["methods"]
    assert [(i["name"], i["dtype"]) for i in decode["inputs"]] == [("ids", "int64"), ("memory", "float32")]
    assert decode["inputs"][0]["range"] == [0, 20]
    assert decode["outputs"] == [{"name": "output_0", "path": "", "shape": [1, 4, 20], "dtype": "float32"}]
    assert encode["outputs"][0]["shape"] == [1, 16]


def test_a_bundled_program_carries_one_verified_suite_per_method(built, tmp_path, monkeypatch):
    """What an on-device cell of a multi-method model ships: each method's samples and eager outputs,
    checked here in the host runtime (the xnnpack program stands in for one this host cannot run)."""
    from etforge.builders.numerics.bundle import build_bundled, verify_bundled
    from etforge.config.resolve import resolve

    monkeypatch.chdir(built.root)
    cell = next(c for c in resolve(built.pipeline).cells if c.name == "seq2seq/xnnpack/fp32")
    (reference,) = built.root.rglob("reference.npz")
    result = build_bundled(cell, built.out / "seq2seq" / "seq2seq_xnnpack_fp32.pte", reference, [], tmp_path)
    assert result.status == "not-runnable" and "over 2 methods" in result.reason
    side = json.loads(result.files["bundled.json"].read_text())
    assert set(side["methods"]) == {"encode", "decode"} and side["method"] == "encode"
    bpte = result.files["program.bpte"].read_bytes()
    for method, suite in side["methods"].items():
        assert suite["test_cases"] >= 1 and suite["atol"] > 0
        assert verify_bundled(bpte, suite["rtol"], suite["atol"], suite["test_cases"], method) == suite["test_cases"]
    with pytest.raises(RuntimeError):  # exactly that many cases per method: one past the end does not exist
        verify_bundled(bpte, 0.0, 1.0, side["methods"]["decode"]["test_cases"] + 1, "decode")


def test_on_device_cells_of_a_multi_method_model_are_planned(tmp_path, monkeypatch):
    from etforge.config.resolve import resolve

    project = make_project(tmp_path / "proj", PIPELINE.replace("  portable: {}", "  portable: {}\n  coreml: {}"))
    assert "seq2seq/coreml/fp32" in {c.name for c in resolve(project.pipeline).cells}
