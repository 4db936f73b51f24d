"""Stream IO, point 5: several methods in one program (encode and decode), each validated and
benchmarked; quantized and on-device cells of such a model are rejected at plan time."""

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
quantization: [fp32, int8]
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
    assert sorted(r["cell"]["backend"] for r in reports) == ["portable", "xnnpack"]
    for report in reports:
        assert report["passed"] and report["methods"] == ["encode", "decode"]
        assert [(o["method"], o["shape"]) for o in report["outputs"]] == [("encode", [1, 16]), ("decode", [1, 4, 20])]
    pte = built.out / "seq2seq" / "seq2seq_xnnpack_fp32.pte"
    # the two methods, and etforge's metadata constant methods (tasks/store/program_meta.py)
    assert set(Runtime.get().load_program(pte.read_bytes()).method_names) == {
        "encode", "decode", "etforge_meta_json", "etforge_meta_version"}


def test_each_method_is_benchmarked(built):
    benches = [json.loads(p.read_text()) for p in built.root.rglob("bench.json")]
    assert len(benches) == 2
    for bench in benches:
        assert bench["options"]["method"] == "encode" and bench["latency_ms"]["p50"] > 0
        assert set(bench["per_method"]) == {"decode"} and bench["per_method"]["decode"]["latency_ms"]["p50"] > 0


def test_plan_rejects_what_several_methods_cannot_do_yet_and_bad_declarations(tmp_path, monkeypatch):
    from tasks.config.resolve import resolve
    from tasks.core.errors import PipelineError

    project = make_project(tmp_path / "proj", PIPELINE)
    plan = resolve(project.pipeline)
    assert sorted(c.name for c in plan.cells) == ["seq2seq/portable/fp32", "seq2seq/xnnpack/fp32"]
    assert all("fp32 only" in r.reason for r in plan.rejected)
    spec = plan.models["seq2seq"]
    assert spec.method_names == ("encode", "decode") and [i.name for i in spec.inputs] == ["x"]
    monkeypatch.chdir(project.root)
    project.write_pipeline(PIPELINE.replace("    methods:", "    inputs: [{shape: [1, 2]}]\n    methods:"))
    with pytest.raises(PipelineError, match=r"^pipeline\.yaml:4: models\.seq2seq: declare either 'inputs'.*not both"):
        resolve(project.pipeline)
    project.write_pipeline(PIPELINE.replace("encode: {inputs:", "encode: {input:"))
    with pytest.raises(PipelineError, match=r"^pipeline\.yaml:7: models\.seq2seq\.methods\.encode\.input: unknown key 'input'; did you mean 'inputs'"):
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
