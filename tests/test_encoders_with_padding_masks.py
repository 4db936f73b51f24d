"""A BERT-like encoder (transformers feature-extraction: last_hidden_state and pooler_output) with
int64 token ids and a tokenizer-style attention mask, through capture -> quantize -> export ->
validate. One project is built once for the module: XNNPACK and portable in fp32 and PT2E static
int8 (one calibrated graph shared by both), and Core ML fp32 (a .bpte: Core ML does not run on this
host). Tiny config: 1 layer (every op of the encoder; each more layer only adds lowering time),
hidden 64, vocab 512, 16 tokens. (8da4w on this encoder: the default pipeline's
tiny_bert/xnnpack/8da4w.)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from conftest import check, make_project, state

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

CONFIG = (
    "{model_type: bert, vocab_size: 512, hidden_size: 64, num_hidden_layers: 1, num_attention_heads: 4, "
    "intermediate_size: 128, max_position_embeddings: 64}"
)
PIPELINE = f"""\
name: t
version: 0.0.1
models:
  tiny_bert:
    # default sdpa attention: XNNPACK takes 47 % of the ops but 99 % of the FLOPs the coverage gate judges
    transformers: {{task: feature-extraction, config: {CONFIG}}}
    inputs:
      - {{name: input_ids, shape: [1, 16], dtype: int64, range: [3, 512]}}
      - {{name: attention_mask, shape: [1, 16], dtype: int64, sample: attention_mask}}
backends:
  xnnpack: {{}}
  portable: {{}}
  coreml: {{}}
quantization: [fp32, int8]
targets: false  # aarch64 verdicts: tests/test_aarch64_targets.py
matrix:
  product: false
  include:
    - {{backend: xnnpack}}
    - {{backend: portable}}
    - {{backend: coreml, quantization: fp32}}
"""
CELLS = ("xnnpack/fp32", "portable/fp32", "xnnpack/int8", "portable/int8")


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    project = make_project(tmp_path_factory.mktemp("enc") / "proj", PIPELINE)
    run = project.doit("validate")
    assert run.returncode == 0, run.stdout + run.stderr
    return project


def _numerics(project, cell: str) -> dict:
    return json.loads((project.out / "tiny_bert" / f"tiny_bert_{cell.replace('/', '_')}.numerics.json").read_text())


@pytest.mark.parametrize("cell", CELLS)
def test_encoder_validates_per_output(built, cell):
    report = _numerics(built, cell)
    assert report["passed"], report["misses"]
    outputs = {o["path"]: o for o in report["outputs"]}
    assert set(outputs) == {"[0]", "[1]"}  # last_hidden_state, pooler_output: each judged
    floor = 100 if cell.endswith("fp32") else report["thresholds"]["sqnr_db"]
    assert all(o["sqnr_db"] >= floor for o in outputs.values()), outputs
    if not cell.endswith("fp32"):
        assert min(o["sqnr_db"] for o in outputs.values()) < 80  # really quantized


def test_int8_static_calibrates_the_encoder_on_valid_masks(built):
    record = state(
        built,
        "quantize:"
        + next(
            p.name.removeprefix("quantize__").removesuffix(".json").replace("__", "/")
            for p in (built.out / ".state").glob("quantize__tiny_bert__int8__*.json")
        ),
    )
    assert record["status"] == "ok", record
    assert record["info"]["calibration_samples"] == 16
    export = json.loads((built.out / "tiny_bert" / "tiny_bert_xnnpack_int8.export.json").read_text())
    fp32 = json.loads((built.out / "tiny_bert" / "tiny_bert_xnnpack_fp32.export.json").read_text())
    assert export["size_bytes"] < 0.7 * fp32["size_bytes"]


def test_coreml_encoder_ends_on_device(built):
    record = state(built, "validate:tiny_bert/coreml/fp32")
    assert record["status"] == "not-runnable", record
    assert (built.out / "tiny_bert" / "tiny_bert_coreml_fp32.bpte").is_file()
    export = json.loads((built.out / "tiny_bert" / "tiny_bert_coreml_fp32.export.json").read_text())
    assert check(export, "delegation")["delegated_subgraphs"] >= 1 and export["delegates"] == ["CoreMLBackend"]


def test_attention_mask_samples_are_prefixes_of_ones():
    import torch

    from etforge.builders.capture.samples import random_inputs
    from etforge.config.model import InputSpec

    inputs = (
        InputSpec("input_ids", (4, 16), "int64", (3, 512)),
        InputSpec("attention_mask", (4, 16), "int64", sample="attention_mask"),
    )
    batches = random_inputs(inputs, seed=0, count=8)
    lengths = set()
    for ids, mask in batches:
        assert ids.min() >= 3 and ids.max() < 512 and mask.dtype == torch.int64
        for row in mask:
            n = int(row.sum())
            assert n >= 1 and row[:n].eq(1).all() and row[n:].eq(0).all()
            lengths.add(n)
    assert len(lengths) > 4  # lengths vary across samples
    assert [m.tolist() for _, m in random_inputs(inputs, 0, 8)] == [m.tolist() for _, m in batches]


def test_attention_mask_with_a_range_is_a_file_line_error(tmp_path):
    bad = PIPELINE.replace("sample: attention_mask}", "sample: attention_mask, range: [0, 2]}")
    project = make_project(tmp_path / "p", bad)
    run = project.doit("list")
    text = run.stdout + run.stderr
    assert run.returncode != 0
    assert "pipeline.yaml:9" in text and "attention_mask input takes no range" in text, text
