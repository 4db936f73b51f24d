"""Validation data per method and per named shape (etforge.config.validation_data), planned in-process.

A multi-method model, a model with dynamic dims and an encoder-decoder take ``validation: {methods:}`` and
``{shapes:}``; every mistake is one line naming the file, line and key; a data file joins exactly its own
model's keys; a cell validated on such data is ``ok`` and a provisional one names the form its model takes.
"""

from __future__ import annotations

import math
import re

import numpy as np
import pytest

from etforge.builders.seq2seq.numerics import merge_samples
from etforge.cache.records import write_state
from etforge.checks.numerics import Numerics
from etforge.core.errors import PipelineError
from etforge.pipeline.results import TaskStatus
from etforge.pipeline.specs import cell_specs, spec_of
from etforge.pipeline.stage_results import CaptureResult, ExportResult, Verdict
from etforge.publish.outcome import CellState, cell_outcome
from unit.support import HOST, changed_keys, make_unit_project, task_keys

PIPELINE = """\
name: t
version: 0.0.1
models:
  enc:
    python: models.enc:build
    methods:
      encode: {inputs: [{name: x, shape: [1, 8, 16]}]}
      decode: {inputs: [{name: ids, shape: [1, 4], dtype: int64, range: [0, 20]}, {name: memory, shape: [1, 16]}]}
    validation: {methods: {encode: {npz: data/enc.npz}, decode: {npz: data/dec.npz, samples: 2}}}
  seq:
    python: models.seq:build
    inputs:
      - {name: ids, shape: [1, {min: 1, max: 64, name: seq}], dtype: int64, range: [0, 50]}
      - {name: x, shape: [1, {min: 1, max: 64, name: seq}, 16]}
    validation: {shapes: {short: {npz: data/seq8.npz}, long: {npz: data/seq40.npz}}}
  a:
    python: models.a:build
    inputs: [{name: x, shape: [1, 4]}]
backends:
  xnnpack: {}
quantization: [fp32]
targets: false
"""
SEQ2SEQ = """\
  t5:
    transformers:
      task: text2text-generation
      config: {model_type: t5, vocab_size: 256, d_model: 32, d_kv: 16, d_ff: 64, num_layers: 1, num_heads: 2}
      seq2seq: {max_cache_len: 16, decode_steps: 6, encoder_len: 12}
    validation: {methods: {encoder: {npz: data/t5.npz}}}
"""
RNG = np.random.default_rng(0)


def floats(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def ids(*shape, hi=20):
    return RNG.integers(0, hi, shape)


@pytest.fixture
def project(tmp_path):
    project = make_unit_project(tmp_path / "proj", PIPELINE, models=("enc", "seq", "a"))
    (project.root / "data").mkdir()
    save(project, "enc.npz", x=floats(3, 1, 8, 16))
    save(project, "dec.npz", ids=ids(3, 1, 4), memory=floats(3, 1, 16))
    save(project, "seq8.npz", ids=ids(2, 1, 8, hi=50), x=floats(2, 1, 8, 16))
    save(project, "seq40.npz", ids=ids(2, 40, hi=50), x=floats(2, 40, 16))  # the leading batch axis of 1 left out
    save(project, "t5.npz", input_ids=ids(3, 1, 12, hi=256))
    return project


def save(project, name: str, **arrays) -> None:
    tmp = project.root / "data" / f"new_{name}"  # a new inode: an edit is never hidden by the digest memo
    np.savez(tmp, **arrays)
    tmp.replace(project.root / "data" / name)


def plan_error(project) -> str:
    with pytest.raises(PipelineError) as caught:
        project.plan()
    text = str(caught.value)
    assert "\n" not in text
    return text


def line_of(project, text: str) -> int:
    return next(n for n, line in enumerate(project.pipeline.read_text().splitlines(), 1) if text in line)


def test_each_method_and_each_shape_is_resolved_with_its_digest(project):
    plan = project.plan()
    methods = plan.models["enc"].validation["methods"]
    assert list(methods) == ["encode", "decode"] and methods["decode"]["samples"] == 2
    assert all(re.fullmatch("[0-9a-f]{64}", m["sha256"]) for m in methods.values())
    shapes = plan.models["seq"].validation["shapes"]
    assert [(name, s["npz"], s["dims"]) for name, s in shapes.items()] == [
        ("short", "data/seq8.npz", {"seq": 8}),
        ("long", "data/seq40.npz", {"seq": 40}),
    ]


@pytest.mark.parametrize(
    "old, new, where, message",
    [
        (
            "decode: {npz: data/dec.npz, samples: 2}}",
            "decode: {npz: data/dec.npz}, extra: {npz: data/dec.npz}}",
            ("validation:", "enc.validation.methods.extra"),
            "the model has no method 'extra' (its methods: encode, decode)",
        ),
        (
            ", decode: {npz: data/dec.npz, samples: 2}}",
            "}",
            ("validation:", "enc.validation.methods"),
            "method 'decode' has no data: give an entry for each of encode, decode",
        ),
        (
            "{npz: data/dec.npz, samples: 2}",
            "{npz: data/enc.npz}",
            ("validation:", "enc.validation.methods.decode.npz"),
            "data/enc.npz has no array 'ids' or 'input_0' (has: x)",
        ),
        (
            "validation: {methods: {encode: {npz: data/enc.npz}, decode: {npz: data/dec.npz, samples: 2}}}",
            "validation: {npz: data/enc.npz}",
            ("validation: {npz: data/enc", "enc.validation.npz"),
            "a model with several methods (encode, decode) takes data per method: "
            "validation: {methods: {encode: {npz: ...}, decode: {npz: ...}}}",
        ),
        (
            "long: {npz: data/seq40.npz}",
            "long: {npz: data/seq80.npz}",
            ("long: {npz", "seq.validation.shapes.long.npz"),
            "data/seq80.npz input ids axis 1 is 80, outside dim 'seq' 1..64",
        ),
        (
            "long: {npz: data/seq40.npz}",
            "long: {npz: data/wide.npz}",
            ("long: {npz", "seq.validation.shapes.long.npz"),
            "data/wide.npz input x axis 2 is 12, the model declares 16",
        ),
        (
            "long: {npz: data/seq40.npz}",
            "long: {npz: data/apart.npz}",
            ("long: {npz", "seq.validation.shapes.long.npz"),
            "data/apart.npz input x axis 1 is 9 where input ids axis 1 is 8: both are dim 'seq', one size per file",
        ),
        (
            "validation: {shapes: {short: {npz: data/seq8.npz}, long: {npz: data/seq40.npz}}}",
            "validation: {npz: data/seq8.npz}",
            ("validation: {npz: data/seq8", "seq.validation.npz"),
            "inputs with dynamic dims (seq 1..64) take one npz per named shape",
        ),
        (
            "    inputs: [{name: x, shape: [1, 4]}]\n",
            "    inputs: [{name: x, shape: [1, 4]}]\n    validation: {shapes: {one: {npz: data/seq8.npz}}}\n",
            ("shapes: {one:", "a.validation.shapes"),
            "the inputs have no dynamic dims: give one file (npz: ...) instead of named shapes",
        ),
        (
            "    inputs: [{name: x, shape: [1, 4]}]\n",
            "    inputs: [{name: x, shape: [1, 4]}]\n    validation: {methods: {forward: {npz: data/enc.npz}}}\n",
            ("methods: {forward:", "a.validation.methods"),
            "the model has one method (forward): give its data without 'methods' (validation: {npz: ...})",
        ),
        (
            "validation: {methods: {encode: {npz: data/enc.npz}, decode: {npz: data/dec.npz, samples: 2}}}",
            "validation: {methods: {encode: {npz: data/enc.npz}, decode: {npz: data/dec.npz}}, labels: y}",
            ("labels: y", "enc.validation.labels"),
            "'labels' takes single-method data of static shape (validation: {npz: ...}); not with 'methods'",
        ),
        (
            "    validation: {shapes:",
            "    calibration: {methods: {encode: {npz: data/enc.npz}}}\n    validation: {shapes:",
            ("calibration:", "seq.calibration.methods"),
            "'methods' is validation data only; calibration takes 'npz' or 'images'",
        ),
        (
            "    validation: {methods: {encoder: {npz: data/t5.npz}}}",
            "    validation: {methods: {encoder: {npz: data/t5.npz}, text_decoder: {npz: data/dec.npz}}}",
            ("text_decoder: {npz", "t5.validation.methods.text_decoder"),
            "an encoder-decoder's text_decoder is driven step by step from the start token on the encoder's "
            "output and takes no data: give data for encoder only",
        ),
    ],
    ids=[
        "undeclared-method",
        "missing-method",
        "arrays-missing-an-input",
        "npz-on-several-methods",
        "dim-out-of-range",
        "static-axis",
        "shared-dim",
        "npz-on-dynamic",
        "shapes-on-static",
        "methods-on-one-method",
        "labels-with-methods",
        "methods-under-calibration",
        "seq2seq-decoder",
    ],
)
def test_a_mistake_is_one_line_naming_file_line_and_key(project, old, new, where, message):
    save(project, "seq80.npz", ids=ids(2, 1, 80, hi=50), x=floats(2, 1, 80, 16))
    save(project, "wide.npz", ids=ids(2, 1, 8, hi=50), x=floats(2, 1, 8, 12))
    save(project, "apart.npz", ids=ids(2, 1, 8, hi=50), x=floats(2, 1, 9, 16))
    project.write_pipeline(PIPELINE.replace("backends:", SEQ2SEQ + "backends:"))
    project.edit_pipeline(old, new)
    text, key = where
    expected = f"{project.pipeline}:{line_of(project, text)}: models.{key}: {message}"
    assert plan_error(project).startswith(expected)


def test_a_method_file_joins_exactly_its_models_keys(project):
    before = task_keys(project.plan())
    save(project, "dec.npz", ids=ids(3, 1, 4), memory=floats(3, 1, 16))
    changed = changed_keys(before, task_keys(project.plan()))
    # the capture holds the reference (and every task of the model reads the capture): that model only
    assert changed == {n for n in before if n.split(":")[1].split("/")[0] == "enc"}
    assert {"capture:enc", "validate:enc/xnnpack/fp32"} <= changed
    before = task_keys(project.plan())
    save(project, "seq40.npz", ids=ids(2, 40, hi=50), x=floats(2, 40, 16))
    assert changed_keys(before, task_keys(project.plan())) == {n for n in before if n.split(":")[1].startswith("seq")}


# ---------------------------------------------------------------- the outcome


def write(plan, stage: str, cell, info: dict) -> None:
    spec = spec_of(plan, stage, cell, HOST)
    write_state(spec, TaskStatus.OK, key=None, info=info, reason="", log=spec.log_file)


@pytest.mark.parametrize(
    "model, hint",
    [
        ("enc", "(name data per method under models.enc.validation.methods in pipeline.yaml)"),
        ("seq", "(name one npz per shape under models.seq.validation.shapes in pipeline.yaml)"),
        ("t5", "(name the encoder's data under models.t5.validation.methods.encoder in pipeline.yaml)"),
    ],
)
def test_random_inputs_name_the_form_the_model_takes_and_data_make_the_cell_ok(project, model, hint):
    project.write_pipeline(PIPELINE.replace("backends:", SEQ2SEQ + "backends:"))
    plan = project.plan()
    cell = next(c for c in plan.cells if c.model.name == model)
    assert [s.name.split(":")[0] for s in cell_specs(plan, cell, HOST)][:3] == ["capture", "export", "validate"]
    sha = "ab" * 32
    write(plan, "capture", cell, CaptureResult(inputs="random (seeded)").to_json())
    write(plan, "export", cell, ExportResult(sha256=sha, size_bytes=10).to_json())

    def validated(inputs: str):
        check = Numerics.of({"inputs": inputs, "samples": 4, "sqnr_db": 120.0, "passed": True})
        write(plan, "validate", cell, Verdict(program_sha256=sha, checks=(check,)).to_json())
        return cell_outcome(plan, cell, HOST)

    provisional = validated("random (seeded)")
    assert provisional.status == CellState.PROVISIONAL
    assert f"validated on seeded random inputs only {hint}" in provisional.reason
    real = validated("shapes short: npz data/seq8.npz (2 samples), long: npz data/seq40.npz (2 samples)")
    assert real.status == CellState.OK


# ---------------------------------------------------------------- several samples of an encoder-decoder


def sample(sqnr: float, top1: list, greedy: float, same: float | None = None) -> dict:
    out = {
        "sqnr_db": sqnr,
        "encoder_sqnr_db": 130.0,
        "cosine": 1.0,
        "max_abs_error": 1e-6,
        "top1_steps": top1,
        "top1_agreement": sum(top1) / len(top1),
        "greedy_agreement": greedy,
        "decode_steps": len(top1),
        "start_token": 0,
        "nonfinite": {"nan": 0, "inf": 0, "values": 10},
    }
    if same is not None:
        out["same_scheme"] = {"sqnr_db": same, "top1_agreement": 1.0}
    return out


def test_several_samples_judge_the_worst_sqnr_and_pool_the_steps():
    one = sample(40.0, [True, True, True, True], 1.0)
    assert merge_samples([one]) is one  # one sample: its figures, as before
    merged = merge_samples([one, sample(25.0, [True, False, False, True], 0.25, 30.0), sample(50.0, [True] * 4, 1.0)])
    assert (merged["sqnr_db"], merged["top1_agreement"], merged["greedy_agreement"]) == (25.0, 10 / 12, 0.75)
    assert merged["nonfinite"]["values"] == 30 and len(merged["samples"]) == 3
    nan = merge_samples([sample(math.nan, [True], 1.0), sample(90.0, [True], 1.0)])
    assert math.isnan(nan["sqnr_db"])  # a NaN in any sample is the worst, whatever the order
