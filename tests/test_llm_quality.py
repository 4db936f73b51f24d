"""Perplexity and KL divergence of the tiny LLM's fp32 and 8da4w cells on a validation text and its
tokenizer, with the ``max_kl`` gate, through one real build (capture, quantize, export, validate).

One project, built once for the module: the tiny untied Llama of tests/conftest.py, a 4-token
prompt and 8 decode steps, validated on the first 12 ids of ``data/val.txt`` as its tokenizer
(a word-level ``tokenizer.json``: word ``w<i>`` is id i, ``<s>`` first) encodes it. fp32 passes and
is ``ok`` (real text, not a seeded prompt); 8da4w carries a ``max_kl`` far below what 4-bit weights
cost on a random model, so it fails on it. (A token file's ids go the same way: read_token_ids,
tests/unit/test_unit_llm_quality.py.)
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import TINY_LLAMA_CONFIG, make_project, state

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from tests.unit.support import word_tokenizer_json  # noqa: E402

MAX_KL = 0.0001
PIPELINE = f"""\
name: t
version: 0.0.1
models:
  tiny_llm:
    transformers:
      task: text-generation
      config: {TINY_LLAMA_CONFIG}
      llm: {{max_context_len: 16, prompt_len: 4, decode_steps: 8, dynamic_shapes: true}}
    validation: {{text: data/val.txt, tokenizer: data/tokenizer.json}}
    thresholds:
      fp32: {{max_ppl_ratio: 1.001, max_kl: 0.0001}}
      8da4w: {{sqnr_db: 0, top1_agreement: 0, max_kl: {MAX_KL}}}
backends:
  xnnpack: {{}}
quantization: [fp32, 8da4w]
quantization_options: {{8da4w: {{group_size: 32}}}}
targets: false
"""


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    project = make_project(tmp_path_factory.mktemp("llmq") / "proj", PIPELINE)
    (project.root / "data").mkdir()
    ids = np.random.default_rng(11).integers(3, 512, size=40)  # more than one window: the first is used
    (project.root / "data" / "val.txt").write_text(" ".join(f"w{i}" for i in ids), encoding="utf-8")
    word_tokenizer_json(
        project.root / "data" / "tokenizer.json", ["<unk>", "<s>", "</s>"] + [f"w{i}" for i in range(3, 512)]
    )
    project.run = project.doit("validate")
    return project


def _quality(project, scheme: str) -> dict:
    report = json.loads((project.out / "tiny_llm" / f"tiny_llm_xnnpack_{scheme}.numerics.json").read_text())
    return report["llm_quality"]


def test_perplexity_and_kl_of_fp32_and_8da4w_are_finite_and_8da4w_is_worse(built):
    fp32, q = _quality(built, "fp32"), _quality(built, "8da4w")
    for figures in (fp32, q):
        assert figures["positions"] == 4 - 1 + 8
        for key in ("ppl_eager", "ppl_program", "ppl_ratio", "kl_mean", "kl_p99"):
            assert math.isfinite(figures[key]), (key, figures)
    assert fp32["ppl_eager"] == pytest.approx(q["ppl_eager"])  # the same eager fp32 on the same window
    assert 100 < fp32["ppl_eager"] < 2000  # a random model on random ids: near the vocabulary (512)
    assert abs(fp32["ppl_ratio"] - 1) < 1e-3 and fp32["kl_mean"] < 1e-5
    assert q["ppl_ratio"] != pytest.approx(1, abs=1e-3) and q["kl_mean"] > 10 * fp32["kl_mean"]
    assert abs(q["ppl_ratio"] - 1) > abs(fp32["ppl_ratio"] - 1)
    assert q["kl_p99"] >= q["kl_mean"]
    assert math.isfinite(q["ppl_same_scheme"]) and fp32.get("ppl_same_scheme") is None


def test_an_llm_cell_validated_on_real_tokens_is_ok(built):
    from etforge.config.machine import host_fingerprint
    from etforge.config.resolve import resolve
    from etforge.publish import outcome

    plan = resolve(built.pipeline)
    cell = next(c for c in plan.cells if c.quant.name == "fp32")
    assert state(built, "validate:tiny_llm/xnnpack/fp32")["status"] == "ok", built.run.stdout[-3000:]
    judged = outcome.cell_outcome(plan, cell, host_fingerprint())
    assert judged.status != "provisional" and "seeded random" not in judged.reason, judged
    report = json.loads((built.out / "tiny_llm" / "tiny_llm_xnnpack_fp32.numerics.json").read_text())
    assert report["inputs"] == "text data/val.txt (tokenizer data/tokenizer.json) (llm)", report["inputs"]


def test_max_kl_fails_the_8da4w_cell_with_both_figures(built):
    record = state(built, "validate:tiny_llm/xnnpack/8da4w")
    q = _quality(built, "8da4w")
    assert record["status"] == "failed", record
    reason = record["reason"]
    assert f"mean KL from eager fp32 {q['kl_mean']:.4g} > max_kl {MAX_KL}" in reason, reason
    assert f"p99 {q['kl_p99']:.4g}" in reason
