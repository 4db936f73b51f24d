"""Validation data per method and per named shape make multi-method, dynamic-shape and encoder-decoder
cells ``ok`` (etforge.config.validation_data; docs/models.md "Validation and calibration data").

One project, built once for the module in one process (``doit validate``: captures, XNNPACK fp32
exports, validations): the two-method encoder_decoder with an npz per method, token_seq (one dynamic
dim) with an npz per named shape, and a tiny random Whisper with an npz of encoder features. The
plan-time errors are unit tests (tests/unit/test_unit_validation_data.py).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import TINY_WHISPER_CONFIG, make_project, state

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

PIPELINE = f"""\
name: t
version: 0.0.1
models:
  encdec:
    python: models.encoder_decoder:build
    methods:
      encode: {{inputs: [{{name: x, shape: [1, 8, 16]}}]}}
      decode: {{inputs: [{{name: ids, shape: [1, 4], dtype: int64, range: [0, 20]}}, {{name: memory, shape: [1, 16]}}]}}
    validation:
      methods:
        encode: {{npz: data/enc.npz}}
        decode: {{npz: data/dec.npz, samples: 2}}
  seq:
    python: models.token_seq:build
    inputs:
      - {{name: ids, shape: [1, {{min: 1, max: 64, name: seq}}], dtype: int64, range: [0, 50]}}
      - {{name: x, shape: [1, {{min: 1, max: 64, name: seq}}, 16]}}
    validation:
      shapes:
        one: {{npz: data/seq1.npz}}     # first and most: the middle sample is at size 1
        short: {{npz: data/seq8.npz}}
        long: {{npz: data/seq40.npz}}
    thresholds: {{int8: {{sqnr_db: 10}}}}  # static int8 on random ids and features: 13.8 dB worst measured
  whisper:
    transformers:
      task: automatic-speech-recognition
      config: {TINY_WHISPER_CONFIG}
      seq2seq: {{max_cache_len: 16, decode_steps: 6}}
    validation: {{methods: {{encoder: {{npz: data/features.npz}}}}}}
backends:
  xnnpack: {{}}
quantization: [fp32, int8]
matrix:
  product: false
  include:
    - {{quantization: fp32}}
    - {{model: seq, quantization: int8}}   # exported from a sample whose dynamic size is above 1
targets: false  # aarch64 verdicts: tests/test_aarch64_targets.py
"""


def write_data(root: Path, seed: int = 0) -> None:
    """The npz files of PIPELINE: samples along the first axis, each shaped like its input (the seq40 file
    leaves out the leading batch axis of 1)."""
    rng = np.random.default_rng(seed)
    data = root / "data"
    data.mkdir(exist_ok=True)
    np.savez(data / "enc.npz", x=rng.standard_normal((3, 1, 8, 16)).astype(np.float32))
    np.savez(
        data / "dec.npz", ids=rng.integers(0, 20, (3, 1, 4)), memory=rng.standard_normal((3, 1, 16)).astype(np.float32)
    )
    np.savez(
        data / "seq1.npz", ids=rng.integers(0, 50, (5, 1, 1)), x=rng.standard_normal((5, 1, 1, 16)).astype(np.float32)
    )
    np.savez(
        data / "seq8.npz", ids=rng.integers(0, 50, (2, 1, 8)), x=rng.standard_normal((2, 1, 8, 16)).astype(np.float32)
    )
    np.savez(
        data / "seq40.npz", ids=rng.integers(0, 50, (2, 40)), x=rng.standard_normal((2, 40, 16)).astype(np.float32)
    )
    np.savez(data / "features.npz", input_features=rng.standard_normal((2, 1, 16, 32)).astype(np.float32))


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    project = make_project(tmp_path_factory.mktemp("validation_data") / "proj", PIPELINE)
    write_data(project.root)
    run = project.doit("validate")  # one process: a worker would import torch and transformers again
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    return project


def numerics(project, cell: str) -> dict:
    return json.loads((project.out / cell.split("/")[0] / (cell.replace("/", "_") + ".numerics.json")).read_text())


def summary(project) -> dict:
    return {r["cell"]: r for r in json.loads((project.out / "summary.json").read_text())}


def test_cells_validated_on_data_per_method_and_per_shape_are_ok(built):
    cells = summary(built)
    assert {c: r["status"] for c, r in cells.items()} == {
        "encdec/xnnpack/fp32": "ok",
        "seq/xnnpack/fp32": "ok",
        "seq/xnnpack/int8": "ok",
        "whisper/xnnpack/fp32": "ok",
    }
    assert not any("random inputs" in r["note"] for r in cells.values())


def test_each_method_is_judged_on_its_own_file(built):
    report = numerics(built, "encdec/xnnpack/fp32")
    assert report["inputs"] == "decode: npz data/dec.npz; encode: npz data/enc.npz"
    assert report["samples"] == {"encode": 3, "decode": 2}  # decode's file capped at samples: 2
    assert report["passed"] and {o["method"] for o in report["outputs"]} == {"encode", "decode"}


def test_the_samples_of_every_shape_in_order_each_judged_at_its_size(built):
    from etforge.builders.capture.reference import load_reference_samples

    report = numerics(built, "seq/xnnpack/fp32")
    assert report["inputs"] == (
        "shapes one: npz data/seq1.npz (5 samples), short: npz data/seq8.npz (2 samples), "
        "long: npz data/seq40.npz (2 samples)"
    )
    assert report["samples"] == 9 and report["passed"]
    sizes = [(o["sample"], o["input_shapes"], o["shape"]) for o in report["outputs"]][::2]  # two outputs per sample
    assert sizes == [(n, [[1, 1], [1, 1, 16]], "one") for n in range(5)] + [
        (5, [[1, 8], [1, 8, 16]], "short"),
        (6, [[1, 8], [1, 8, 16]], "short"),
        (7, [[1, 40], [1, 40, 16]], "long"),
        (8, [[1, 40], [1, 40, 16]], "long"),
    ]
    key = state(built, "capture:seq")["key"]
    ref = load_reference_samples(built.out.parent / "cache" / key[:2] / key / "reference.npz")
    assert ref.shapes == ["one"] * 5 + ["short", "short", "long", "long"]
    with np.load(built.root / "data" / "seq40.npz") as data:  # the file's own values, batch axis put back
        assert np.array_equal(ref.sample_inputs(8)[1], data["x"][1][None])


def test_an_encoder_decoder_runs_each_encoder_sample_then_its_decoder_step_by_step(built):
    report = numerics(built, "whisper/xnnpack/fp32")
    assert report["inputs"] == "encoder: npz data/features.npz (seq2seq)" and report["samples"] == 2
    steps = report["seq2seq"]
    assert steps["greedy_agreement"] == 1.0 and steps["top1_agreement"] == 1.0 and steps["sqnr_db"] > 60
    assert all(s["program_tokens"] == s["eager_tokens"] for s in steps["samples"]) and len(steps["samples"]) == 2
    key = state(built, "capture:whisper")["key"]
    with np.load(built.out.parent / "cache" / key[:2] / key / "reference.npz") as ref:
        with np.load(built.root / "data" / "features.npz") as data:
            assert np.array_equal(ref["s2s_input"], data["input_features"])  # the file's samples, in order
        # each sample drove its own decoder steps (a tiny random Whisper barely listens: same tokens, other logits)
        assert ref["s2s_logits"].shape[0] == 2 and not np.array_equal(ref["s2s_logits"][0], ref["s2s_logits"][1])


def test_a_changed_method_file_rebuilds_that_model_only(built, tmp_path):
    from conftest import copy_project

    project = copy_project(built, tmp_path / "copy")
    rng = np.random.default_rng(7)
    np.savez(
        project.root / "data" / "dec.npz",
        ids=rng.integers(0, 20, (3, 1, 4)),
        memory=rng.standard_normal((3, 1, 16)).astype(np.float32),
    )
    run = project.doit("validate")
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    # the capture holds the reference its export and validation read: that model's chain, nothing else
    assert run.started == {"capture:encdec", "export:encdec/xnnpack/fp32", "validate:encdec/xnnpack/fp32"}
    assert summary(project)["encdec/xnnpack/fp32"]["status"] == "ok"
