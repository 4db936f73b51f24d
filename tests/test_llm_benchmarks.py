"""LLM benchmarks and LLM manifests on one tiny LLM cell.

One project is built once for the module: the tiny untied Llama of tests/test_llm_export_and_decode.py
(vocab 512, hidden 64, 2 layers) on portable fp32 (the cheapest lowering), through benchmark,
manifest and report.
"""

from __future__ import annotations

import json
import math
import shutil

import pytest
from conftest import TINY_LLAMA_CONFIG, cmake_probe_lines, cpp_probe_lines, make_project

CONFIG = TINY_LLAMA_CONFIG
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
  portable: {{}}
quantization: [fp32]
benchmark: {{iterations: 5, warmup: 1}}
"""
CELL = "tiny_llm/portable/fp32"


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    project = make_project(tmp_path_factory.mktemp("llm_bench") / "proj", PIPELINE)
    run = project.doit()
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    project.manifests = project.out / "manifests"
    project.index = json.loads((project.manifests / "index.json").read_text())
    project.export = json.loads((project.out / "tiny_llm" / "tiny_llm_portable_fp32.export.json").read_text())
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
    html = (
        (built.out / "report.html").read_text()
        if (built.out / "report.html").exists()
        else next(built.out.rglob("report.html")).read_text()
    )
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
    entry = next(e for e in built.index["models"] if e["modelName"] == "tiny_llm")
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
    assert len(specs) == 1  # one LLM variant
    dart = _named_arguments(specs[0])
    llm = built.index["models"][0]["llm"]
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
