"""Decoder-only LLM families beyond the tiny Llama: sliding-window attention and transformers'
hybrid cache, and a KV cache of one head with head_dim 128.

Default run: one project, built once for the module (``doit validate``), with two tiny configs on
XNNPACK fp32, through the real pipeline (one build serves both: each build process first spends
~6 s of CPU importing torch, transformers and ExecuTorch):

- a Gemma-3-style config (2 layers: one sliding with window 6, one full). Its 8-token prompt and
  8 decode steps (positions 0..15) cross the window, so a program that ignored the window, or
  crashed on transformers' ``TorchExportableModuleWithHybridCache`` (no ``static_cache``), would
  fail here;
- a Llama-3.2-shaped config with one KV head (multi-query attention) and head_dim 128, the
  regression of issue 34 (its in-process checks and the story: tests/test_llm_kv_heads.py).

The in-process tests check the window mask against transformers' own masked attention and the
Gemma 2 attention fallback. The slow test builds examples/llm_families/pipeline.yaml (every
family × fp32/8da4w).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from conftest import check, make_project

REPO = Path(__file__).resolve().parent.parent
FAMILIES = REPO / "examples" / "llm_families" / "pipeline.yaml"
GEMMA3_CONFIG = (
    "{model_type: gemma3_text, vocab_size: 512, hidden_size: 64, intermediate_size: 128, num_hidden_layers: 2, "
    "num_attention_heads: 4, num_key_value_heads: 2, head_dim: 16, max_position_embeddings: 64, "
    "sliding_window: 6, layer_types: [sliding_attention, full_attention], query_pre_attn_scalar: 16, "
    "tie_word_embeddings: false, bos_token_id: 1, eos_token_id: 2, pad_token_id: 0}"
)
# Llama-3.2-shaped with one KV head (tests/test_llm_kv_heads.py): 4 query heads, head_dim 128, llama3 rope
LLAMA_MQA = (
    "{model_type: llama, vocab_size: 512, hidden_size: 256, intermediate_size: 512, num_hidden_layers: 2, "
    "num_attention_heads: 4, num_key_value_heads: 1, head_dim: 128, max_position_embeddings: 131072, "
    "rms_norm_eps: 1.0e-5, tie_word_embeddings: false, bos_token_id: 1, eos_token_id: 2, "
    "rope_parameters: {rope_type: llama3, rope_theta: 500000.0, factor: 32.0, low_freq_factor: 1.0, "
    "high_freq_factor: 4.0, original_max_position_embeddings: 8192}}"
)
PIPELINE = f"""\
name: t
version: 0.0.1
models:
  gemma3:
    transformers:
      task: text-generation
      config: {GEMMA3_CONFIG}
      llm: {{max_context_len: 32, prompt_len: 8, decode_steps: 8}}
  llama_mqa:
    transformers:
      task: text-generation
      config: {LLAMA_MQA}
      llm: {{max_context_len: 32, prompt_len: 8, decode_steps: 8}}
backends:
  xnnpack: {{}}
quantization: [fp32]
targets: false  # aarch64 verdicts: tests/test_aarch64_targets.py
"""


def _numerics(project, model: str, backend: str, scheme: str) -> dict:
    return json.loads((project.out / model / f"{model}_{backend}_{scheme}.numerics.json").read_text())


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """PIPELINE validated: the Gemma-3-style cell and the one-KV-head Llama cell."""
    project = make_project(tmp_path_factory.mktemp("families") / "proj", PIPELINE)
    run = project.doit("validate")
    assert run.returncode == 0, run.stdout + run.stderr
    return project


def test_gemma3_sliding_window_validates_per_decode_step(built):
    report = _numerics(built, "gemma3", "xnnpack", "fp32")
    llm = report["llm"]
    assert report["passed"], report["misses"]
    assert llm["decode_steps"] == 8 and len(llm["step_sqnr_db"]) == 8
    # Positions 8..15 lie past the window (6): ignoring it measured ~1-10 dB and 0-4/8 tokens.
    assert min(llm["step_sqnr_db"]) > 60
    assert llm["top1_agreement"] == 1.0 and llm["greedy_agreement"] == 1.0
    assert llm["program_tokens"] == llm["eager_tokens"]
    export = json.loads((built.out / "gemma3" / "gemma3_xnnpack_fp32.export.json").read_text())
    assert "llama.custom_sdpa" in check(export, "delegation")["not_delegated"]


def test_one_kv_head_with_head_dim_128_validates_per_decode_step(built):
    """One KV head: the runtime refused the cache at the first decode step before the fix (issue 34,
    tests/test_llm_kv_heads.py); now every step matches eager."""
    report = _numerics(built, "llama_mqa", "xnnpack", "fp32")
    llm = report["llm"]
    assert report["passed"], report["misses"]
    assert len(llm["step_sqnr_db"]) == 8 and min(llm["step_sqnr_db"]) > 60
    assert llm["program_tokens"] == llm["eager_tokens"]


@pytest.mark.parametrize("start, length", [(0, 8), (10, 1), (13, 3)])
def test_window_mask_matches_transformers_sliding_attention(start, length):
    """custom_sdpa with etforge's window mask equals SDPA under transformers' sliding-window mask."""
    import torch

    from etforge.builders.llm import export as llm_export

    llm_export.register_custom_ops()
    torch.manual_seed(0)
    cache_len, window = 16, 6
    q = torch.randn(1, 4, length, 16)
    k, v = torch.randn(1, 2, cache_len, 16), torch.randn(1, 2, cache_len, 16)
    out, _ = llm_export._et_custom_sdpa(
        None, q, k, v, None, position_ids=torch.arange(start, start + length)[None], scaling=0.25, sliding_window=window
    )
    pos_q = torch.arange(start, start + length)[:, None]
    pos_k = torch.arange(cache_len)[None]
    allowed = (pos_k <= pos_q) & (pos_q - pos_k < window)
    want = torch.nn.functional.scaled_dot_product_attention(
        q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1), attn_mask=allowed, scale=0.25
    )
    assert torch.allclose(out, want.transpose(1, 2), atol=1e-5)


def test_a_class_without_sdpa_is_built_with_eager_attention():
    """Gemma 2 has no SDPA (its logit softcap): from_config(attn_implementation='sdpa') raises, so
    etforge builds it with eager attention instead of failing the capture."""
    from etforge.builders.loading.hf_models import attention_for, import_transformers

    tf = import_transformers()
    assert attention_for(tf.AutoModelForCausalLM, tf.AutoConfig.for_model("gemma2"), "sdpa") == "eager"
    assert attention_for(tf.AutoModelForCausalLM, tf.AutoConfig.for_model("gemma3_text"), "sdpa") == "sdpa"


@pytest.mark.slow
def test_every_family_validates_on_xnnpack_fp32_and_8da4w(tmp_path):
    """examples/llm_families: every family × {fp32, 8da4w} on XNNPACK ends validated (15-30 min)."""
    project = make_project(tmp_path / "proj", FAMILIES.read_text().replace("name: llm-families", "name: t"))
    run = project.doit("validate")
    assert run.returncode == 0, run.stdout + run.stderr
    models = yaml.safe_load(FAMILIES.read_text())["models"]
    for model in models:
        for scheme in ("fp32", "8da4w"):
            report = _numerics(project, model, "xnnpack", scheme)
            assert report["passed"], (model, scheme, report["misses"])
            if scheme == "fp32":
                assert report["llm"]["greedy_agreement"] == 1.0, model
