"""Which wheel libraries a program's operators need, and their union in ExecuTorch's selective-build format.

etforge.program.kernels decides by namespace; these tests hold it to what the installed wheel
ships (its kernel yamls, the prim ops its runtime library registers) and its union to what
upstream's gen_all_oplist makes of the same per-program files (run in a subprocess: the unit tier
imports no executorch).
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest
import yaml

from etforge.program import kernels
from unit.support import upstream_union

# What gen_oplist lists for the small CNN lowered to portable kernels with int8 weights, and for a
# dynamic-batch XNNPACK program (measured, executorch 1.5.1).
PORTABLE_INT8 = {
    "aten::addmm.out": ["v1/6;0|6;0,1|6;0,1|6;0,1|6;0,1"],
    "aten::convolution.out": ["v1/6;0,1,2,3|6;0,1,2,3|6;0|6;0,1,2,3|6;0,1,2,3"],
    "quantized_decomposed::dequantize_per_channel.out": [
        "v1/1;0,1,2,3|6;0|4;0|6;0,1,2,3|6;0,1,2,3",
        "v1/1;0,1|6;0|4;0|6;0,1|6;0,1",
    ],
    "quantized_decomposed::quantize_per_tensor.out": ["v1/6;0,1|1;0,1|1;0,1"],
}
PORTABLE_FP32 = {
    "aten::addmm.out": ["v1/6;0|6;0,1|6;0,1|6;0,1|6;0,1"],
    "aten::convolution.out": ["v1/6;0,1,2,3|6;0,1,2,3|6;0,1,2,3|6;0,1,2,3"],
}
XNNPACK_DYNAMIC = {"aten::sym_size.int": ["v1/6;0,1,2,3"], "executorch_prim::et_view.default": ["v1/6;0,1,2,3|6;0,1"]}


def wheel_dir() -> Path:
    spec = importlib.util.find_spec("executorch")  # a namespace package: found, not imported
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("executorch is not installed")
    return Path(list(spec.submodule_search_locations)[0])


def declared(functions_yaml: Path) -> set:
    ops = set()
    for entry in yaml.safe_load(functions_yaml.read_text()) or []:
        name = entry.get("op") or entry["func"].split("(")[0]
        ops.add(name if "::" in name else "aten::" + name)
    return ops


def test_each_operator_goes_to_the_wheel_library_that_registers_it():
    root = wheel_dir()
    portable = declared(root / "kernels/portable/functions.yaml")
    quantized = declared(root / "kernels/quantized/quantized.yaml")
    assert len(portable) >= 200 and len(quantized) >= 10
    assert {kernels.library_of(op) for op in portable} == {kernels.OPTIMIZED}
    assert {kernels.library_of(op) for op in quantized} == {kernels.QUANTIZED}
    # the prim ops the runtime library registers itself (op names: lower case; not C++ names like aten::elementSize)
    runtime = (root / "lib/libexecutorch.so").read_bytes()
    prim = {
        m.decode()
        for m in re.findall(rb"(?:executorch_prim|aten)::[a-z_0-9]+(?![A-Za-z])(?:\.[A-Za-z_0-9]+)?", runtime)
    }
    assert "executorch_prim::et_view.default" in prim and "aten::sym_size.int" in prim
    assert {kernels.library_of(op) for op in prim} == {kernels.RUNTIME}
    assert kernels.library_of("llama::custom_sdpa.out") is None


def test_components_follow_the_operators_and_the_delegates():
    assert kernels.package_components({}, ["executorch::backend_xnnpack"]) == ("runtime", "backend_xnnpack")
    assert kernels.package_components(XNNPACK_DYNAMIC, ["executorch::backend_xnnpack"]) == (
        "runtime",
        "backend_xnnpack",
    )  # prim ops only: no kernel library
    assert kernels.package_components(PORTABLE_FP32, []) == ("runtime", "kernels_optimized")
    assert kernels.package_components(PORTABLE_INT8, []) == ("runtime", "kernels_optimized", "kernels_quantized")
    custom = {**PORTABLE_FP32, "llama::update_cache.out": []}
    assert kernels.kernel_components(custom) == (("kernels_optimized",), ("llama::update_cache.out",))
    union = kernels.union_components(
        [("runtime", "backend_xnnpack"), ("runtime", "kernels_quantized"), ("runtime", "kernels_optimized")]
    )
    assert union == ("runtime", "kernels_optimized", "kernels_quantized", "backend_xnnpack")


def test_the_union_is_what_gen_all_oplist_makes_of_the_per_program_files(tmp_path):
    wheel_dir()
    programs = {
        "cnn/portable/int8": PORTABLE_INT8,
        "cnn/portable/fp32": PORTABLE_FP32,
        "cnn/xnnpack/dyn": XNNPACK_DYNAMIC,
    }
    listed = []
    for name, operators in programs.items():
        path = tmp_path / (name.replace("/", "_") + ".yaml")
        path.write_text(yaml.safe_dump(kernels.selection(operators, [name]), default_flow_style=False))
        listed.append(str(path))
    upstream = upstream_union(listed, tmp_path)
    mine = kernels.union_selection(programs)
    # debug_info: upstream names each per-program file, etforge the programs themselves
    paths = {str(Path(p).resolve()): name for p, name in zip(listed, programs)}
    for entry in upstream["operators"].values():
        entry["debug_info"] = sorted(paths[p] for p in entry["debug_info"])
    assert mine == upstream
    # both fp32 and int8 convolutions' dtype keys are kept; addmm is run by two programs
    assert len(mine["et_kernel_metadata"]["aten::convolution.out"]) == 2
    assert mine["operators"]["aten::addmm.out"]["debug_info"] == ["cnn/portable/fp32", "cnn/portable/int8"]
