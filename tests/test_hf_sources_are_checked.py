"""The ``transformers:`` model source at plan time: config typos are file:line errors, the
transformers version joins the key, LLM cells outside what etforge can build are rejected
with a reason. In-process ``resolve`` (no torch, no transformers import): milliseconds.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from etforge.config.resolve import resolve  # noqa: E402
from etforge.core.errors import PipelineError  # noqa: E402

# Line numbers matter: the typo tests point at them.
LLM = """\
name: t
models:
  tiny_llm:
    transformers:
      task: text-generation
      config:
        model_type: llama
        vocab_size: 512
        hidden_size: 64
        intermediate_size: 128
        num_hidden_layers: 2
        num_attention_heads: 4
        num_key_value_heads: 2
        max_position_embeddings: 64
        tie_word_embeddings: false
      llm: {max_context_len: 32, prompt_len: 8, decode_steps: 8}
backends:
  xnnpack: {}
  portable: {}
quantization: [fp32]
"""


@pytest.fixture(autouse=True)
def _in_project(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # errors name the file relative to the working directory


def _resolve(tmp_path: Path, text: str):
    (tmp_path / "pipeline.yaml").write_text(text)
    return resolve(tmp_path / "pipeline.yaml")


def _error(tmp_path: Path, text: str) -> str:
    with pytest.raises(PipelineError) as info:
        _resolve(tmp_path, text)
    message = str(info.value)
    assert "\n" not in message
    return message


def test_llm_source_resolves_without_importing_transformers(tmp_path):
    before = {"torch", "transformers"} & set(sys.modules)
    plan = _resolve(tmp_path, LLM)
    assert {"torch", "transformers"} & set(sys.modules) == before  # planning imports neither
    model = plan.models["tiny_llm"]
    from importlib.metadata import version

    assert model.source["packages"] == {"transformers": version("transformers")}
    assert [(i.name, i.shape, i.dtype) for i in model.inputs] == [
        ("input_ids", (1, 8), "int64"),
        ("cache_position", (8,), "int64"),
    ]
    assert [c.name for c in plan.cells] == ["tiny_llm/xnnpack/fp32", "tiny_llm/portable/fp32"]


def test_inline_config_typo_is_a_file_line_key_error(tmp_path):
    message = _error(tmp_path, LLM.replace("        hidden_size: 64", "        hiden_size: 64"))
    assert message == (
        "pipeline.yaml:9: models.tiny_llm.transformers.config.hiden_size: unknown llama "
        "config key 'hiden_size'; did you mean 'hidden_size'?"
    )


def test_a_config_that_passed_is_not_read_again_and_a_typo_is_still_an_error(tmp_path, monkeypatch):
    from etforge.config import hf_source

    _resolve(tmp_path, LLM)  # remembers that this config passed (artifacts/.etforge/digests.json)

    def refuse(*args):
        raise AssertionError("transformers' sources read again")

    monkeypatch.setattr(hf_source, "accepted_keys", refuse)
    monkeypatch.setattr(hf_source, "task_model_types", refuse)
    assert [c.name for c in _resolve(tmp_path, LLM).cells] == ["tiny_llm/xnnpack/fp32", "tiny_llm/portable/fp32"]
    monkeypatch.undo()
    for _ in range(2):  # a failure is never remembered
        message = _error(tmp_path, LLM.replace("        hidden_size: 64", "        hiden_size: 64"))
        assert message.endswith("unknown llama config key 'hiden_size'; did you mean 'hidden_size'?")


def test_config_file_typo_names_the_file_and_key(tmp_path):
    config = {"model_type": "bert", "vocab_size": 512, "hiden_size": 64}
    (tmp_path / "bert.json").write_text(json.dumps(config))
    text = (
        "name: t\nmodels:\n  enc:\n    transformers: {task: feature-extraction, config_file: bert.json}\n"
        "    inputs: [{name: input_ids, shape: [1, 16], dtype: int64}]\n"
        "backends:\n  xnnpack: {}\nquantization: [fp32]\n"
    )
    message = _error(tmp_path, text)
    assert message.startswith(
        "pipeline.yaml:4: models.enc.transformers.config_file: bert.json: unknown bert config key 'hiden_size'"
    )


def test_unknown_model_type_is_an_error(tmp_path):
    message = _error(tmp_path, LLM.replace("model_type: llama", "model_type: lama"))
    assert message == (
        "pipeline.yaml:7: models.tiny_llm.transformers.config.model_type: unknown model_type "
        "'lama'; did you mean 'llama'?"
    )


def test_llm_inputs_are_implied_and_context_checked(tmp_path):
    message = _error(tmp_path, LLM.replace("prompt_len: 8, decode_steps: 8", "prompt_len: 30, decode_steps: 8"))
    assert message.startswith("pipeline.yaml:16: models.tiny_llm.transformers.llm: prompt_len + decode_steps")
    message = _error(tmp_path, LLM.replace("max_context_len: 32", "max_context_len: 128"))
    assert "exceeds the config's max_position_embeddings 64" in message


def test_encoder_needs_inputs(tmp_path):
    text = (
        "name: t\nmodels:\n  enc:\n    transformers: {task: text-classification, "
        "config: {model_type: bert, num_labels: 3}}\nbackends:\n  xnnpack: {}\nquantization: [fp32]\n"
    )
    assert _error(tmp_path, text).startswith("pipeline.yaml:3: models.enc: missing required key 'inputs'")


def test_llm_cells_outside_the_llm_path_are_rejected_at_plan_time(tmp_path):
    plan = _resolve(
        tmp_path, LLM.replace("  portable: {}\n", "  portable: {}\n  coreml: {}\n").replace("[fp32]", "[fp32, int8]")
    )
    reasons = {r.name: r.reason for r in plan.rejected}
    assert "static shapes" in reasons["tiny_llm/coreml/fp32"]  # a dynamic LLM; static ones build (test_llm_schemes)
    assert "not 'int8'" in reasons["tiny_llm/xnnpack/int8"]
    assert {c.name for c in plan.cells} == {"tiny_llm/xnnpack/fp32", "tiny_llm/portable/fp32"}


def test_checkpoint_digest_mismatch_is_an_error(tmp_path):
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "model.safetensors").write_bytes(b"x")
    text = LLM.replace("      llm:", "      checkpoint: {path: ckpt, sha256: '" + "0" * 64 + "'}\n      llm:")
    message = _error(tmp_path, text)
    assert message.startswith(
        "pipeline.yaml:16: models.tiny_llm.transformers.checkpoint.sha256: checkpoint directory sha256 is "
    )


def test_a_scheme_llm_cells_do_not_take_is_rejected_at_plan_time(tmp_path):
    text = LLM.replace(
        "backends:", "  linreg:\n    python: models.linreg:build\n    inputs: [{shape: [1, 4]}]\nbackends:"
    )
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "linreg.py").write_text("def build():\n    pass\n")
    plan = _resolve(tmp_path, text.replace("[fp32]", "[fp32, int8, 8da4w]"))
    reasons = {r.name: r.reason for r in plan.rejected}
    assert reasons["tiny_llm/xnnpack/int8"] == "LLM cells on xnnpack take 8da4w, 8da8w, fp16, fp32 here, not 'int8'"
    assert {"tiny_llm/xnnpack/8da4w", "linreg/xnnpack/int8", "linreg/xnnpack/8da4w"} <= {c.name for c in plan.cells}
