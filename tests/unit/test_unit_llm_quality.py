"""Perplexity and KL of an LLM cell (etforge.builders.llm.quality), its check and the token file's
or text's one-line errors (etforge.config.llm_tokens), in-process: no torch, no model run."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from etforge.builders.llm.quality import kl_per_position, perplexity, quality, quality_misses
from etforge.checks.llm_quality import LlmQuality
from etforge.checks.table import CHECKS
from etforge.config.resolve import resolve
from etforge.core.errors import EtforgeError
from tests.unit.support import make_unit_project, word_tokenizer_json

V = 64


def test_kl_of_identical_distributions_is_zero_and_grows_with_a_change():
    logits = np.random.default_rng(0).standard_normal((5, V)) * 3
    assert np.allclose(kl_per_position(logits, logits), 0.0, atol=1e-12)
    other = logits + np.random.default_rng(1).standard_normal((5, V))
    assert (kl_per_position(logits, other) > 1e-3).all()


def test_perplexity_of_a_uniform_distribution_is_the_vocabulary_size():
    assert perplexity(np.zeros((7, V)), np.arange(7)) == pytest.approx(V)
    confident = np.full((3, V), -50.0)
    confident[np.arange(3), [4, 5, 6]] = 50.0
    assert perplexity(confident, [4, 5, 6]) == pytest.approx(1.0)


def test_large_logits_do_not_overflow():
    logits = np.array([[1e4, 0.0, -1e4]])
    assert perplexity(logits, [0]) == pytest.approx(1.0)  # exp() of 1e4 would overflow without the shift
    assert math.isfinite(float(kl_per_position(logits, logits * 0.5)[0]))


def test_gates_fail_on_the_figure_with_both_numbers_and_on_nan():
    eager = np.random.default_rng(2).standard_normal((9, V))
    program = eager + np.random.default_rng(3).standard_normal((9, V))
    figures = quality(eager, program, np.arange(9))
    assert figures["ppl_ratio"] != 1.0 and figures["kl_p99"] >= figures["kl_mean"] > 0
    (miss,) = quality_misses(figures, {"max_kl": 1e-6, "max_ppl_ratio": 1e6})
    assert f"{figures['kl_mean']:.4g} > max_kl 1e-06" in miss and f"p99 {figures['kl_p99']:.4g}" in miss
    assert quality_misses(figures, {"max_kl": 10.0}) == []
    broken = quality(eager, program * np.nan, np.arange(9))
    assert len(quality_misses(broken, {"max_kl": 10.0, "max_ppl_ratio": 10.0})) == 2  # NaN meets no bound
    assert quality_misses(broken, {}) and "non-finite" in quality_misses(broken, {})[0]


def test_the_check_round_trips_through_the_table_and_says_why():
    check = LlmQuality(passed=False, ppl_ratio=1.5, kl_mean=0.2, misses=("mean KL 0.2 > max_kl 0.1",))
    parsed = CHECKS.parse(check.to_json())
    assert parsed == check and parsed.failed and parsed.reason() == "mean KL 0.2 > max_kl 0.1"
    assert parsed.text() == "1.500" and not parsed.provisional


LLM = """\
name: t
version: 0.0.1
models:
  tiny_llm:
    transformers:
      task: text-generation
      config: {model_type: llama, vocab_size: 64, hidden_size: 16, intermediate_size: 32, num_hidden_layers: 1,
               num_attention_heads: 2, num_key_value_heads: 1, max_position_embeddings: 32}
      llm: {max_context_len: 16, prompt_len: 4, decode_steps: 4}
    validation: {tokens: data/tokens.npz}
backends:
  xnnpack: {}
quantization: [fp32]
targets: false
"""


@pytest.mark.parametrize(
    "ids, message",
    [
        (np.arange(3, 10), "holds 7 token ids, too short for one window of 8"),
        (np.array([1, 2, 3, 4, 5, 6, 7, 64]), "outside the vocabulary [0, 64)"),
        (None, "token file 'data/tokens.npz' not found"),
    ],
)
def test_bad_token_files_are_one_line_errors_naming_file_line_and_key(tmp_path, ids, message):
    project = make_unit_project(tmp_path, LLM, models=())
    if ids is not None:
        (tmp_path / "data").mkdir()
        np.savez(tmp_path / "data" / "tokens.npz", ids=ids)
    with pytest.raises(EtforgeError) as raised:
        resolve(project.pipeline)
    text = str(raised.value)
    assert "\n" not in text and message in text
    assert "pipeline.yaml:10: models.tiny_llm.validation.tokens: " in text and "validation.tokens" in text, text


def test_a_good_token_file_joins_the_model_by_digest(tmp_path):
    project = make_unit_project(tmp_path, LLM, models=())
    (tmp_path / "data").mkdir()
    np.savez(tmp_path / "data" / "tokens.npz", ids=np.arange(3, 20))
    first = resolve(project.pipeline).models["tiny_llm"].validation
    np.savez(tmp_path / "data" / "tokens.npz", ids=np.arange(4, 21))
    second = resolve(project.pipeline).models["tiny_llm"].validation
    assert first["tokens"] == "data/tokens.npz" and first["sha256"] != second["sha256"]


def test_a_gate_without_a_token_file_fails_the_cell_and_no_gate_adds_no_check():
    from types import SimpleNamespace

    from etforge.builders.llm.quality import quality_check

    cell = SimpleNamespace(model=SimpleNamespace(name="tiny_llm", validation=None))
    assert quality_check(cell, None, None, {}, None, {"sqnr_db": 10}) is None
    check = quality_check(cell, None, None, {}, None, {"max_kl": 0.1})
    assert (
        check.failed
        and check.reason() == "max_kl: no validation tokens to measure it (models.tiny_llm.validation.tokens or .text)"
    )


def test_a_cell_validated_on_the_seeded_prompt_alone_is_provisional():
    from etforge.builders.llm.export import REFERENCE_SOURCE
    from etforge.checks.numerics import Numerics

    assert Numerics.of({"inputs": REFERENCE_SOURCE}).provisional
    assert not Numerics.of({"inputs": "tokens data/tokens.npz (llm)"}).provisional


TEXT = "the cat sat on the mat and the dog sat on the log " * 2
WORDS = ["<unk>", "<s>", "</s>", "the", "cat", "sat", "on", "mat", "and", "dog", "log"]


def _tokenizer_json(path: Path, vocab: list = WORDS) -> None:
    word_tokenizer_json(path, vocab)


def _text_project(tmp_path, text: str = TEXT, validation: str = "{text: data/val.txt, tokenizer: data/tok.json}"):
    project = make_unit_project(tmp_path, LLM.replace("{tokens: data/tokens.npz}", validation), models=())
    (tmp_path / "data").mkdir(exist_ok=True)
    (tmp_path / "data" / "val.txt").write_text(text, encoding="utf-8")
    _tokenizer_json(tmp_path / "data" / "tok.json")
    return project


def test_a_text_and_its_tokenizer_give_the_tokenizers_ids_and_join_the_key(tmp_path):
    from etforge.config.llm_tokens import read_token_ids, token_source

    project = _text_project(tmp_path)
    first = resolve(project.pipeline).models["tiny_llm"].validation
    assert first["text"] == "data/val.txt" and first["tokenizer"] == "data/tok.json"
    ids = read_token_ids(tmp_path, first)
    assert ids.tolist()[:6] == [1, 3, 4, 5, 6, 3]  # <s> the cat sat on the
    assert token_source(first) == "text data/val.txt (tokenizer data/tok.json)"
    _tokenizer_json(tmp_path / "data" / "tok.json", WORDS[:3] + list(reversed(WORDS[3:])))
    second = resolve(project.pipeline).models["tiny_llm"].validation
    assert second["sha256"] != first["sha256"]  # another tokenizer: other ids, another key
    assert read_token_ids(tmp_path, second).tolist()[:3] == [1, 10, 9]


def test_token_files_and_texts_read_the_same_way(tmp_path):
    from etforge.config.llm_tokens import read_token_ids

    (tmp_path / "data").mkdir()
    np.savez(tmp_path / "data" / "tokens.npz", ids=np.arange(3, 15).reshape(3, 4))
    assert read_token_ids(tmp_path, {"tokens": "data/tokens.npz"}).tolist() == list(range(3, 15))


@pytest.mark.parametrize(
    "text, validation, key, message",
    [
        ("the cat", None, "text", "holds 3 token ids, too short for one window of 8"),
        (TEXT, "{text: data/val.txt}", "text", "needs the model's tokenizer: name its tokenizer.json"),
        (TEXT, "{text: data/val.txt, tokenizer: data/none.json}", "tokenizer", "tokenizer 'data/none.json' not found"),
        (TEXT, "{text: data/gone.txt, tokenizer: data/tok.json}", "text", "text file 'data/gone.txt' not found"),
        (TEXT, "{text: data/val.txt, tokenizer: data/val.txt}", "text", "cannot be encoded"),
        (TEXT, "{npz: data/x.npz, tokenizer: data/tok.json}", "tokenizer", "goes with a validation 'text'"),
    ],
)
def test_bad_texts_are_one_line_errors_naming_file_line_and_key(tmp_path, text, validation, key, message):
    project = _text_project(tmp_path, text, validation or "{text: data/val.txt, tokenizer: data/tok.json}")
    with pytest.raises(EtforgeError) as raised:
        resolve(project.pipeline)
    said = str(raised.value)
    assert "\n" not in said and message in said, said
    assert f"pipeline.yaml:10: models.tiny_llm.validation.{key}: " in said, said


def test_a_provisional_llm_cell_names_both_forms_of_real_tokens():
    from types import SimpleNamespace

    from etforge.publish.outcome import _validation_data_hint

    hint = _validation_data_hint(SimpleNamespace(kind="llm", name="tiny_llm", inputs=(), multi_method=False))
    assert "models.tiny_llm.validation.tokens" in hint and "models.tiny_llm.validation.text" in hint, hint
