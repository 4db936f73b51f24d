"""Dynamic shapes and several methods in the generated files: the Dart, the C++ header and the CMake carry
what index.json carries (per variant its methods, per method its inputs with dtypes, shapes, each
dynamic dim's min, max and name, value ranges, and its outputs).

One project (a dynamic-length model and an encode/decode model, XNNPACK fp32) is built once; the
Dart is parsed with tree-sitter, the header is compiled with a small C++ program that prints what
it holds, and models.cmake is included by a CMake script that prints its variables. Each printout
is compared line for line with the same lines made from index.json, and spot-checked by hand.
"""

from __future__ import annotations

import json
import shutil

import pytest
from conftest import cmake_probe_lines, cpp_probe_lines, make_project
from test_app_manifests import dart_constants, parse_dart, syntax_errors

PIPELINE = """\
name: t
version: 0.0.1
models:
  seq:
    python: models.token_seq:build
    inputs:
      - {name: ids, shape: [1, {min: 1, max: 64, name: seq}], dtype: int64, range: [0, 50]}
      - {name: x, shape: [1, {min: 1, max: 64, name: seq}, 16]}
  seq2seq:
    python: models.encoder_decoder:build
    methods:
      encode: {inputs: [{name: x, shape: [1, 8, 16]}]}
      decode: {inputs: [{name: ids, shape: [1, 4], dtype: int64, range: [0, 20]}, {name: memory, shape: [1, 16]}]}
backends:
  xnnpack: {}
quantization: [fp32]
targets: false  # aarch64 verdicts: tests/test_aarch64_targets.py
"""

SEQ, SEQ2SEQ = "seq/xnnpack/fp32", "seq2seq/xnnpack/fp32"

# Prints, per variant, its methods and per method each input and output, in the format of io_lines().
PROBE_CPP = r"""#include "etforge_models.h"
#include <cstdio>

using namespace etforge::models;

static void print_tensor(const char* id, const char* method, const char* kind, size_t k, const TensorSpec& t) {
  std::printf("%s %s %s%zu %s %s shape=", id, method, kind, k, t.name, t.dtype);
  for (size_t d = 0; d < t.rank; ++d) std::printf("%s%lld", d ? "," : "", static_cast<long long>(t.shape[d]));
  std::printf(" dims=");
  for (size_t d = 0; d < t.num_dynamic_dims; ++d) {
    const DynamicDim& dim = t.dynamic_dims[d];
    std::printf("%s%zu:%lld:%lld:%s", d ? "," : "", dim.axis, static_cast<long long>(dim.min),
                static_cast<long long>(dim.max), dim.name);
  }
  if (t.has_range) std::printf(" range=%g,%g\n", t.range_min, t.range_max);
  else std::printf(" range=-\n");
}

int main() {
  for (size_t i = 0; i < kNumModels; ++i) {
    for (size_t j = 0; j < kModels[i].num_variants; ++j) {
      const Variant& v = kModels[i].variants[j];
      std::printf("%s methods", v.id);
      for (size_t m = 0; m < v.num_methods; ++m) std::printf(" %s", v.methods[m].name);
      std::printf("\n");
      for (size_t m = 0; m < v.num_methods; ++m) {
        const Method& method = v.methods[m];
        for (size_t k = 0; k < method.num_inputs; ++k) print_tensor(v.id, method.name, "in", k, method.inputs[k]);
        for (int k = 0; k < method.num_outputs; ++k) print_tensor(v.id, method.name, "out", k, method.outputs[k]);
      }
      // The variant's own inputs/outputs (what cpp/runner reads) are its first method's.
      std::printf("%s first %d %d\n", v.id, v.inputs == v.methods[0].inputs && v.num_outputs == v.methods[0].num_outputs,
                  find_method(v, v.methods[v.num_methods - 1].name) == &v.methods[v.num_methods - 1]);
    }
  }
}
"""

# The same lines from models.cmake's variables.
PROBE_CMAKE = r"""cmake_policy(VERSION 3.13)  # option() keeps a normal variable set before it (CMP0077)
set(ETFORGE_INSTALL_MODELS OFF)  # install() is not scriptable
include("${MANIFEST}")
foreach(v IN LISTS ETFORGE_VARIANTS)
  set(id "${ETFORGE_${v}_MODEL}/${ETFORGE_${v}_BACKEND}/${ETFORGE_${v}_QUANTIZATION}")
  list(JOIN ETFORGE_${v}_METHODS " " methods)
  message("${id} methods ${methods}")
  set(i 0)
  foreach(m IN LISTS ETFORGE_${v}_METHODS)
    list(GET ETFORGE_${v}_METHOD_IDS ${i} M)
    math(EXPR i "${i} + 1")
    set(pm "ETFORGE_${v}_METHOD_${M}")
    foreach(kind IN ITEMS INPUT OUTPUT)
      set(k 0)
      foreach(name IN LISTS ${pm}_${kind}S)
        set(pt "${pm}_${kind}${k}")
        list(JOIN ${pt}_SHAPE "," shape)
        set(dims)
        foreach(a IN LISTS ${pt}_DYNAMIC_AXES)
          list(APPEND dims "${a}:${${pt}_DIM${a}_MIN}:${${pt}_DIM${a}_MAX}:${${pt}_DIM${a}_NAME}")
        endforeach()
        list(JOIN dims "," dims)
        set(range "-")
        if(DEFINED ${pt}_RANGE)
          list(JOIN ${pt}_RANGE "," range)
        endif()
        if(kind STREQUAL "INPUT")
          set(short in)
        else()
          set(short out)
        endif()
        message("${id} ${m} ${short}${k} ${${pt}_NAME} ${${pt}_DTYPE} shape=${shape} dims=${dims} range=${range}")
        message("${id} ${m} ${short}${k} min_shape=${${pt}_MIN_SHAPE} path=${${pt}_PATH}")
        math(EXPR k "${k} + 1")
      endforeach()
    endforeach()
  endforeach()
endforeach()
"""


def io_lines(index: dict) -> list:
    """The probes' lines (without the extras), from index.json's entries."""

    def number(x):
        return f"{x:g}"

    lines = []
    for entry in index["models"]:
        vid = f"{entry['modelName']}/{entry['backend']}/{entry['quantization']}"
        lines.append(f"{vid} methods " + " ".join(m["name"] for m in entry["methods"]))
        for method in entry["methods"]:
            for kind, tensors in (("in", method["inputs"]), ("out", method["outputs"])):
                for k, t in enumerate(tensors):
                    dims = ",".join(
                        f"{d['axis']}:{d['min']}:{d['max']}:{d['name'] or ''}" for d in t.get("dynamic", [])
                    )
                    rng = ",".join(map(number, t["range"])) if "range" in t else "-"
                    lines.append(
                        f"{vid} {method['name']} {kind}{k} {t['name']} {t['dtype']} "
                        f"shape={','.join(map(str, t['shape']))} dims={dims} range={rng}"
                    )
    return lines


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    project = make_project(tmp_path_factory.mktemp("io_manifests") / "proj", PIPELINE)
    run = project.doit("manifest")
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    project.manifests = project.out / "manifests"
    project.index = json.loads((project.manifests / "index.json").read_text())
    return project


def test_index_json_lists_ranges_and_methods(built):
    lines = io_lines(built.index)
    assert f"{SEQ} forward in0 ids int64 shape=1,64 dims=1:1:64:seq range=0,50" in lines
    assert f"{SEQ} forward in1 x float32 shape=1,64,16 dims=1:1:64:seq range=-" in lines
    assert f"{SEQ2SEQ} methods encode decode" in lines
    assert f"{SEQ2SEQ} decode in0 ids int64 shape=1,4 dims= range=0,20" in lines
    assert f"{SEQ2SEQ} decode out0 output_0 float32 shape=1,4,20 dims= range=-" in lines


def test_dart_carries_the_methods_and_dynamic_dims_of_index_json(built):
    tree = parse_dart((built.manifests / "models.g.dart").read_text())
    assert syntax_errors(tree) == []
    variants = {
        f"{v['model']}/{v['backend']}/{v['quantization']}": v for v in dart_constants(tree, "ModelVariant").values()
    }

    def as_dart(t: dict, output: bool) -> dict:
        out = {"name": t["name"], "shape": t["shape"], "dtype": t["dtype"]}
        if t.get("dynamic"):
            out["dynamicDims"] = [{k: v for k, v in d.items() if v is not None} for d in t["dynamic"]]
        if "range" in t and not output:
            out["range"] = t["range"]
        return out

    for entry in built.index["models"]:
        v = variants[f"{entry['modelName']}/{entry['backend']}/{entry['quantization']}"]
        assert v["methods"] == [
            {
                "name": m["name"],
                "inputs": [as_dart(t, False) for t in m["inputs"]],
                "outputs": [as_dart(t, True) for t in m["outputs"]],
            }
            for m in entry["methods"]
        ]
        assert (v["inputs"], v["outputs"]) == (v["methods"][0]["inputs"], v["methods"][0]["outputs"])
    ids = variants[SEQ]["inputs"][0]
    assert ids["dynamicDims"] == [{"axis": 1, "min": 1, "max": 64, "name": "seq"}] and ids["range"] == [0, 50]
    assert [m["name"] for m in variants[SEQ2SEQ]["methods"]] == ["encode", "decode"]
    assert variants[SEQ2SEQ]["methods"][1]["inputs"][0] == {
        "name": "ids",
        "shape": [1, 4],
        "dtype": "int64",
        "range": [0, 20],
    }


@pytest.mark.skipif(shutil.which("c++") is None, reason="a C++ compiler is needed")
def test_cpp_header_compiles_and_holds_the_methods_and_ranges_of_index_json(built, tmp_path):
    printed = cpp_probe_lines(PROBE_CPP, built.manifests, tmp_path)
    assert [line for line in printed if " first " not in line] == io_lines(built.index)
    assert [line for line in printed if " first " in line] == [f"{SEQ} first 1 1", f"{SEQ2SEQ} first 1 1"]


@pytest.mark.skipif(shutil.which("cmake") is None, reason="cmake is not installed")
def test_cmake_variables_carry_the_methods_and_ranges_of_index_json(built, tmp_path):
    printed = cmake_probe_lines(PROBE_CMAKE, built.manifests / "models.cmake", tmp_path)
    assert [line for line in printed if " min_shape=" not in line] == io_lines(built.index)
    extras = [line for line in printed if " min_shape=" in line]
    assert f"{SEQ} forward in0 min_shape=1;1 path=" in extras
    assert f"{SEQ} forward in1 min_shape=1;1;16 path=" in extras
    assert f"{SEQ} forward out1 min_shape= path=[1]" in extras
    assert f"{SEQ2SEQ} encode in0 min_shape=1;8;16 path=" in extras
