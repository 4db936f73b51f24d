"""cpp/runner: the C++ multi-backend runner, built with CMake against the pip wheel's runtime.

One small project (linreg and the small CNN on xnnpack and portable, fp32) is
exported and validated once per module; its etforge_models.h (etforge.publish.manifests.cpp_header) is rendered
with two hand-made additions: a `vulkan` variant (delegate VulkanBackend, which
this runtime lacks) pointing at the linreg XNNPACK program, and a model whose
only variant records a wrong sha256. The runner is configured and built once
(Release, in a temp dir), run on each model with an input file written here, and
its outputs are compared with executorch.runtime's on the same input.
"""

from __future__ import annotations

import copy
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import REPO, copy_project, cpp_probe_lines, make_project

from etforge.cache.records import read_state
from etforge.config.resolve import resolve
from etforge.pipeline.specs import spec_of
from etforge.program.compat import load_window
from etforge.publish import literals
from etforge.publish.manifests import cpp_header

MODELS = {"linreg": (1, 4), "cnn": (1, 3, 8, 8)}
BACKENDS = ("xnnpack", "portable")
FAKE_VULKAN = "linreg/vulkan/fp32"
TAMPERED = "linreg_tampered"
FUTURE = "linreg_future"  # built by a (pretend) ExecuTorch 9.0: outside this runtime's load window
RTOL, ATOL = 1e-5, 1e-6
RUN_ARGS = ("--warmup", "3", "--iterations", "20", "--values", "-1")

pytestmark = pytest.mark.skipif(
    shutil.which("cmake") is None or shutil.which("c++") is None,
    reason="cmake and a C++ compiler are needed to build cpp/runner",
)


# ---------------------------------------------------------------- helpers


def parse(stdout: str) -> list:
    """The runner's records: (kind, {key: value}) per stdout line."""
    records = []
    for line in stdout.splitlines():
        kind, *fields = line.split("\t")
        records.append((kind, dict(f.split("=", 1) for f in fields)))
    return records


def of_kind(records: list, kind: str) -> list:
    return [fields for k, fields in records if k == kind]


def run_runner(binary: Path, models_dir: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(binary), "--models-dir", str(models_dir), *args], capture_output=True, text=True, timeout=300
    )


def cmake(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["cmake", *args], capture_output=True, text=True, timeout=600)


# ---------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def built(built_small, tmp_path_factory):
    """The session's SMALL_PIPELINE build, validated (a variant ships with its verdict), copied."""
    project = copy_project(built_small, tmp_path_factory.mktemp("cpp_runner") / "proj")
    project.plan = resolve(project.pipeline)
    return project


@pytest.fixture(scope="module")
def context(built) -> dict:
    """The real header context plus the hand-made variants described in the module docstring."""
    ctx = cpp_header.header_context(built.plan)
    linreg = next(m for m in ctx["models"] if m["name"] == "linreg")
    xnnpack = next(v for v in linreg["variants"] if v["backend"] == "xnnpack")
    vulkan = copy.deepcopy(xnnpack)
    vulkan.update(id=FAKE_VULKAN, backend="vulkan", recipe="vulkan", delegates=["VulkanBackend"])
    linreg["variants"].insert(0, vulkan)  # vulkan comes first in the desktop order
    tampered = copy.deepcopy(next(v for v in linreg["variants"] if v["backend"] == "portable"))
    tampered.update(id=f"{TAMPERED}/portable/fp32", model=TAMPERED, sha256="0" * 64)
    ctx["models"].append({"name": TAMPERED, "variants": [tampered]})
    future = copy.deepcopy(next(v for v in linreg["variants"] if v["backend"] == "portable"))
    future.update(id=f"{FUTURE}/portable/fp32", model=FUTURE, built_by="9.0.0", runtime_min="9.0", runtime_max="9.1")
    ctx["models"].append({"name": FUTURE, "variants": [future]})
    return ctx


@pytest.fixture(scope="module")
def runner(context, tmp_path_factory) -> Path:
    work = tmp_path_factory.mktemp("runner_build")
    header = work / cpp_header.HEADER_NAME
    header.write_text(cpp_header.render_context(context))
    build = work / "build"
    generator = ["-G", "Ninja"] if shutil.which("ninja") else []
    start = time.monotonic()
    configure = cmake(
        "-S",
        str(REPO / "cpp" / "runner"),
        "-B",
        str(build),
        *generator,
        "-DCMAKE_BUILD_TYPE=Release",
        f"-DETFORGE_MODELS_HEADER={header}",
        f"-DETFORGE_PYTHON={sys.executable}",
    )
    assert configure.returncode == 0, configure.stdout + configure.stderr
    compiled = cmake("--build", str(build), "--parallel", "2")
    assert compiled.returncode == 0, compiled.stdout + compiled.stderr
    binary = build / "etforge_runner"
    assert binary.is_file()
    print(f"\nrunner configured and built in {time.monotonic() - start:.1f}s")
    return binary


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> dict:
    """model -> (array, .bin path): seeded float32, raw little-endian, C order."""
    work = tmp_path_factory.mktemp("inputs")
    rng = np.random.default_rng(1234)
    out = {}
    for model, shape in MODELS.items():
        x = rng.standard_normal(shape).astype("<f4")
        path = work / f"{model}.bin"
        path.write_bytes(x.tobytes(order="C"))
        out[model] = (x, path)
    return out


@pytest.fixture(scope="module")
def python_runtime():
    from executorch.runtime import Runtime

    return Runtime.get()


def python_outputs(runtime, pte: Path, x: np.ndarray) -> list:
    import torch

    program = runtime.load_program(pte.read_bytes())  # kept alive while the method runs
    method = program.load_method("forward")
    return [t.detach().numpy().copy() for t in method.execute([torch.from_numpy(x.copy()).contiguous()])]


# ---------------------------------------------------------------- the header


def test_header_lists_built_cells_in_fallback_order_from_the_state_records(built):
    plan = built.plan
    text = cpp_header.render_header(plan)
    assert text == cpp_header.render_header(plan, plan.cells)  # deterministic
    assert str(built.root) not in text and "artifacts/t" not in text  # no absolute paths
    ctx = cpp_header.header_context(plan)
    assert [m["name"] for m in ctx["models"]] == list(MODELS)
    for model in ctx["models"]:
        assert [v["backend"] for v in model["variants"]] == ["xnnpack", "portable"]  # desktop order
        for v in model["variants"]:
            cell = next(c for c in plan.cells if c.name == v["id"])
            info = read_state(spec_of(plan, "export", cell).state_file)["info"]
            assert (v["sha256"], v["size"]) == (info["sha256"], info["size_bytes"])
            assert v["sha256"] in text and f"{v['size']}u" in text
            assert v["file"] == f"{cell.model.name}/{cell.stem}.pte"
            assert (built.out / v["file"]).stat().st_size == v["size"]
            assert v["delegates"] == (["XnnpackBackend"] if v["backend"] == "xnnpack" else [])
            assert v["inputs"] == [
                {"name": i.name, "shape": list(i.shape), "dtype": "float32"} for i in cell.model.inputs
            ]
            assert v["num_outputs"] == 1 and v["listed"] is True
    # A configurable order; unlisted variants follow (or are left out).
    swapped = cpp_header.header_context(plan, order=["portable/fp32", "xnnpack"])
    assert [v["backend"] for v in swapped["models"][0]["variants"]] == ["portable", "xnnpack"]
    only = cpp_header.header_context(plan, order=["xnnpack"], append_unlisted=False)
    assert [v["id"] for m in only["models"] for v in m["variants"]] == ["linreg/xnnpack/fp32", "cnn/xnnpack/fp32"]
    tail = cpp_header.header_context(plan, order=["xnnpack"])
    assert [(v["backend"], v["listed"]) for v in tail["models"][1]["variants"]] == [
        ("xnnpack", True),
        ("portable", False),
    ]
    flat = cpp_header.header_context(plan, [c for c in plan.cells if c.model.name == "cnn"], layout="flat")
    assert [v["file"] for m in flat["models"] for v in m["variants"]] == [
        "cnn_xnnpack_fp32.pte",
        "cnn_portable_fp32.pte",
    ]
    with pytest.raises(cpp_header.HeaderError, match="unknown quantization 'int4'"):
        cpp_header.header_context(plan, order=["xnnpack/int4"])


def test_header_leaves_out_unbuilt_cells_and_escapes_strings(built, tmp_path):
    plan = built.plan
    cnn_xnnpack = next(c for c in plan.cells if c.name == "cnn/xnnpack/fp32")
    state = spec_of(plan, "export", cnn_xnnpack).state_file
    saved = state.read_bytes()
    try:
        state.unlink()
        ctx = cpp_header.header_context(plan)
    finally:
        state.write_bytes(saved)
    assert [v["id"] for m in ctx["models"] for v in m["variants"]] == [
        "linreg/xnnpack/fp32",
        "linreg/portable/fp32",
        "cnn/portable/fp32",
    ]
    assert ctx["excluded"] == [
        {"cell": "cnn/xnnpack/fp32", "reason": "not built: run `etforge export:cnn/xnnpack/fp32`"}
    ]
    assert literals.c_string('a"b\\c?\n\u00e9') == '"a\\"b\\\\c\\?\\012\\303\\251"'
    assert literals.c_comment("x\ny\\") == "x y"


# ---------------------------------------------------------------- the runner


@pytest.mark.parametrize("model", list(MODELS))
def test_runner_runs_each_runnable_variant_and_matches_the_python_runtime(
    model, built, runner, inputs, python_runtime, context
):
    x, path = inputs[model]
    proc = run_runner(runner, built.out, "--input", str(path), *RUN_ARGS, model)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    records = parse(proc.stdout)
    assert records[0][0] == "etforge-runner" and records[0][1]["pipeline"] == "t"
    registered = set(of_kind(records, "runtime")[0]["registered"].split(","))
    python_registered = set(python_runtime.backend_registry.registered_backend_names)
    assert "XnnpackBackend" in registered and "VulkanBackend" not in registered

    expected = next(m for m in context["models"] if m["name"] == model)["variants"]
    variants = of_kind(records, "variant")
    assert [v["id"] for v in variants] == [v["id"] for v in expected]  # fallback order, every variant tried
    outputs = of_kind(records, "output")
    ran = []
    for spec, got in zip(expected, variants):
        if spec["id"] == FAKE_VULKAN:
            assert got["status"] == "skipped"
            assert got["reason"].startswith("delegate VulkanBackend is not registered in this runtime")
            continue
        # Skipped none wrongly: every variant whose delegates the runtime has, ran.
        assert set(spec["delegates"]) <= python_registered
        assert got["status"] == "ok", got
        assert got["repeatable"] == "1" and int(got["iterations"]) == 20
        assert got["delegates"] == ",".join(spec["delegates"])
        # The planned arena the runtime's MethodMeta reports is the one the export recorded.
        cell = next(c for c in built.plan.cells if c.name == spec["id"])
        export = read_state(spec_of(built.plan, "export", cell).state_file)["info"]
        assert got["planned"] == ",".join(map(str, export["costs"]["planned_bytes"]["forward"])) != ""
        assert int(got["planned"].split(",")[0]) == spec["planned_bytes"] > 0
        # MethodMeta lists one backend per delegated subgraph: as many as the export counted.
        called = [d for d in got["delegates"].split(",") if d]
        assert {d: called.count(d) for d in called} == export["costs"]["delegate_subgraphs"]
        assert (
            sum(export["costs"]["size_breakdown"]["delegates"].values())
            + export["costs"]["size_breakdown"]["constants"]
            + export["costs"]["size_breakdown"]["program"]
            == (built.out / spec["file"]).stat().st_size
        )
        assert 0 < float(got["min_ms"]) <= float(got["mean_ms"]) <= float(got["max_ms"])
        ran.append(got["id"])
        mine = [o for o in outputs if o["id"] == spec["id"]]
        reference = python_outputs(python_runtime, built.out / spec["file"], x)
        assert len(mine) == len(reference) == spec["num_outputs"]
        for out, ref in zip(mine, reference):
            assert out["dtype"] == "float32" and out["shape"] == ",".join(map(str, ref.shape))
            assert int(out["numel"]) == int(out["shown"]) == ref.size
            values = np.array([float(v) for v in out["values"].split(",")], dtype=np.float32)
            np.testing.assert_allclose(values, ref.reshape(-1), rtol=RTOL, atol=ATOL)
    assert ran == [f"{model}/{b}/fp32" for b in BACKENDS]

    ranking = of_kind(records, "rank")
    assert [r["position"] for r in ranking] == [str(i + 1) for i in range(len(ran))]
    assert sorted(r["id"] for r in ranking) == sorted(ran)
    means = [float(r["mean_ms"]) for r in ranking]
    assert means == sorted(means) and ranking[0]["vs_fastest"] == "1.00x"
    by_id = {v["id"]: v for v in variants}
    assert all(r["mean_ms"] == by_id[r["id"]]["mean_ms"] for r in ranking)
    summary = of_kind(records, "summary")[0]
    skipped = 1 if model == "linreg" else 0
    assert (summary["ok"], summary["skipped"], summary["failed"]) == (str(len(ran)), str(skipped), "0")
    assert summary["chosen"] == f"{model}/xnnpack/fp32" and summary["fastest"] == ranking[0]["id"]


def test_first_stops_at_the_first_variant_that_runs(built, runner):
    proc = run_runner(runner, built.out, "--first", "--warmup", "0", "--iterations", "1", "linreg")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    statuses = [(v["id"], v["status"]) for v in of_kind(parse(proc.stdout), "variant")]
    assert statuses == [(FAKE_VULKAN, "skipped"), ("linreg/xnnpack/fp32", "ok"), ("linreg/portable/fp32", "not-tried")]


def test_a_changed_file_fails_its_sha256_check_unless_only_the_size_is_checked(built, runner):
    proc = run_runner(runner, built.out, "--warmup", "0", "--iterations", "1", TAMPERED)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    (variant,) = of_kind(parse(proc.stdout), "variant")
    assert variant["status"] == "failed" and f"the header says {'0' * 64}" in variant["reason"]
    assert of_kind(parse(proc.stdout), "rank") == []
    sized = run_runner(runner, built.out, "--verify", "size", "--warmup", "0", "--iterations", "1", TAMPERED)
    assert sized.returncode == 0, sized.stdout + sized.stderr
    assert of_kind(parse(sized.stdout), "variant")[0]["status"] == "ok"


def test_a_variant_outside_the_runtimes_load_window_is_skipped_with_why(built, runner):
    proc = run_runner(runner, built.out, "--warmup", "0", "--iterations", "1", FUTURE)
    assert proc.returncode == 3, proc.stdout + proc.stderr  # no variant this runtime can run
    records = parse(proc.stdout)
    runtime = records[0][1]["runtime_version"]
    assert runtime.startswith("1.")
    (variant,) = of_kind(records, "variant")
    assert variant["status"] == "skipped"
    assert variant["reason"] == (
        f"built by ExecuTorch 9.0.0: runtime {runtime} is outside its load window 9.0.x-9.1.x "
        "(ExecuTorch's compatibility policy)"
    )


def test_a_release_for_an_older_app_runtime_refuses_each_variant_outside_its_window(built, tmp_path):
    copy = copy_project(built, tmp_path / "proj")
    copy.write_pipeline(copy.pipeline.read_text() + 'manifests: {app_runtime: ["1.5.0", "1.4.0"]}\n')
    run = copy.doit("release")
    assert run.returncode != 0, run.stdout + run.stderr
    assert not any(t.startswith(("capture:", "export:", "validate:")) for t in run.started)  # nothing rebuilt
    plan = resolve(copy.pipeline)
    built_by = {
        c.name: read_state(spec_of(plan, "export", c).state_file)["info"]["executorch_version"] for c in plan.cells
    }
    first, last = load_window(built_by["linreg/xnnpack/fp32"])
    assert first != "1.4"  # this wheel's programs are not promised to load on 1.4
    lines = run.stderr[run.stderr.index("release refused: ") :].splitlines()
    assert lines[0] == f"release refused: {len(plan.cells)} variant(s) may not load on the app's runtime:"
    assert sorted(line for line in lines[1:] if line.startswith("  ")) == sorted(
        f"  {cell}: built by ExecuTorch {version}: runtime 1.4.0 is outside its load window {first}.x-{last}.x "
        "(ExecuTorch's compatibility policy) (manifests.app_runtime)"
        for cell, version in built_by.items()
    )
    assert not (copy.root / "artifacts" / "release" / "t-0.0.1.tar.gz").exists()


def test_a_planned_memory_budget_under_the_real_arena_fails_the_cell_without_a_rebuild(built, tmp_path):
    copy = copy_project(built, tmp_path / "proj")
    plan = resolve(copy.pipeline)
    cell = next(c for c in plan.cells if c.name == "cnn/portable/fp32")
    planned = sum(read_state(spec_of(plan, "export", cell).state_file)["info"]["costs"]["planned_bytes"]["forward"])
    copy.write_pipeline(copy.pipeline.read_text() + f"gates: {{max_planned_bytes: {{portable: {planned - 1}}}}}\n")
    run = copy.doit("manifest")
    assert run.started == {"manifest"}, run.stdout  # a budget changes no program: nothing is rebuilt
    assert run.returncode != 0, run.stdout  # a cell over budget fails the run
    reason = f"over budget: planned memory {planned} B > gates.max_planned_bytes.portable {planned - 1} B"
    assert reason in run.stdout + run.stderr
    index = json.loads((copy.out / "manifests" / "index.json").read_text())
    assert {"cell": "cnn/portable/fp32", "status": "failed", "reason": reason} in index["excluded"]
    assert "cnn_portable_fp32.pte" not in [m["name"] for m in index["models"]]


def test_bad_input_file_unknown_model_and_missing_models_dir(built, runner, inputs):
    wrong = run_runner(runner, built.out, "--input", str(inputs["cnn"][1]), "--iterations", "1", "linreg")
    assert wrong.returncode == 1
    reasons = [v.get("reason", "") for v in of_kind(parse(wrong.stdout), "variant") if v["status"] == "failed"]
    assert len(reasons) == 2 and all("holds 768 bytes, the input takes 16" in r for r in reasons)
    unknown = run_runner(runner, built.out, "nosuchmodel")
    assert (
        unknown.returncode == 2
        and "unknown model 'nosuchmodel'; the header has: linreg, cnn, linreg_tampered, linreg_future" in unknown.stderr
    )
    missing = run_runner(runner, built.root / "nowhere", "--iterations", "1", "cnn")
    assert missing.returncode == 1
    assert all(
        v["status"] == "failed" and "cannot open" in v["reason"] for v in of_kind(parse(missing.stdout), "variant")
    )


# ---------------------------------------------------------------- order rules, without exporting

CHAIN_PIPELINE = """\
name: c
version: 0.0.1
models:
  linreg:
    python: models.linreg:build
    inputs: [{name: features, shape: [1, 4]}]
backends:
  vk_xnn: {chain: [vulkan, xnnpack]}
  portable: {}
  fast: {recipe: xnnpack}
quantization: [fp32]
targets: false  # the records are faked: no aarch64 verdict to fake beside them
"""


def fake_export(plan, cell, status="ok"):
    """State records for ``cell``'s export under its current key, as run_cached writes them, and
    for an ok export its verdict: validated here, or a bundle for the device (not runnable here)."""
    import hashlib
    import json

    spec = spec_of(plan, "export", cell)
    info = {
        "size_bytes": 100 + len(cell.name),
        "sha256": hashlib.sha256(cell.name.encode()).hexdigest(),
        "delegates": list(cell.backend.delegates),
        "input_dtypes": ["float32"],
    }
    spec.state_file.parent.mkdir(parents=True, exist_ok=True)
    spec.state_file.write_text(
        json.dumps(
            {
                "task": spec.name,
                "key": spec.key,
                "status": status,
                "info": info if status == "ok" else {},
                "outputs": {},
            }
        )
    )
    if status != "ok":
        return
    check = spec_of(plan, "validate", cell)
    if cell.backend.host_runnable:
        record = {
            "status": "ok",
            "info": {
                "program_sha256": info["sha256"],
                "checks": [
                    {
                        "check": "numerics",
                        "max_abs_error": 0.0,
                        "cosine": 1.0,
                        "inputs": "random (seeded)",
                        "samples": 1,
                        "passed": True,
                    }
                ],
            },
        }
    else:
        record = {
            "status": "not-runnable",
            "outputs": {"program.bpte": {"sha256": "b" * 64}},
            "info": {
                "program_sha256": info["sha256"],
                "checks": [
                    {"check": "on_device", "inputs": "random (seeded)", "test_cases": 1, "rtol": 0.0, "atol": 1e-4}
                ],
            },
        }
    check.state_file.write_text(json.dumps({"task": check.name, "key": check.key, **record}))


def test_chains_are_ordered_by_their_own_name_and_odd_strings_compile(tmp_path):
    project = make_project(tmp_path / "proj", CHAIN_PIPELINE)
    plan = resolve(project.pipeline)
    for cell in plan.cells:
        fake_export(plan, cell, status="failed" if cell.backend.name == "portable" else "ok")
    ctx = cpp_header.header_context(plan)  # default order: vulkan, openvino, xnnpack, portable
    (model,) = ctx["models"]
    # `fast` is an xnnpack recipe: listed as xnnpack. The chain starts with vulkan but is not `vulkan`.
    assert [(v["backend"], v["listed"]) for v in model["variants"]] == [("fast", True), ("vk_xnn", False)]
    assert model["variants"][1]["delegates"] == ["VulkanBackend", "XnnpackBackend"]
    assert model["variants"][1]["num_outputs"] == -1  # no capture record: unknown
    assert ctx["excluded"] == [{"cell": "linreg/portable/fp32", "reason": "failed: export:linreg/portable/fp32 failed"}]
    assert [(v["verdict"], v["bundle_sha256"], v["atol"]) for v in model["variants"]] == [
        ("provisional", "", None),
        ("on-device", "b" * 64, 1e-4),
    ]
    named = cpp_header.header_context(plan, order=["vk_xnn", "fast"], append_unlisted=False)
    assert [v["backend"] for v in named["models"][0]["variants"]] == ["vk_xnn", "fast"]

    # Strings that would break a naive template, compiled by the real compiler.
    odd = copy.deepcopy(ctx)
    odd["pipeline"] = 'a "quoted" \\ name ??/ */ \u00e9\n'
    odd["models"][0]["variants"][0]["inputs"][0]["name"] = "in\\"
    odd["excluded"].append({"cell": "x", "reason": "ends with a backslash \\"})
    header = tmp_path / "etforge_models.h"
    header.write_text(cpp_header.render_context(odd))
    printed = cpp_probe_lines(
        '#include "etforge_models.h"\n#include <cstdio>\n'
        'int main() { std::printf("%s|%s|%zu|%d|%s|%g|%s|%g\\n", etforge::models::kPipeline,\n'
        "  etforge::models::kModels[0].variants[0].inputs[0].name,\n"
        "  etforge::models::kModels[0].num_variants, etforge::models::kModels[0].variants[1].num_outputs,\n"
        "  etforge::models::kModels[0].variants[0].verdict, etforge::models::kModels[0].variants[0].sqnr_db,\n"
        "  etforge::models::kModels[0].variants[1].verdict, etforge::models::kModels[0].variants[1].atol); }\n",
        tmp_path,
        tmp_path,
    )
    assert printed == ['a "quoted" \\ name ??/ */ \u00e9', "|in\\|2|-1|provisional|inf|on-device|0.0001"]
