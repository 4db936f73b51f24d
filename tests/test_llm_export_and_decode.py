"""A decoder-only LLM end to end, on a tiny untied Llama (2 layers, hidden 64, vocab 512; tied
random configs emit one constant token, so greedy agreement would prove nothing): capture ->
(quantize) -> export -> validate -> benchmark -> manifests -> report.

One project is built once for the module (every task; building this model costs about a minute
of CPU, so one build serves all the checks below): random weights on XNNPACK (fp32, and 8da4w with
4-bit embeddings) and portable (fp32), an 8-token prompt and 8 decode steps, validated on the first
16 ids of ``data/val.txt`` as its tokenizer (a word-level ``tokenizer.json``: word ``w<i>`` is id
i, ``<s>`` first) encodes it. As docs/llm.md says of a token window, the decode steps are fed the
text's ids, top-1 compares with eager's argmax at each step, and the greedy continuation starts
from the text's prompt. Checked on it:

- the program against eager PyTorch on the prefill, every decode step and the greedy
  continuation; its KV cache, ExecuTorch's custom ops and the runner's metadata methods;
- perplexity and KL divergence of fp32 and 8da4w on the text: fp32 is ``ok`` (real text, not a
  seeded prompt), 8da4w is worse; a copy of the built project with stricter thresholds (fp32
  SQNR, 8da4w top-1, and a ``max_kl`` far below what 4-bit weights cost on a random model)
  re-validates only, and fails on each gate (a token file's ids go the way of a text's:
  read_token_ids, tests/unit/test_unit_llm_quality.py);
- the LLM benchmark (bench.json's ``llm`` section, the report's table) and the LLM manifests
  (index.json, Dart, C++ header, CMake) of the portable fp32 cell and of every variant.

The same architecture from a local checkpoint directory (portable fp32) has its own project, for
the pinning test (``slow``: a checkpoint's digest and its plan-time check are
tests/test_hf_sources_are_checked.py's).
"""

from __future__ import annotations

import hashlib
import json
import math
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import (
    TINY_LLAMA_CONFIG,
    check,
    cmake_probe_lines,
    copy_project,
    cpp_probe_lines,
    make_project,
    state,
)

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from tests.unit.support import word_tokenizer_json  # noqa: E402

CONFIG = TINY_LLAMA_CONFIG
MAX_KL = 0.0001
PIPELINE = f"""\
name: t
version: 0.0.1
models:
  tiny_llm:
    transformers:
      task: text-generation
      config: {CONFIG}
      llm: {{max_context_len: 32, prompt_len: 8, decode_steps: 8}}
    validation: {{text: data/val.txt, tokenizer: data/tokenizer.json}}
    thresholds:
      fp32: {{max_ppl_ratio: 1.001, max_kl: 0.0001}}
      # 4-bit linears and embeddings on a tiny random model: ~13.5-14.5 dB worst-step logits SQNR
      8da4w: {{sqnr_db: 10}}
backends:
  xnnpack: {{}}
  portable: {{}}
quantization: [fp32, 8da4w]
targets: false
benchmark: {{iterations: 5, warmup: 1}}
quantization_options:
  8da4w: {{group_size: 32, embedding: 4, embedding_group_size: 32}}
"""
# What the copy of the built project adds: a gate each cell misses (the fp32 SQNR, 8da4w's top-1
# against fp32 eager and its mean KL); each miss is its own phrase in the reason.
STRICTER = f"thresholds:\n  fp32: {{sqnr_db: 1000}}\n  8da4w: {{top1_agreement: 1.0, max_kl: {MAX_KL}}}\n"
REGATED = ("tiny_llm/portable/fp32", "tiny_llm/xnnpack/8da4w")
CELL = "tiny_llm/portable/fp32"  # the cell the benchmark and manifest checks read
CKPT_PIPELINE = """\
name: t
version: 0.0.1
models:
  ckpt_llm:
    transformers:
      task: text-generation
      checkpoint: {path: ckpt, sha256: "CKPT_SHA"}
      llm: {max_context_len: 32, prompt_len: 6, decode_steps: 4}
backends:
  portable: {}
quantization: [fp32]
"""
RUNNER_METHODS = {
    "get_max_seq_len",
    "get_max_context_len",
    "get_vocab_size",
    "get_bos_id",
    "get_eos_ids",
    "use_kv_cache",
    "use_sdpa_with_kv_cache",
    "enable_dynamic_shape",
}


def _checkpoint_sha(directory: Path) -> str:
    from etforge.config.hf_source import checkpoint_digest

    return checkpoint_digest(
        {
            p.relative_to(directory).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(directory.rglob("*"))
            if p.is_file()
        }
    )


def _save_checkpoint(directory: Path) -> None:
    """A tiny Llama checkpoint (safetensors + config.json), seeded: what a user would have on disk."""
    import torch

    from etforge.builders.loading.hf_models import import_transformers

    tf = import_transformers()
    torch.manual_seed(7)
    config = tf.LlamaConfig(
        vocab_size=512,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
        tie_word_embeddings=False,
    )
    tf.AutoModelForCausalLM.from_config(config).save_pretrained(directory)


def _write(project, sha: str) -> None:
    project.write_pipeline(CKPT_PIPELINE.replace("CKPT_SHA", sha))


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    project = make_project(tmp_path_factory.mktemp("llm") / "proj", PIPELINE)
    (project.root / "data").mkdir()
    ids = np.random.default_rng(11).integers(3, 512, size=40)  # more than one window: the first is used
    (project.root / "data" / "val.txt").write_text(" ".join(f"w{i}" for i in ids), encoding="utf-8")
    word_tokenizer_json(
        project.root / "data" / "tokenizer.json", ["<unk>", "<s>", "</s>"] + [f"w{i}" for i in range(3, 512)]
    )
    run = project.doit()
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    project.run = run
    project.manifests = project.out / "manifests"
    project.index = json.loads((project.manifests / "index.json").read_text())
    project.export = json.loads((project.out / "tiny_llm" / "tiny_llm_portable_fp32.export.json").read_text())
    return project


@pytest.fixture(scope="module")
def regated(built, tmp_path_factory):
    """A copy of the built project with STRICTER thresholds, its REGATED cells re-validated (``run``)."""
    project = copy_project(built, tmp_path_factory.mktemp("regated") / "copy")
    project.write_pipeline(project.pipeline.read_text().replace("backends:", STRICTER + "backends:"))
    project.run = project.doit(*(f"validate:{c}" for c in REGATED))
    return project


@pytest.fixture(scope="module")
def ckpt_built(tmp_path_factory):
    project = make_project(tmp_path_factory.mktemp("ckpt") / "proj", "name: t\n")
    _save_checkpoint(project.root / "ckpt")
    _write(project, _checkpoint_sha(project.root / "ckpt"))
    run = project.doit()
    assert run.returncode == 0, run.stdout + run.stderr
    return project


def _numerics(project, cell: str) -> dict:
    return json.loads((project.out / cell.split("/")[0] / (cell.replace("/", "_") + ".numerics.json")).read_text())


def _quality(project, scheme: str) -> dict:
    return _numerics(project, f"tiny_llm/xnnpack/{scheme}")["llm_quality"]


# ---------------------------------------------------------------- the program against eager PyTorch


@pytest.mark.parametrize("backend", ["xnnpack", "portable"])
def test_llm_program_matches_eager_on_prefill_decode_and_greedy(built, backend):
    report = _numerics(built, f"tiny_llm/{backend}/fp32")
    llm = report["llm"]
    assert report["passed"], report["misses"]
    assert llm["decode_steps"] == 8 and len(llm["step_sqnr_db"]) == 8
    assert llm["prefill_sqnr_db"] > 100 and min(llm["step_sqnr_db"]) > 100
    assert llm["top1_agreement"] == 1.0 and llm["greedy_agreement"] == 1.0
    assert llm["program_tokens"] == llm["eager_tokens"]  # the free greedy continuation of the text's prompt
    assert len(set(llm["eager_tokens"])) > 2  # an untied config: the continuation varies
    assert any("random" in note for note in report["notes"])


def test_llm_program_has_kv_cache_custom_ops_and_runner_metadata(built):
    import executorch.extension.llm.custom_ops.custom_ops  # noqa: F401  (to load forward)
    import torch
    from executorch.runtime import Runtime

    pte = built.out / "tiny_llm" / "tiny_llm_xnnpack_fp32.pte"
    program = Runtime.get().load_program(pte.read_bytes())
    assert RUNNER_METHODS <= set(program.method_names)
    values = {name: program.load_method(name).execute([]) for name in RUNNER_METHODS}
    values = {k: [x.item() if isinstance(x, torch.Tensor) else x for x in v] for k, v in values.items()}
    assert values["get_max_context_len"] == [32] and values["get_vocab_size"] == [512]
    assert values["get_eos_ids"] == [2] and values["get_bos_id"] == [1] and values["use_kv_cache"] == [True]
    assert values["use_sdpa_with_kv_cache"] == [True] and values["enable_dynamic_shape"] == [True]
    export = json.loads((built.out / "tiny_llm" / "tiny_llm_xnnpack_fp32.export.json").read_text())
    assert export["llm_metadata"]["get_max_seq_len"] == 32
    assert "llama.custom_sdpa" in check(export, "delegation")["not_delegated"]  # ExecuTorch's SDPA op
    # The KV cache lives in the program: a decode step after the prefill continues from it.
    method = program.load_method("forward")
    prompt = torch.tensor([[5, 9, 77, 300]])
    full = method.execute([prompt, torch.arange(4)])[0][0, -1].clone()
    method.execute([prompt[:, :3].contiguous(), torch.arange(3)])
    step = method.execute([prompt[:, 3:].contiguous(), torch.tensor([3])])[0][0, -1]
    assert torch.allclose(full, step, atol=1e-4)


def test_8da4w_with_quantized_embeddings_builds_smaller_and_passes_its_gates(built):
    cell = "tiny_llm/xnnpack/8da4w"
    report = _numerics(built, cell)
    assert report["passed"], report["misses"]
    assert report["thresholds"]["top1_agreement"] == 0.625 and report["thresholds"]["sqnr_db"] == 10
    assert report["llm"]["top1_agreement"] >= 0.625 and report["llm"]["sqnr_db"] >= 10
    assert report["llm"]["sqnr_db"] < 60  # really quantized: far from the fp32 program's ~130 dB
    assert state(built, "sizegate:" + cell)["status"] == "ok"
    pte = (built.out / "tiny_llm" / "tiny_llm_xnnpack_8da4w.pte").read_bytes()
    fp32 = (built.out / "tiny_llm" / "tiny_llm_xnnpack_fp32.pte").stat().st_size
    assert len(pte) < 0.3 * fp32
    assert b"embedding_4bit" in pte  # the embedding runs as ExecuTorch's quantized kernel


def test_second_run_executes_nothing(built):
    run = built.doit()
    assert run.returncode == 0 and run.started == set(), run.stdout


# ---------------------------------------------------------------- perplexity and KL on a text


def test_perplexity_and_kl_of_fp32_and_8da4w_are_finite_and_8da4w_is_worse(built):
    fp32, q = _quality(built, "fp32"), _quality(built, "8da4w")
    for figures in (fp32, q):
        assert figures["positions"] == 8 - 1 + 8  # prompt_len - 1 + decode_steps next-token predictions
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
    cell = next(c for c in plan.cells if c.name == "tiny_llm/xnnpack/fp32")
    assert state(built, "validate:tiny_llm/xnnpack/fp32")["status"] == "ok", built.run.stdout[-3000:]
    judged = outcome.cell_outcome(plan, cell, host_fingerprint())
    assert judged.status != "provisional" and "seeded random" not in judged.reason, judged
    report = _numerics(built, "tiny_llm/xnnpack/fp32")
    assert report["inputs"] == "text data/val.txt (tokenizer data/tokenizer.json) (llm)", report["inputs"]


# ---------------------------------------------------------------- stricter gates on a copy


def test_threshold_gates_the_llm_cell_and_only_revalidates(regated):
    run = regated.run
    assert run.returncode != 0
    assert run.started == {f"validate:{c}" for c in REGATED}, run.stdout
    assert "worst SQNR" in run.stdout and "< 1000 dB" in run.stdout
    assert "top-1 agreement" in run.stdout and "< 1.0" in run.stdout


def test_max_kl_fails_the_8da4w_cell_with_both_figures(regated):
    record = state(regated, "validate:tiny_llm/xnnpack/8da4w")
    q = _quality(regated, "8da4w")
    assert record["status"] == "failed", record
    reason = record["reason"]
    assert f"mean KL from eager fp32 {q['kl_mean']:.4g} > max_kl {MAX_KL}" in reason, reason
    assert f"p99 {q['kl_p99']:.4g}" in reason


# ---------------------------------------------------------------- benchmark and report


def test_bench_json_of_an_llm_cell_has_load_prefill_decode_and_rss(built):
    llm = json.loads((built.out / "tiny_llm" / "tiny_llm_portable_fp32.bench.json").read_text())["llm"]

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
    html = (built.out / "report.html").read_text()
    assert 'id="llm-bench"' in html and f'data-cell="{CELL}"' in html
    assert "tok/s" in html and "time to first token" in html


# ---------------------------------------------------------------- manifests


def _ints(value) -> list:
    return [int(v) for v in (value if isinstance(value, list) else [value])]


def llm_lines(index: dict) -> list:
    """What the C++ and CMake probes print of each LLM variant, made from index.json."""
    lines = []
    for entry in index["models"]:
        llm = entry.get("llm")
        if not llm:
            continue
        vid = f"{entry['modelName']}/{entry['backend']}/{entry['quantization']}"
        lines.append(f"{vid} llm methods " + " ".join(llm["methods"]))
        lines += [f"{vid} llm {name} " + ",".join(map(str, _ints(value))) for name, value in llm["metadata"].items()]
        kv = llm["kv_cache"]
        lines.append(f"{vid} kv_cache {kv['bytes']} {kv['dtype']} {kv['layout']} " + ",".join(map(str, kv["shape"])))
    return lines


def test_index_json_lists_the_llm_methods_metadata_and_kv_cache(built):
    entry = next(e for e in built.index["models"] if f"{e['modelName']}/{e['backend']}/{e['quantization']}" == CELL)
    metadata = built.export["llm_metadata"]
    llm = entry["llm"]
    assert llm["methods"] == ["forward", *sorted(metadata)] and llm["metadata"] == metadata
    assert metadata["get_max_context_len"] == 32 and metadata["get_n_layers"] == 2
    # 2 (K, V) x 2 layers x batch 1 x 32 positions x 2 kv heads x head dim 16 x 4 bytes
    assert llm["kv_cache"] == {
        "bytes": 2 * 2 * 1 * 32 * 2 * 16 * 4,
        "dtype": "float32",
        "layout": "BSHD",
        "layers": 2,
        "tensor_shape": [1, 32, 2, 16],
        "shape": [2, 2, 1, 32, 2, 16],
    }
    # the program really has these methods
    import executorch.extension.llm.custom_ops.custom_ops  # noqa: F401
    from executorch.runtime import Runtime

    program = Runtime.get().load_program((built.out / "tiny_llm" / "tiny_llm_portable_fp32.pte").read_bytes())
    # every method the manifest names is the program's; the others are etforge's own metadata methods
    assert set(llm["methods"]) <= set(program.method_names)
    assert all(m.startswith("etforge_meta") for m in set(program.method_names) - set(llm["methods"]))


def test_dart_carries_the_llm_spec_of_index_json(built):
    from test_app_manifests import _named_arguments, _walk, parse_dart, syntax_errors

    tree = parse_dart((built.manifests / "models.g.dart").read_text())
    assert syntax_errors(tree) == []
    specs = [
        n
        for n in _walk(tree.root_node)
        if n.type == "named_argument" and n.children[0].children[0].text.decode() == "llm"
    ]
    variants = [e["llm"] for e in built.index["models"] if e.get("llm")]
    assert len(specs) == len(variants) == 3  # one spec per LLM variant, in index.json's order
    for spec, llm in zip(specs, variants):
        dart = _named_arguments(spec)
        assert dart["methods"] == llm["methods"]
        assert dart["metadata"] == [{"name": k, "values": _ints(v)} for k, v in llm["metadata"].items()]
        assert (dart["kvCacheBytes"], dart["kvCacheDtype"], dart["kvCacheLayout"], dart["kvCacheShape"]) == (
            llm["kv_cache"]["bytes"],
            llm["kv_cache"]["dtype"],
            llm["kv_cache"]["layout"],
            llm["kv_cache"]["shape"],
        )


PROBE_CPP = r"""#include "etforge_models.h"
#include <cstdio>

using namespace etforge::models;

int main() {
  for (size_t i = 0; i < kNumModels; ++i) {
    for (size_t j = 0; j < kModels[i].num_variants; ++j) {
      const Variant& v = kModels[i].variants[j];
      if (v.llm == nullptr) continue;
      const LlmSpec& l = *v.llm;
      std::printf("%s llm methods", v.id);
      for (size_t m = 0; m < l.num_methods; ++m) std::printf(" %s", l.methods[m]);
      std::printf("\n");
      for (size_t m = 0; m < l.num_metadata; ++m) {
        std::printf("%s llm %s ", v.id, l.metadata[m].name);
        for (size_t k = 0; k < l.metadata[m].num_values; ++k)
          std::printf("%s%lld", k ? "," : "", static_cast<long long>(l.metadata[m].values[k]));
        std::printf("\n");
      }
      std::printf("%s kv_cache %llu %s %s ", v.id, static_cast<unsigned long long>(l.kv_cache_bytes),
                  l.kv_cache_dtype, l.kv_cache_layout);
      for (size_t d = 0; d < l.kv_cache_rank; ++d)
        std::printf("%s%lld", d ? "," : "", static_cast<long long>(l.kv_cache_shape[d]));
      std::printf("\n");
    }
  }
}
"""

PROBE_CMAKE = r"""cmake_policy(VERSION 3.13)
set(ETFORGE_INSTALL_MODELS OFF)
include("${MANIFEST}")
foreach(v IN LISTS ETFORGE_VARIANTS)
  if(NOT ETFORGE_${v}_LLM)
    continue()
  endif()
  set(id "${ETFORGE_${v}_MODEL}/${ETFORGE_${v}_BACKEND}/${ETFORGE_${v}_QUANTIZATION}")
  list(JOIN ETFORGE_${v}_LLM_METHODS " " methods)
  message("${id} llm methods ${methods}")
  foreach(m IN LISTS ETFORGE_${v}_LLM_METHODS)
    if(m STREQUAL "forward")
      continue()
    endif()
    string(TOUPPER "${m}" M)
    list(JOIN ETFORGE_${v}_LLM_${M} "," values)
    message("${id} llm ${m} ${values}")
  endforeach()
  list(JOIN ETFORGE_${v}_KV_CACHE_SHAPE "," shape)
  message("${id} kv_cache ${ETFORGE_${v}_KV_CACHE_BYTES} ${ETFORGE_${v}_KV_CACHE_DTYPE} ${ETFORGE_${v}_KV_CACHE_LAYOUT} ${shape}")
endforeach()
"""


@pytest.mark.skipif(shutil.which("c++") is None, reason="a C++ compiler is needed")
def test_cpp_header_carries_the_llm_spec_of_index_json(built, tmp_path):
    printed = cpp_probe_lines(PROBE_CPP, built.manifests, tmp_path)
    assert printed == llm_lines(built.index) and len(printed) > 10
    assert f"{CELL} llm get_eos_ids 2" in printed and f"{CELL} llm use_kv_cache 1" in printed


@pytest.mark.skipif(shutil.which("cmake") is None, reason="cmake is not installed")
def test_cmake_variables_carry_the_llm_spec_of_index_json(built, tmp_path):
    printed = cmake_probe_lines(PROBE_CMAKE, built.manifests / "models.cmake", tmp_path)
    assert printed == llm_lines(built.index)
    assert f"{CELL} kv_cache 16384 float32 BSHD 2,2,1,32,2,16" in printed


# ---------------------------------------------------------------- a pinned checkpoint, and the verdict on NaN


@pytest.mark.slow
def test_changed_checkpoint_weight_rebuilds_only_that_model(ckpt_built, tmp_path):
    from safetensors.torch import load_file, save_file

    project = copy_project(ckpt_built, tmp_path / "copy2")
    weights = project.root / "ckpt" / "model.safetensors"
    tensors = load_file(weights)
    name = sorted(tensors)[0]
    tensors[name] = tensors[name] * 1.01
    save_file(tensors, weights, metadata={"format": "pt"})
    stale = project.doit("list")
    assert stale.returncode != 0 and "checkpoint directory sha256 is" in stale.stdout + stale.stderr
    _write(project, _checkpoint_sha(project.root / "ckpt"))
    run = project.doit()
    assert run.returncode == 0, run.stdout + run.stderr
    rebuilt = {t for t in run.started if t.split(":")[0] in ("capture", "export", "validate", "benchmark")}
    assert rebuilt == {
        "capture:ckpt_llm",
        "export:ckpt_llm/portable/fp32",
        "validate:ckpt_llm/portable/fp32",
        "benchmark:ckpt_llm/portable/fp32",
    }
    assert state(project, "validate:ckpt_llm/portable/fp32")["status"] == "ok"


def test_llm_verdict_fails_on_nan():
    from etforge.builders.llm.numerics import llm_verdict

    nan = float("nan")
    metrics = {
        "sqnr_db": nan,
        "top1_agreement": nan,
        "greedy_agreement": 1.0,
        "nonfinite": {"values": 4, "nan": 0, "inf": 0},
    }
    misses = llm_verdict(metrics, {"sqnr_db": 60, "top1_agreement": 1.0, "greedy_agreement": 1.0})
    assert len(misses) == 2 and "worst SQNR nan" in misses[0]
    metrics["nonfinite"] = {"values": 4, "nan": 1, "inf": 0}
    assert "non-finite" in llm_verdict(metrics, {})[0]
