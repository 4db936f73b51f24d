"""Selective build for the shipped set: the operators the programs run outside their delegates, in
ExecuTorch's selective-build format, and a C++ runner linked with only what they need.

The session's SMALL_PIPELINE build (two models, linreg and the small CNN, on xnnpack and portable)
is read, never changed. Each export wrote its program's selected_operators.yaml; the manifest stage
wrote their union and models.cmake's per-variant wheel components. Checked against ExecuTorch's own
tools (gen_oplist on each .pte, gen_all_oplist on the per-program files), then cpp/runner is built
with -DETFORGE_MODELS_CMAKE (it links only the components models.cmake names, checked in the
binary's DT_NEEDED) and runs every variant of both models against the Python runtime.

Building only the selected kernels (etforge_selected_kernels) needs ExecuTorch's C++ sources at the
wheel's revision, which the wheel does not carry and PyPI does not offer: that test runs only with
ETFORGE_TEST_EXECUTORCH_SOURCE_DIR pointing at such a checkout (a directory named executorch). It
builds its own project, SMALL_PIPELINE with int8 too, so that the quantized kernels are selected.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import yaml
from conftest import REPO, SMALL_PIPELINE, make_project
from test_cpp_runner_runs_programs import ATOL, RTOL, of_kind, parse, python_outputs, run_runner
from unit.support import upstream_union

MODELS = {"linreg": (1, 4), "cnn": (1, 3, 8, 8)}
SOURCE_ENV = "ETFORGE_TEST_EXECUTORCH_SOURCE_DIR"

pytestmark = pytest.mark.skipif(
    shutil.which("cmake") is None or shutil.which("c++") is None,
    reason="cmake and a C++ compiler are needed to build cpp/runner",
)


def cmake_vars(path: Path) -> dict:
    """name -> value list of the set(NAME ...) lines of a generated models.cmake."""
    out = {}
    for line in path.read_text().splitlines():
        m = re.match(r"^set\((ETFORGE_[A-Z0-9_]+)(.*)\)$", line)
        if m:
            out[m.group(1)] = [v.strip('"') for v in m.group(2).split()]
    return out


def without_debug_info(document: dict) -> dict:
    ops = {op: {k: v for k, v in entry.items() if k != "debug_info"} for op, entry in document["operators"].items()}
    return {**document, "operators": ops}


@pytest.fixture(scope="module")
def shipped(built_small):
    manifests = built_small.out / "manifests"
    variables = cmake_vars(manifests / "models.cmake")
    return built_small, manifests, variables


def configure_and_build(work: Path, manifests: Path, *extra: str) -> subprocess.CompletedProcess | Path:
    build = work / "build"
    generator = ["-G", "Ninja"] if shutil.which("ninja") else []
    configure = subprocess.run(
        [
            "cmake",
            "-S",
            str(REPO / "cpp" / "runner"),
            "-B",
            str(build),
            *generator,
            "-DCMAKE_BUILD_TYPE=Release",
            f"-DETFORGE_MODELS_HEADER={manifests / 'etforge_models.h'}",
            f"-DETFORGE_MODELS_CMAKE={manifests / 'models.cmake'}",
            f"-DETFORGE_PYTHON={sys.executable}",
            *extra,
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    if configure.returncode != 0:
        return configure
    compiled = subprocess.run(
        ["cmake", "--build", str(build), "--parallel", "2"], capture_output=True, text=True, timeout=1800
    )
    assert compiled.returncode == 0, compiled.stdout + compiled.stderr
    return build / "etforge_runner"


def needed(binary: Path) -> set:
    """The ExecuTorch libraries the binary loads (its DT_NEEDED entries)."""
    dynamic = subprocess.run(["readelf", "-d", str(binary)], capture_output=True, text=True, check=True).stdout
    return set(re.findall(r"\[(lib[^\]]+)\]", dynamic))


def run_every_variant(binary: Path, project, python_runtime, tmp_path: Path) -> dict:
    """Run each model's every variant; assert each ran and matches the Python runtime. id -> variant record."""
    rng = np.random.default_rng(7)
    ran = {}
    for model, shape in MODELS.items():
        x = rng.standard_normal(shape).astype("<f4")
        path = tmp_path / f"{model}.bin"
        path.write_bytes(x.tobytes(order="C"))
        proc = run_runner(binary, project.out, "--input", str(path), "--warmup", "1", "--iterations", "3", model)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        records = parse(proc.stdout)
        variants = of_kind(records, "variant")
        assert variants and all(v["status"] == "ok" for v in variants), variants
        for v in variants:
            ran[v["id"]] = v
            mine = [o for o in of_kind(records, "output") if o["id"] == v["id"]]
            reference = python_outputs(python_runtime, project.out / v["file"], x)
            assert len(mine) == len(reference)
            for out, ref in zip(mine, reference):
                values = np.array([float(s) for s in out["values"].split(",")], dtype=np.float32)
                np.testing.assert_allclose(values, ref.reshape(-1), rtol=RTOL, atol=ATOL)
        ran[f"{model}:runtime"] = of_kind(records, "runtime")[0]
    return ran


@pytest.fixture(scope="module")
def python_runtime():
    import executorch.kernels.quantized  # noqa: F401  (the reference for portable int8 programs needs them)
    from executorch.runtime import Runtime

    return Runtime.get()


# ---------------------------------------------------------------- the lists


def test_each_program_and_the_union_are_what_executorchs_tools_say(shipped, tmp_path):
    project, manifests, variables = shipped
    ids = variables["ETFORGE_VARIANTS"]
    assert len(ids) == 4
    listed = []
    for v in ids:
        pte = Path(variables[f"ETFORGE_{v}_PTE"][0].replace("${ETFORGE_MODELS_DIR}", str(project.out)))
        own = Path(variables[f"ETFORGE_{v}_SELECTED_OPERATORS"][0].replace("${ETFORGE_MODELS_DIR}", str(project.out)))
        listed.append(str(own))
        mine = yaml.safe_load(own.read_text())
        upstream_file = tmp_path / f"{v}.yaml"
        subprocess.run(
            [
                sys.executable,
                "-m",
                "executorch.codegen.tools.gen_oplist",
                "--model_file_path",
                str(pte),
                "--output_path",
                str(upstream_file),
            ],
            check=True,
            capture_output=True,
        )
        upstream = yaml.safe_load(upstream_file.read_text())
        assert without_debug_info(mine) == without_debug_info(upstream)
        backend = variables[f"ETFORGE_{v}_BACKEND"][0]
        ops = variables.get(f"ETFORGE_{v}_OPERATORS", [])
        assert ops == sorted(mine["operators"])
        components = variables[f"ETFORGE_{v}_PACKAGE_COMPONENTS"]
        if backend == "xnnpack":  # fully delegated: no kernel library
            assert ops == [] and components == ["runtime", "backend_xnnpack"]
        else:
            assert "aten::addmm.out" in ops and components == ["runtime", "kernels_optimized"]
            assert all(
                entry["debug_info"] == [variables[f"ETFORGE_{v}_MODEL"][0] + "/portable/fp32"]
                for entry in mine["operators"].values()
            )
    # the union: gen_all_oplist over the per-program files
    upstream = upstream_union(listed, tmp_path)
    union = yaml.safe_load((manifests / "selected_operators.yaml").read_text())
    assert without_debug_info(union) == without_debug_info(upstream)
    assert {"aten::convolution.out", "aten::addmm.out"} <= set(union["operators"])
    assert union["operators"]["aten::convolution.out"]["debug_info"] == ["cnn/portable/fp32"]
    assert union["operators"]["aten::addmm.out"]["debug_info"] == ["cnn/portable/fp32", "linreg/portable/fp32"]
    assert variables["ETFORGE_PACKAGE_COMPONENTS"] == ["runtime", "kernels_optimized", "backend_xnnpack"]
    assert variables.get("ETFORGE_UNRESOLVED_OPERATORS", []) == []


# ---------------------------------------------------------------- the runner, linked with the list


def test_runner_links_only_the_listed_components_and_runs_every_variant(shipped, python_runtime, tmp_path):
    project, manifests, variables = shipped
    start = time.monotonic()
    binary = configure_and_build(tmp_path, manifests)
    assert isinstance(binary, Path), binary.stdout + binary.stderr
    print(f"\nselective runner configured and built in {time.monotonic() - start:.1f}s")
    libs = {lib for lib in needed(binary) if lib.startswith("libexecutorch")}
    assert libs == {"libexecutorch.so", "libexecutorch_kernels_optimized.so", "libexecutorch_backend_xnnpack.so"}
    ran = run_every_variant(binary, project, python_runtime, tmp_path)
    assert sorted(k for k in ran if ":" not in k) == sorted(
        f"{m}/{b}/fp32" for m in MODELS for b in ("xnnpack", "portable")
    )
    # only the delegate the programs use registered (the full runner registers QNN and OpenVINO too)
    assert ran["cnn:runtime"]["registered"] == "XnnpackBackend"


def test_the_list_is_what_makes_them_run(shipped, tmp_path):
    """Linked for the XNNPACK variants only (no kernel library), a portable program fails to load."""
    project, manifests, variables = shipped
    xnnpack = [v for v in variables["ETFORGE_VARIANTS"] if variables[f"ETFORGE_{v}_BACKEND"] == ["xnnpack"]]
    binary = configure_and_build(tmp_path, manifests, f"-DETFORGE_RUNNER_VARIANTS={';'.join(xnnpack)}")
    assert isinstance(binary, Path), binary.stdout + binary.stderr
    assert {lib for lib in needed(binary) if lib.startswith("libexecutorch")} == {
        "libexecutorch.so",
        "libexecutorch_backend_xnnpack.so",
    }
    proc = run_runner(binary, project.out, "--warmup", "0", "--iterations", "1", "linreg")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    by_id = {v["id"]: v for v in of_kind(parse(proc.stdout), "variant")}
    assert by_id["linreg/xnnpack/fp32"]["status"] == "ok"
    assert by_id["linreg/portable/fp32"]["status"] == "failed"
    assert "aten::addmm.out" in proc.stdout + proc.stderr  # the missing operator is named


# ---------------------------------------------------------------- only the selected kernels


def test_selected_kernels_need_a_source_checkout_and_say_so_in_one_line(shipped, tmp_path):
    project, manifests, variables = shipped
    result = configure_and_build(tmp_path, manifests, "-DETFORGE_RUNNER_SELECTED_KERNELS=ON")
    assert isinstance(result, subprocess.CompletedProcess) and result.returncode != 0
    errors = [line.strip() for line in result.stderr.splitlines() if "etforge_selected_kernels:" in line]
    assert errors == [
        "etforge_selected_kernels: set EXECUTORCH_SOURCE_DIR to an ExecuTorch checkout at the wheel's revision "
        '(python -c "import executorch.version as v; print(v.git_version)"); the pip wheel has no kernel sources'
    ], result.stderr


@pytest.fixture(scope="module")
def shipped_int8(tmp_path_factory):
    """SMALL_PIPELINE with int8 too: the portable int8 programs need the quantized kernels."""
    project = make_project(
        tmp_path_factory.mktemp("selective_int8") / "proj",
        SMALL_PIPELINE.replace("quantization: [fp32]", "quantization: [fp32, int8]"),
    )
    run = project.doit()
    assert run.returncode == 0, run.stdout + run.stderr
    manifests = project.out / "manifests"
    return project, manifests, cmake_vars(manifests / "models.cmake")


@pytest.mark.skipif(
    not os.environ.get(SOURCE_ENV),
    reason=f"building only the selected kernels needs ExecuTorch's C++ sources at the wheel's revision "
    f"(executorch.version.git_version), which neither the pip wheel nor PyPI carry: set {SOURCE_ENV}",
)
def test_runner_with_only_the_selected_kernels_runs_every_variant(shipped_int8, python_runtime, tmp_path):
    project, manifests, variables = shipped_int8
    assert variables["ETFORGE_PACKAGE_COMPONENTS"] == [
        "runtime",
        "kernels_optimized",
        "kernels_quantized",
        "backend_xnnpack",
    ]
    start = time.monotonic()
    binary = configure_and_build(
        tmp_path, manifests, "-DETFORGE_RUNNER_SELECTED_KERNELS=ON", f"-DEXECUTORCH_SOURCE_DIR={os.environ[SOURCE_ENV]}"
    )
    assert isinstance(binary, Path), binary.stdout + binary.stderr
    print(f"\nrunner with the selected kernels configured and built in {time.monotonic() - start:.1f}s")
    libs = {lib for lib in needed(binary) if "executorch" in lib or "etforge" in lib}
    assert libs == {
        "libexecutorch.so",
        "libexecutorch_backend_xnnpack.so",
        "libetforge_runner_kernels_portable.so",
        "libetforge_runner_kernels_quantized.so",
    }  # not the wheel's kernel libraries
    for family in ("portable", "quantized"):
        print(
            f"selected {family} kernels: {(binary.parent / f'libetforge_runner_kernels_{family}.so').stat().st_size} B"
        )
    ran = run_every_variant(binary, project, python_runtime, tmp_path)
    assert len([k for k in ran if ":" not in k]) == 8


# ---------------------------------------------------------------- an app's CMake

APP_CMAKELISTS = """\
cmake_minimum_required(VERSION 3.19)
project(app CXX)
find_package(executorch CONFIG REQUIRED PATHS "${EXECUTORCH_ROOT}/share/cmake" NO_DEFAULT_PATH)
set(ETFORGE_INSTALL_MODELS OFF)
include("${MODELS_CMAKE}")
add_executable(app main.cpp)
etforge_link_package_components(app ${APP_VARIANTS})
set_target_properties(app PROPERTIES BUILD_RPATH "${EXECUTORCH_RUNTIME_LIBRARY_DIR}")
"""


def test_an_app_links_the_components_of_the_variants_it_ships(shipped, tmp_path):
    """models.cmake's etforge_link_package_components, in a plain app: per variant list, and a bad name."""
    project, manifests, variables = shipped
    from importlib.util import find_spec

    root = list(find_spec("executorch").submodule_search_locations)[0]
    (tmp_path / "CMakeLists.txt").write_text(APP_CMAKELISTS)
    (tmp_path / "main.cpp").write_text("int main() { return 0; }\n")
    portable = next(v for v in variables["ETFORGE_VARIANTS"] if variables[f"ETFORGE_{v}_BACKEND"] == ["portable"])

    def build(variants: str, name: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [
                "cmake",
                "-S",
                str(tmp_path),
                "-B",
                str(tmp_path / name),
                f"-DEXECUTORCH_ROOT={root}",
                f"-DMODELS_CMAKE={manifests / 'models.cmake'}",
                f"-DAPP_VARIANTS={variants}",
            ],
            capture_output=True,
            text=True,
            timeout=300,
        )

    configured = build(portable, "one")
    assert configured.returncode == 0, configured.stdout + configured.stderr
    compiled = subprocess.run(["cmake", "--build", str(tmp_path / "one")], capture_output=True, text=True, timeout=300)
    assert compiled.returncode == 0, compiled.stdout + compiled.stderr
    # (libexecutorch.so itself only where the app calls it: this one does not, the kernels need it anyway)
    assert {lib for lib in needed(tmp_path / "one" / "app") if "executorch" in lib} - {"libexecutorch.so"} == {
        "libexecutorch_kernels_optimized.so"
    }
    wrong = build("NO_SUCH_VARIANT", "wrong")
    assert wrong.returncode != 0
    assert " etforge: unknown variant NO_SUCH_VARIANT; known: " in wrong.stderr, wrong.stderr
