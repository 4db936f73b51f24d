"""LLM benchmarks and LLM manifests (issue 13 points 5 and 6) on one tiny LLM cell.

One project is built once for the module: the tiny untied Llama of tests/test_llm_export.py
(vocab 512, hidden 64, 2 layers) on XNNPACK fp32, through benchmark, manifest and report.
"""

from __future__ import annotations

import json
import math

import pytest

from conftest import make_project

CONFIG = ("{model_type: llama, vocab_size: 512, hidden_size: 64, intermediate_size: 128, num_hidden_layers: 2, "
          "num_attention_heads: 4, num_key_value_heads: 2, max_position_embeddings: 64, "
          "tie_word_embeddings: false, bos_token_id: 1, eos_token_id: 2, pad_token_id: 0}")
PIPELINE = f"""\
name: t
version: 0.0.1
models:
  tiny_llm:
    transformers:
      task: text-generation
      config: {CONFIG}
      llm: {{max_context_len: 32, prompt_len: 8, decode_steps: 4}}
backends:
  xnnpack: {{}}
quantization: [fp32]
benchmark: {{iterations: 5, warmup: 1}}
"""
CELL = "tiny_llm/xnnpack/fp32"


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    project = make_project(tmp_path_factory.mktemp("llm_bench") / "proj", PIPELINE)
    run = project.doit()
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    project.manifests = project.out / "manifests"
    project.index = json.loads((project.manifests / "index.json").read_text())
    project.export = json.loads((project.out / "tiny_llm" / "tiny_llm_xnnpack_fp32.export.json").read_text())
    return project


def _bench(project) -> dict:
    paths = sorted(project.root.rglob("bench.json"))
    assert paths, "no bench.json"
    return json.loads(paths[-1].read_text())


def test_bench_json_of_an_llm_cell_has_load_prefill_decode_and_rss(built):
    llm = _bench(built)["llm"]

    def positive(x):
        return isinstance(x, (int, float)) and math.isfinite(x) and x > 0

    assert llm["prompt_len"] == 8 and llm["decode_steps"] == 24  # min(32, max_context_len - prompt_len)
    for key in ("load_ms", "prefill_ms", "prefill_tok_s", "ttft_ms", "decode_ms", "decode_tok_s"):
        assert positive(llm[key]), (key, llm[key])
    assert positive(llm["decode_step_ms"]["p50"]) and llm["generations"] >= 1
    assert llm["ttft_ms"] >= llm["prefill_ms"]  # the first token is picked after the prefill
    assert math.isclose(llm["prefill_tok_s"], 8 / (llm["prefill_ms"] / 1e3), rel_tol=1e-3)
    memory = llm["memory"]
    assert positive(memory["peak_rss_bytes"]) and memory["peak_rss_delta_bytes"] >= 0
    assert memory["peak_rss_bytes"] >= memory["rss_before_load_bytes"]
    assert "clear_refs" in memory["rss_method"]  # Linux: the high-water mark is the program's


def test_report_shows_the_llm_figures(built):
    html = (built.out / "report.html").read_text() if (built.out / "report.html").exists() else \
        next(built.out.rglob("report.html")).read_text()
    assert 'id="llm-bench"' in html and f'data-cell="{CELL}"' in html
    assert "tok/s" in html and "time to first token" in html
