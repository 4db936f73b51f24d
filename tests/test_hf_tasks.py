"""Hugging Face tasks beyond text: image-classification, fill-mask and object-detection, each from a
tiny config with random weights, exported, lowered to XNNPACK fp32 and validated output by output.

One project is built once for the module (3 cells). The plan-time tests resolve in-process (no
torch): an unknown task, a config key the task's model class does not take, and a model_type
(or a checkpoint's config.json) the task's Auto class has no class for are one line each.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from conftest import make_project

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from etforge.config.resolve import resolve  # noqa: E402
from etforge.core.errors import PipelineError  # noqa: E402

VIT = (
    "{model_type: vit, hidden_size: 32, num_hidden_layers: 1, num_attention_heads: 2, intermediate_size: 64, "
    "image_size: 32, patch_size: 8, num_labels: 3}"
)
BERT = (
    "{model_type: bert, vocab_size: 512, hidden_size: 32, num_hidden_layers: 1, num_attention_heads: 2, "
    "intermediate_size: 64, max_position_embeddings: 64}"
)
DETR = (
    "{model_type: detr, d_model: 32, encoder_layers: 1, decoder_layers: 1, encoder_attention_heads: 2, "
    "decoder_attention_heads: 2, encoder_ffn_dim: 64, decoder_ffn_dim: 64, num_queries: 10, num_labels: 3, "
    "backbone_config: {model_type: resnet, embedding_size: 16, hidden_sizes: [16, 32], depths: [1, 1], "
    "layer_type: basic, out_features: [stage2]}}"
)
PIPELINE = f"""\
name: t
version: 0.0.1
models:
  vit:
    transformers: {{task: image-classification, config: {VIT}}}
    inputs: [{{name: pixel_values, shape: [1, 3, 32, 32]}}]
  bert_mlm:
    transformers: {{task: fill-mask, config: {BERT}}}
    inputs:
      - {{name: input_ids, shape: [1, 12], dtype: int64, range: [3, 512]}}
      - {{name: attention_mask, shape: [1, 12], dtype: int64, sample: attention_mask}}
  detr:
    transformers: {{task: object-detection, config: {DETR}}}
    inputs: [{{name: pixel_values, shape: [1, 3, 64, 64]}}]
backends:
  xnnpack: {{}}
quantization: [fp32]
targets: false  # aarch64 verdicts: tests/test_aarch64_targets.py
"""


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    project = make_project(tmp_path_factory.mktemp("hftasks") / "proj", PIPELINE)
    run = project.doit("validate")  # one process: a worker would import torch and transformers again
    assert run.returncode == 0, run.stdout + run.stderr
    return project


@pytest.mark.parametrize(
    "model, outputs",
    [
        ("vit", {"['logits']": [1, 3]}),
        ("bert_mlm", {"['logits']": [1, 12, 512]}),  # a score per position over the vocabulary
        (
            "detr",
            {
                "['logits']": [1, 10, 4],  # 3 labels + no-object per query
                "['pred_boxes']": [1, 10, 4],
                "['last_hidden_state']": [1, 10, 32],
                "['encoder_last_hidden_state']": [1, 64, 32],
            },
        ),
    ],
)
def test_task_validates_every_output_by_name(built, model, outputs):
    report = json.loads((built.out / model / f"{model}_xnnpack_fp32.numerics.json").read_text())
    assert report["passed"], report["misses"]
    assert {o["path"]: o["shape"] for o in report["outputs"]} == outputs
    assert all(o["sqnr_db"] > 60 for o in report["outputs"]), report["outputs"]


def _error(tmp_path: Path, text: str) -> str:
    (tmp_path / "pipeline.yaml").write_text(text)
    with pytest.raises(PipelineError) as info:
        resolve(tmp_path / "pipeline.yaml")
    message = str(info.value).strip()
    assert "\n" not in message
    return message


def test_unknown_task_names_the_supported_ones(tmp_path):
    line = _error(tmp_path, PIPELINE.replace("task: fill-mask", "task: fill-masks"))
    assert ":8: models.bert_mlm.transformers.task:" in line
    for task in ("image-classification", "fill-mask", "object-detection", "text-generation"):
        assert task in line


def test_model_type_the_task_has_no_class_for(tmp_path):
    line = _error(tmp_path, PIPELINE.replace("task: image-classification", "task: fill-mask"))
    assert ":5: models.vit.transformers.task: AutoModelForMaskedLM (task 'fill-mask') has no class" in line
    assert "model_type 'vit'" in line and "bert" in line


def test_checkpoint_of_another_task_is_refused(tmp_path):
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "config.json").write_text(json.dumps({"model_type": "llama", "vocab_size": 512}))
    import hashlib

    from etforge.config.hf_source import checkpoint_digest

    sha = checkpoint_digest({"config.json": hashlib.sha256((ckpt / "config.json").read_bytes()).hexdigest()})
    text = PIPELINE.replace(
        f"transformers: {{task: image-classification, config: {VIT}}}",
        f"transformers: {{task: image-classification, checkpoint: {{path: ckpt, sha256: '{sha}'}}}}",
    )
    line = _error(tmp_path, text)
    assert "AutoModelForImageClassification (task 'image-classification') has no class for model_type 'llama'" in line
    assert "vit" in line


def test_config_key_the_class_does_not_take(tmp_path):
    line = _error(tmp_path, PIPELINE.replace("patch_size: 8", "patch_sise: 8"))
    assert "unknown vit config key 'patch_sise'; did you mean 'patch_size'?" in line
