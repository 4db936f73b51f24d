"""`doit manifest`: Dart, pubspec, CMake and JSON manifests from one plan, checked with real tools.

One small project (linreg and the small CNN on xnnpack and portable, fp32) is
built once per module; the Dart file is parsed with a real Dart grammar
(tree-sitter; there is no Dart SDK here) and the CMake file is included by a
real CMake project that is configured, built, run and installed.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import SMALL_PIPELINE, Project, copy_project, make_project

from etforge.cache.store import Store
from etforge.config.machine import host_fingerprint
from etforge.config.manifest_options import check_options
from etforge.config.resolve import resolve
from etforge.engine.actions import matrix_up_to_date, run_matrix_stage
from etforge.pipeline.keys import content_key
from etforge.pipeline.layout import layout_of
from etforge.pipeline.specs import spec_of
from etforge.pipeline.stages import DEFAULT_TABLE, STAGE
from etforge.program.compat import load_window
from etforge.publish.manifests import context as manifest
from etforge.publish.manifests import naming, render

MODELS = ("linreg", "cnn")
BACKENDS = ("xnnpack", "portable")
ALL_CELLS = [f"{m}/{b}/fp32" for m in MODELS for b in BACKENDS]


# ---------------------------------------------------------------- helpers


def dart_parser():
    from tree_sitter import Language, Parser

    try:
        import tree_sitter_dart
    except ImportError:  # the same grammar from tree-sitter-language-pack, where that is installed
        from tree_sitter_language_pack import get_parser

        return get_parser("dart")
    return Parser(Language(tree_sitter_dart.language()))


def parse_dart(source: str):
    return dart_parser().parse(source.encode("utf-8"))


def syntax_errors(tree) -> list:
    """Every ERROR or MISSING node, as 'line:column what'."""
    found = []

    def walk(node):
        if node.is_error or node.is_missing:
            row, col = node.start_point
            kind = f"missing {node.type!r}" if node.is_missing else "error"
            found.append(f"{row + 1}:{col + 1} {kind} near {node.text.decode()[:40]!r}")
        for child in node.children:
            walk(child)

    walk(tree.root_node)
    assert tree.root_node.has_error == bool(found)
    return found


def _literal(node):
    if node.type == "string_literal":
        return node.text.decode()[1:-1]
    if node.type == "decimal_integer_literal":
        return int(node.text.decode())
    if node.type == "decimal_floating_point_literal":
        return float(node.text.decode())
    if node.type == "null_literal":
        return None
    if node.type == "list_literal":
        items = []
        for c in node.children:
            if c.type == "selector":  # a constructor call: the arguments of the identifier before it
                items[-1] = _named_arguments(c)
            elif c.type not in ("type_arguments", "[", "]", ","):
                items.append(_literal(c))
        return items
    if node.type == "identifier":
        return node.text.decode()
    if node.type == "set_or_map_literal":  # <K, V>{key: value, ...}
        return {_literal(p.children[0]): _literal(p.children[-1]) for p in node.children if p.type == "pair"}
    raise AssertionError(f"unexpected {node.type}: {node.text.decode()[:60]}")


def _named_arguments(node) -> dict:
    """``Name(label: literal, ...)`` -> {label: value}, nested constructor calls as dicts."""
    args = next(n for n in _walk(node) if n.type == "arguments")
    return {
        a.children[0].children[0].text.decode(): _literal(a.children[-1])
        for a in args.children
        if a.type == "named_argument"
    }


def _walk(node):
    yield node
    for child in node.children:
        yield from _walk(child)


def dart_constants(tree, constructor: str) -> dict:
    """Static const NAME = constructor(name: literal, ...) -> {NAME: {name: value}}, from the parse tree."""
    out = {}
    for node in _walk(tree.root_node):
        if node.type != "static_final_declaration":
            continue
        idents = [c for c in node.children if c.type == "identifier"]
        if len(idents) < 2 or idents[1].text.decode() != constructor:
            continue
        args = next(n for n in _walk(node) if n.type == "arguments")
        fields = {}
        for arg in (c for c in args.children if c.type == "named_argument"):
            label = arg.children[0].children[0].text.decode()
            value = arg.children[-1]
            if "".join(c.text.decode() for c in arg.children[1:]) == "double.infinity":
                fields[label] = float("inf")
            elif label == "fallbackOrder":
                fields[label] = {
                    p.children[0].text.decode()[1:-1]: _literal(p.children[-1])
                    for p in value.children
                    if p.type == "pair"
                }
            else:
                fields[label] = _literal(value)
        out[idents[0].text.decode()] = fields
    return out


def dart_functions(tree) -> set:
    return {
        next(c for c in n.children if c.type == "identifier").text.decode()
        for n in _walk(tree.root_node)
        if n.type == "function_signature"
    }


def states(project: Project, kind: str) -> dict:
    out = {}
    for path in (project.out / ".state").glob(f"{kind}__*.json"):
        record = json.loads(path.read_text())
        out[record["task"].split(":", 1)[1]] = record
    return out


def read_manifests(project: Project) -> dict:
    return {p.name: p.read_bytes() for p in sorted((project.out / "manifests").iterdir())}


class WithManifests:
    """A plan carrying a ``manifests:`` section (what Plan.manifests will hold)."""

    def __init__(self, plan, manifests: dict):
        self._plan = plan
        self.manifests = manifests

    def __getattr__(self, name):
        return getattr(self._plan, name)


def fake_export(plan, cell, status="ok", reason="", **info):
    """State records for ``cell``'s export under its current key, as run_cached writes them,
    and, for an ok export, a passing validation of it (a cell ships only with a verdict)."""
    spec = spec_of(plan, "export", cell)
    payload = {
        "size_bytes": 1000 + len(cell.name),
        "sha256": hashlib.sha256(cell.name.encode()).hexdigest(),
        "delegates": list(cell.backend.delegates),
        "executorch_version": "1.5.1",
        "input_dtypes": ["float32"] * len(cell.model.inputs),
        **info,
    }
    record = {
        "task": spec.name,
        "key": spec.key,
        "status": status,
        "reason": reason,
        "info": payload if status == "ok" else {},
        "outputs": {},
        "log": str(spec.log_file) if status == "failed" else None,
    }
    spec.state_file.parent.mkdir(parents=True, exist_ok=True)
    spec.state_file.write_text(json.dumps(record))
    if status == "ok":
        write_program_meta(plan, cell, payload["input_dtypes"])
        check = spec_of(plan, "validate", cell)
        check.state_file.write_text(
            json.dumps(
                {
                    "task": check.name,
                    "key": check.key,
                    "status": "ok",
                    "reason": "",
                    "outputs": {},
                    "info": {
                        "program_sha256": payload["sha256"],
                        "checks": [
                            {
                                "check": "numerics",
                                "sqnr_db": 80.0,
                                "cosine": 1.0,
                                "max_abs_error": 1e-6,
                                "inputs": "random (seeded)",
                                "samples": 1,
                                "passed": True,
                            }
                        ],
                    },
                }
            )
        )


def write_program_meta(plan, cell, input_dtypes) -> None:
    """A stand-in .pte holding only the metadata string a real one carries (what `doit manifest`
    reads back and checks, etforge.publish.manifests.program_check)."""
    from etforge.config.io_spec import describe_io
    from etforge.program.metadata import encode

    meta = {
        "model": cell.model.name,
        "backend": cell.backend.name,
        "scheme": cell.quant.name,
        **describe_io(cell.model, [], input_dtypes),
        "data_file": None,
    }
    text = encode(meta).encode("ascii")
    pte = layout_of(plan).pte_path(cell)
    pte.parent.mkdir(parents=True, exist_ok=True)
    pte.write_bytes(struct.pack("<I", len(text)) + text + b"\0")


# ---------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def built(built_small, tmp_path_factory) -> Project:
    """The session's SMALL_PIPELINE build (``doit -n 2 -P process``, manifest included), copied."""
    project = copy_project(built_small, tmp_path_factory.mktemp("manifest") / "proj")
    run = project.first_run
    assert "manifest" in run.started and {f"export:{c}" for c in ALL_CELLS} <= run.started
    return project


@pytest.fixture
def copy(built, tmp_path) -> Project:
    target = tmp_path / "proj"
    shutil.copytree(built.root, target, symlinks=True)
    return Project(target)


# ---------------------------------------------------------------- the task


def test_manifest_runs_after_the_exports_and_writes_every_file(built):
    out = built.first_run.stdout
    start = out.index("start            manifest")
    for cell in ALL_CELLS:
        assert out.index(f"ok               export:{cell}") < start
    assert sorted(p.name for p in (built.out / "manifests").iterdir()) == sorted(render.FILES)


def test_second_manifest_run_executes_nothing(copy):
    run = copy.doit("manifest")
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.started == set()
    assert "0 task(s) run" in run.stdout


def test_manifests_are_deterministic_and_restored_byte_identical(copy):
    before = read_manifests(copy)
    plan = resolve(copy.pipeline)
    # rendered afresh, not from the cache; with this host's benchmarks (each platform's default)
    rendered = render.render(manifest.build_context(plan, host=host_fingerprint()))
    assert {k: v.encode() for k, v in rendered.items()} == before
    shutil.rmtree(copy.out / "manifests")
    run = copy.doit("manifest")
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.started == {"manifest"}
    assert read_manifests(copy) == before
    assert json.loads((copy.out / ".state" / "manifest.json").read_text())["cached"] is True


def test_a_changed_plan_rewrites_the_manifests_without_exporting(copy):
    copy.write_pipeline(SMALL_PIPELINE.replace("  portable: {}\n", ""))
    run = copy.doit("manifest")
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.started == {"manifest"}
    text = (copy.out / "manifests" / "models.g.dart").read_text()
    assert "linreg_xnnpack_fp32.pte" in text and "portable" not in text.split("class EtforgeModels")[1]


def test_no_op_manifest_run_does_not_import_torch_or_executorch(copy):
    code = (
        "import sys\n"
        "from etforge.app.cli import main\n"
        "rc = main(['manifest'])\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'executorch'))\n"
        "print('HEAVY', heavy, 'RC', rc)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        cwd=copy.root,
        capture_output=True,
        text=True,
        env={**__import__("os").environ, "ETFORGE_PIPELINE": str(copy.pipeline)},
    )
    assert "HEAVY [] RC 0" in proc.stdout, proc.stdout + proc.stderr


# ---------------------------------------------------------------- Dart


def test_dart_manifest_parses_and_matches_the_exports(built):
    tree = parse_dart((built.out / "manifests" / "models.g.dart").read_text())
    assert syntax_errors(tree) == []
    exports, captures = states(built, "export"), states(built, "capture")
    variants = dart_constants(tree, "ModelVariant")
    expected = {naming.dart_identifier(c.replace("/", "_")): c for c in ALL_CELLS}
    assert set(variants) == set(expected)
    for ident, cell in expected.items():
        v, info = variants[ident], exports[cell]["info"]
        model, backend, quant = cell.split("/")
        assert (v["model"], v["backend"], v["quantization"]) == (model, backend, quant)
        assert (
            v["sha256"]
            == info["sha256"]
            == hashlib.sha256((built.out / model / f"{model}_{backend}_{quant}.pte").read_bytes()).hexdigest()
        )
        assert v["sizeBytes"] == info["size_bytes"]
        assert v["asset"] == f"assets/models/{model}_{backend}_{quant}.pte"
        assert v["delegates"] == info["delegates"] == (["XnnpackBackend"] if backend == "xnnpack" else [])
        assert v["executorchVersion"] == info["executorch_version"]
        assert [i["dtype"] for i in v["inputs"]] == info["input_dtypes"]
        assert [o["shape"] for o in v["outputs"]] == [o["shape"] for o in captures[model]["info"]["outputs"]]
        planned = sum(info["costs"]["planned_bytes"]["forward"])
        assert (
            v["plannedBytes"] == planned and v["minRamBytes"] == planned + info["costs"]["size_breakdown"]["constants"]
        )
        assert [v["runtimeMin"], v["runtimeMax"]] == list(load_window(info["executorch_version"]))
        assert v["schemaVersion"] == 0 and v["capabilities"] == {}
    assert variants["cnnXnnpackFp32"]["inputs"] == [{"name": "image", "shape": [1, 3, 8, 8], "dtype": "float32"}]
    assert variants["cnnXnnpackFp32"]["outputs"] == [{"name": "output_0", "shape": [1, 3], "dtype": "float32"}]
    entries = dart_constants(tree, "ModelEntry")
    assert set(entries) == {"linreg", "cnn"}
    order = entries["linreg"]["fallbackOrder"]
    assert set(order) == {"android", "ios", "macos", "linux", "windows", "default"}
    assert order["ios"] == order["android"] == ["linregXnnpackFp32", "linregPortableFp32"]
    assert entries["cnn"]["variants"] == ["cnnXnnpackFp32", "cnnPortableFp32"]
    assert {"loadBest", "variantsFor", "runtimeProblem"} <= dart_functions(tree)
    for name in ("linreg", "cnn"):  # one default per platform, a shipped variant, with its reason
        defaults, reasons = entries[name]["defaults"], entries[name]["defaultReasons"]
        assert set(defaults) == set(reasons) == set(entries[name]["fallbackOrder"])
        assert set(defaults.values()) <= set(entries[name]["variants"])


def test_dart_parser_catches_broken_dart(built):
    good = (built.out / "manifests" / "models.g.dart").read_text()
    assert syntax_errors(parse_dart(good)) == []
    broken = {
        "missing semicolon": good.replace("  final String dtype;", "  final String dtype", 1),
        "unclosed class": good[: good.index("/// Loads the best variant")].rstrip().rstrip("}"),
        "unterminated string": good.replace("model: 'linreg',", "model: 'linreg,", 1),
        "stray bracket": good.replace("sizeBytes: ", "sizeBytes: [", 1),
        "hand-written typo": "class ModelVariant { const ModelVariant(; final int x = ; }\n",
    }
    for what, source in broken.items():
        assert source != good
        assert syntax_errors(parse_dart(source)), f"{what} parsed without an error"


# ---------------------------------------------------------------- pubspec and index.json


def test_pubspec_snippet_lists_the_dart_assets(built):
    snippet = yaml.safe_load((built.out / "manifests" / "pubspec_assets.yaml").read_text())
    tree = parse_dart((built.out / "manifests" / "models.g.dart").read_text())
    assets = [v["asset"] for v in dart_constants(tree, "ModelVariant").values()]
    assert snippet == {"flutter": {"assets": assets}}


def test_index_json_has_the_model_store_shape(built):
    text = (built.out / "manifests" / "index.json").read_text()
    index = json.loads(text)
    assert not re.search(r"\d{4}-\d\d-\d\dT\d\d:", text), "no wall-clock timestamps"
    # What the community store's Flutter client reads (ModelIndex.fromJson), with its types.
    assert isinstance(index["version"], str) and isinstance(index["generated"], str)
    assert index["baseUrl"] == "" and index["labels"] == []
    assert set(index["backends"]) == set(BACKENDS)
    assert all(isinstance(b["description"], str) for b in index["backends"].values())
    assert index["executorchVersion"] == states(built, "export")["linreg/xnnpack/fp32"]["info"]["executorch_version"]
    exports = states(built, "export")
    assert [m["name"] for m in index["models"]] == [c.replace("/", "_") + ".pte" for c in ALL_CELLS]
    for entry, cell in zip(index["models"], ALL_CELLS):
        info = exports[cell]["info"]
        assert {
            "name",
            "modelName",
            "category",
            "backend",
            "hash",
            "size",
            "sizeMB",
            "inputSize",
            "remoteUrl",
            "labelsFile",
            "labelsRemoteUrl",
            "backendDescription",
        } <= set(entry)
        assert (entry["modelName"], entry["backend"]) == tuple(cell.split("/")[:2])
        assert entry["hash"] == info["sha256"] and entry["size"] == info["size_bytes"]
        assert entry["sizeMB"] == round(info["size_bytes"] / 2**20, 2)
        assert entry["remoteUrl"] == entry["name"]  # relative: baseUrl is empty
        assert entry["inputSize"] == (8 if entry["modelName"] == "cnn" else None)
        assert entry["labelsFile"] is None and entry["labelsRemoteUrl"] is None
        assert isinstance(entry["backendDescription"], str) and isinstance(entry["category"], str)
        assert entry["platforms"] == ["android", "ios", "linux", "macos", "windows"]
        # What it costs, which runtimes load it, what a device needs: the export's own figures.
        breakdown = info["costs"]["size_breakdown"]
        assert entry["costs"]["size_breakdown"] == breakdown
        assert (
            breakdown["constants"] + sum(breakdown["delegates"].values()) + breakdown["program"] == info["size_bytes"]
        )
        assert set(breakdown["delegates"]) == set(info["delegates"])
        planned = info["costs"]["planned_bytes"]["forward"]
        assert entry["costs"]["planned_peak_bytes"] == sum(planned) > 0
        assert entry["capabilities"]["min_ram_bytes"] == sum(planned) + breakdown["constants"]
        assert entry["capabilities"]["delegates_required"] == info["delegates"]
        assert entry["runtime"]["executorch_version"] == info["executorch_version"]
        assert entry["runtime"]["schema_version"] == info["schema_version"] == 0
        assert entry["runtime"]["load_window"] == list(load_window(info["executorch_version"]))
    # Each platform's default is named once per model, with its reason.
    for model in MODELS:
        own = [e for e in index["models"] if e["modelName"] == model]
        for platform in ("android", "ios", "linux", "macos", "windows", "default"):
            (chosen,) = [e for e in own if platform in e["defaultFor"]]
            assert chosen["defaultFor"][platform].startswith(("fastest run measured", "first in the declared"))


# ---------------------------------------------------------------- CMake

CMAKELISTS = """\
cmake_minimum_required(VERSION 3.16)
project(etforge_consumer CXX)
# Stands in for the target of an ExecuTorch source build.
add_library(xnnpack_backend INTERFACE)
include("${ETFORGE_MANIFEST}")
etforge_verify_models()
foreach(v IN LISTS ETFORGE_VARIANTS)
  message(STATUS "ETFORGE ${v}|${ETFORGE_${v}_PTE}|${ETFORGE_${v}_SHA256}|${ETFORGE_${v}_SIZE}|"
                 "${ETFORGE_${v}_DELEGATES}|${ETFORGE_${v}_BACKEND_TARGETS}|${ETFORGE_${v}_PACKAGE_TARGETS}")
endforeach()
message(STATUS "ETFORGE_FALLBACK ${ETFORGE_MODEL_CNN_FALLBACK_ANDROID}")
etforge_backend_targets(libs ${ETFORGE_VARIANTS})
message(STATUS "ETFORGE_LIBS ${libs}|${libs_MISSING}")
add_executable(consumer main.cpp)
etforge_link_backends(consumer REQUIRED ${ETFORGE_VARIANTS})
target_compile_definitions(consumer PRIVATE
  "PTE_FILE=\\"${ETFORGE_LINREG_XNNPACK_FP32_FILE}\\"" "PTE_SHA256=\\"${ETFORGE_LINREG_XNNPACK_FP32_SHA256}\\"")
install(TARGETS consumer DESTINATION bin)
"""

MAIN_CPP = """\
#include <fstream>
#include <iostream>
int main(int argc, char** argv) {
  std::cout << PTE_FILE << " " << PTE_SHA256 << "\\n";
  if (argc > 1) {
    std::ifstream f(argv[1], std::ios::binary | std::ios::ate);
    std::cout << "size " << static_cast<long>(f.tellg()) << "\\n";
  }
  return 0;
}
"""


def _cmake(*args, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run(["cmake", *args], cwd=cwd, capture_output=True, text=True, timeout=300)


def test_cmake_project_includes_builds_and_installs_the_models(built, tmp_path):
    if shutil.which("cmake") is None:
        pytest.skip("cmake is not installed")
    src, build, prefix = tmp_path / "src", tmp_path / "build", tmp_path / "prefix"
    src.mkdir()
    (src / "CMakeLists.txt").write_text(CMAKELISTS)
    (src / "main.cpp").write_text(MAIN_CPP)
    models_cmake = built.out / "manifests" / "models.cmake"
    configure = _cmake("-S", str(src), "-B", str(build), f"-DETFORGE_MANIFEST={models_cmake}")
    assert configure.returncode == 0, configure.stdout + configure.stderr
    printed = [line.removeprefix("-- ") for line in configure.stdout.splitlines() if line.startswith("-- ETFORGE")]
    rows = {
        line.split("|")[0].removeprefix("ETFORGE "): line.split("|")[1:]
        for line in printed
        if line.startswith("ETFORGE ")
    }
    printed = dict(line.split(" ", 1) for line in printed if not line.startswith("ETFORGE "))
    exports = states(built, "export")
    assert set(rows) == {naming.cmake_identifier(c.replace("/", "_")) for c in ALL_CELLS}
    for cell in ALL_CELLS:
        model, backend, quant = cell.split("/")
        pte, sha, size, delegates, targets, package = rows[naming.cmake_identifier(cell.replace("/", "_"))]
        assert Path(pte).resolve() == (built.out / model / f"{model}_{backend}_{quant}.pte").resolve()
        assert sha == exports[cell]["info"]["sha256"] and int(size) == exports[cell]["info"]["size_bytes"]
        xnn = backend == "xnnpack"
        assert (delegates, targets, package) == (
            ("XnnpackBackend", "xnnpack_backend", "executorch::backend_xnnpack") if xnn else ("", "", "")
        )
    assert printed["ETFORGE_FALLBACK"] == "CNN_XNNPACK_FP32;CNN_PORTABLE_FP32"
    assert printed["ETFORGE_LIBS"] == "xnnpack_backend|"

    compiled = _cmake("--build", str(build))
    assert compiled.returncode == 0, compiled.stdout + compiled.stderr
    installed = _cmake("--install", str(build), "--prefix", str(prefix))
    assert installed.returncode == 0, installed.stdout + installed.stderr
    model_dir = prefix / "share" / "etforge" / "models"
    assert sorted(p.name for p in model_dir.iterdir()) == sorted(c.replace("/", "_") + ".pte" for c in ALL_CELLS)
    for cell in ALL_CELLS:
        blob = (model_dir / (cell.replace("/", "_") + ".pte")).read_bytes()
        assert hashlib.sha256(blob).hexdigest() == exports[cell]["info"]["sha256"]
    ran = subprocess.run(
        [str(prefix / "bin" / "consumer"), str(model_dir / "linreg_xnnpack_fp32.pte")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    info = exports["linreg/xnnpack/fp32"]["info"]
    assert ran.stdout.split("\n")[:2] == [f"linreg_xnnpack_fp32.pte {info['sha256']}", f"size {info['size_bytes']}"]

    # A changed .pte stops the configure instead of shipping a program the manifest does not describe.
    tampered = tmp_path / "tampered"
    shutil.copytree(built.out, tampered, ignore=shutil.ignore_patterns("manifests", ".state", "logs"))
    with open(tampered / "cnn" / "cnn_portable_fp32.pte", "ab") as f:
        f.write(b"\0")
    bad = _cmake(
        "-S",
        str(src),
        "-B",
        str(tmp_path / "build2"),
        f"-DETFORGE_MANIFEST={models_cmake}",
        f"-DETFORGE_MODELS_DIR={tampered}",
    )
    assert bad.returncode != 0
    assert "CNN_PORTABLE_FP32" in bad.stderr and "expects" in bad.stderr


# ---------------------------------------------------------------- what is left out, options, names


def test_failed_skipped_unbuilt_and_rejected_cells_are_listed_not_shipped(copy):
    # fp16 exists for xnnpack only: portable/fp16 is rejected by the scheme, xnnpack/fp16 is not built.
    copy.write_pipeline(SMALL_PIPELINE.replace("quantization: [fp32]", "quantization: [fp32, fp16]"))
    plan = resolve(copy.pipeline)
    cells = {c.name: c for c in plan.cells}
    fake_export(plan, cells["cnn/xnnpack/fp16"], status="failed", reason="RuntimeError: /tmp/build-x1/boom")
    fake_export(plan, cells["linreg/xnnpack/fp16"], status="skipped", reason="cannot lower here: no SDK")
    spec = spec_of(plan, "validate", cells["cnn/portable/fp32"])
    spec.state_file.write_text(
        json.dumps(
            {
                "task": spec.name,
                "key": spec.key,
                "status": "failed",
                "reason": "sqnr 3 dB below 60",
                "info": {},
                "log": str(spec.log_file),
            }
        )
    )
    context = manifest.build_context(plan)
    shipped = [v["id"] for v in context["variants"]]
    assert shipped == ["linreg/xnnpack/fp32", "linreg/portable/fp32", "cnn/xnnpack/fp32"]
    excluded = {e["cell"]: e for e in context["excluded"]}
    assert excluded["cnn/xnnpack/fp16"] == {
        "cell": "cnn/xnnpack/fp16",
        "status": "failed",
        "reason": "export:cnn/xnnpack/fp16 failed, log: logs/export__cnn__xnnpack__fp16.log",
    }
    assert excluded["linreg/xnnpack/fp16"]["status"] == "skipped"
    assert excluded["cnn/portable/fp32"] == {
        "cell": "cnn/portable/fp32",
        "status": "failed",
        "reason": "validate:cnn/portable/fp32 failed, log: logs/validate__cnn__portable__fp32.log",
    }
    assert excluded["linreg/portable/fp16"]["status"] == "rejected"
    assert "not available for portable" in excluded["linreg/portable/fp16"]["reason"]
    assert set(excluded) == {
        "cnn/xnnpack/fp16",
        "linreg/xnnpack/fp16",
        "cnn/portable/fp32",
        "linreg/portable/fp16",
        "cnn/portable/fp16",
    }
    files = render.render(context)
    for name in (render.DART, render.PUBSPEC, render.CMAKE):
        comments = [line for line in files[name].splitlines() if line.lstrip().startswith(("//", "#"))]
        for cell, e in excluded.items():
            assert any(cell in line and e["status"] in line for line in comments), (name, cell)
        assert "cnn_portable_fp32.pte" not in "\n".join(
            line for line in files[name].splitlines() if line not in comments
        )
    assert "/tmp/build-x1" not in "".join(files.values())  # failure texts vary run to run; logs do not
    assert json.loads(files[render.INDEX])["excluded"] == context["excluded"]
    assert syntax_errors(parse_dart(files[render.DART])) == []
    assert yaml.safe_load(files[render.PUBSPEC])["flutter"]["assets"] == [
        f"assets/models/{c.replace('/', '_')}.pte" for c in shipped
    ]

    # A cell whose graph never came (its capture or quantization failed) is failed, not "not built".
    spec_of(plan, "export", cells["linreg/xnnpack/fp16"]).state_file.unlink()
    spec = spec_of(plan, "quantize", cells["linreg/xnnpack/fp16"])
    spec.state_file.write_text(
        json.dumps({"task": spec.name, "key": spec.key, "status": "failed", "info": {}, "log": str(spec.log_file)})
    )
    excluded = {e["cell"]: e for e in manifest.build_context(plan)["excluded"]}
    assert excluded["linreg/xnnpack/fp16"] == {
        "cell": "linreg/xnnpack/fp16",
        "status": "failed",
        "reason": f"{spec.name} failed, log: logs/{spec.log_file.name}",
    }


def test_pipeline_options_set_fallback_order_urls_and_model_metadata(copy):
    plan = WithManifests(
        resolve(copy.pipeline),
        {
            "assets_dir": "assets/ml/",
            "base_url": "https://example.com/models/v1/",
            "install_dir": "share/demo",
            "platforms": {"ios": ["portable", "xnnpack"], "android": ["xnnpack/fp32"], "fuchsia": ["portable"]},
            "models": {
                "cnn": {
                    "category": "classification",
                    "input_size": 224,
                    "labels_file": "labels.txt",
                    "platforms": {"ios": ["xnnpack"]},
                }
            },
        },
    )
    context = manifest.build_context(plan)
    files = render.render(context)
    tree = parse_dart(files[render.DART])
    assert syntax_errors(tree) == []
    entries = dart_constants(tree, "ModelEntry")
    assert entries["linreg"]["fallbackOrder"]["ios"] == ["linregPortableFp32", "linregXnnpackFp32"]
    assert entries["linreg"]["fallbackOrder"]["android"] == ["linregXnnpackFp32"]
    assert entries["linreg"]["fallbackOrder"]["fuchsia"] == ["linregPortableFp32"]
    assert entries["cnn"]["fallbackOrder"]["ios"] == ["cnnXnnpackFp32"]
    assert entries["cnn"]["fallbackOrder"]["linux"] == ["cnnXnnpackFp32", "cnnPortableFp32"]  # the default
    assert dart_constants(tree, "ModelVariant")["cnnPortableFp32"]["asset"] == "assets/ml/cnn_portable_fp32.pte"
    index = json.loads(files[render.INDEX])
    assert index["baseUrl"] == "https://example.com/models/v1/"
    cnn = next(m for m in index["models"] if m["name"] == "cnn_xnnpack_fp32.pte")
    assert cnn["remoteUrl"] == "https://example.com/models/v1/cnn_xnnpack_fp32.pte"
    assert (cnn["category"], cnn["inputSize"], cnn["labelsFile"]) == ("classification", 224, "labels.txt")
    assert cnn["labelsRemoteUrl"] == "https://example.com/models/v1/labels.txt"
    assert 'set(ETFORGE_MODELS_INSTALL_DIR "share/demo")' in files[render.CMAKE]
    assert "set(ETFORGE_MODEL_LINREG_FALLBACK_IOS LINREG_PORTABLE_FP32 LINREG_XNNPACK_FP32)" in files[render.CMAKE]
    assert content_key(plan, STAGE["manifest"], context) != content_key(
        plan, STAGE["manifest"], manifest.build_context(resolve(copy.pipeline))
    )


def test_manifests_section_of_pipeline_yaml_reaches_the_files(copy):
    copy.write_pipeline(
        SMALL_PIPELINE + "manifests:\n  base_url: https://example.com/v1\n  platforms: {ios: [portable, xnnpack]}\n"
    )
    run = copy.doit("manifest")
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.started == {"manifest"}  # options change the manifests, never a program
    tree = parse_dart((copy.out / "manifests" / "models.g.dart").read_text())
    assert dart_constants(tree, "ModelEntry")["cnn"]["fallbackOrder"]["ios"] == ["cnnPortableFp32", "cnnXnnpackFp32"]
    index = json.loads((copy.out / "manifests" / "index.json").read_text())
    assert index["models"][0]["remoteUrl"] == "https://example.com/v1/linreg_xnnpack_fp32.pte"


def test_bad_manifest_options_are_reported_with_their_key():
    def check(raw):
        return check_options(raw, ["xnnpack", "portable"], ["coreml", "xnnpack"], ["fp32"])

    assert check(None) == [] and check({}) == []
    assert check({"platforms": {"ios": ["coreml", "xnnpack/fp32"]}}) == []
    assert check({"platform": {}}) == [
        (
            ("platform",),
            "unknown key; expected one of app_runtime, assets_dir, base_url, install_dir, models, platforms",
        )
    ]
    assert check({"platforms": {"ios": ["xnpack"]}})[0] == (
        ("platforms", "ios", 0),
        "unknown backend 'xnpack'; declared: xnnpack, portable (or any backend recipe)",
    )
    assert check({"platforms": {"ios": ["xnnpack/int4"]}})[0][1].startswith("unknown quantization 'int4'")
    assert check({"platforms": {"iOS 17": ["xnnpack"]}})[0][0] == ("platforms", "iOS 17")
    assert check({"platforms": {"ios": "xnnpack"}})[0][1] == "expected a list of backend names, got a string"
    assert check({"base_url": 3})[0] == (("base_url",), "expected a string, got int")
    assert check({"assets_dir": "../outside"})[0][0] == ("assets_dir",)
    assert check({"models": {"cnn": {"input_size": 0}}})[0] == (
        ("models", "cnn", "input_size"),
        "expected a positive integer, got 0",
    )


def test_odd_names_make_valid_unique_dart_and_cmake_identifiers(tmp_path):
    names = ["class", "3d-net", "a-b", "a_b", "models", "YOLO11n-pose"]
    pipeline = "name: t\nmodels:\n" + "".join(
        f"  {n}:\n    python: models.linreg:build\n    inputs: [{{shape: [1, 4]}}]\n" for n in names
    )
    pipeline += "backends:\n  xnnpack: {}\n  portable: {}\nquantization: [fp32]\ntargets: false\n"
    project = make_project(tmp_path / "proj", pipeline)
    plan = resolve(project.pipeline)
    for cell in plan.cells:
        fake_export(plan, cell)
    context = manifest.build_context(plan)
    files = render.render(context)
    tree = parse_dart(files[render.DART])
    assert syntax_errors(tree) == []
    variants = dart_constants(tree, "ModelVariant")
    entries = dart_constants(tree, "ModelEntry")
    assert len(variants) == len(plan.cells) == 12 and len(entries) == len(names)
    assert {v["model"] for v in variants.values()} == set(names)
    idents = list(variants) + list(entries)
    assert len(set(idents)) == len(idents)
    assert all(re.fullmatch(r"[a-z][A-Za-z0-9_]*", i) for i in idents)
    assert entries.keys() >= {"class_2", "m3dNet", "models_2", "yolo11nPose", "aB", "aB_2"}
    cmake_ids = [v["cmake_id"] for v in context["variants"]]
    assert len(set(cmake_ids)) == len(cmake_ids) and all(re.fullmatch(r"[A-Z0-9_]+", i) for i in cmake_ids)
    assert {"A_B_XNNPACK_FP32", "A_B_XNNPACK_FP32_2", "3D_NET_PORTABLE_FP32", "CLASS_XNNPACK_FP32"} <= set(cmake_ids)
    if shutil.which("cmake") is None:
        return
    paths = render.write_manifests(context, layout_of(plan).manifest_dir)
    src = tmp_path / "src"
    src.mkdir()
    (src / "CMakeLists.txt").write_text(
        "cmake_minimum_required(VERSION 3.16)\nproject(names NONE)\n"
        f'include("{paths[render.CMAKE].as_posix()}")\n'
        'foreach(v IN LISTS ETFORGE_VARIANTS)\n  message(STATUS "V ${v} ${ETFORGE_${v}_FILE}")\nendforeach()\n'
    )
    configure = _cmake("-S", str(src), "-B", str(tmp_path / "build"))
    assert configure.returncode == 0, configure.stdout + configure.stderr
    listed = re.findall(r"^-- V (\S+) (\S+)$", configure.stdout, re.M)
    assert listed == [(v["cmake_id"], v["file"]) for v in context["variants"]]


def test_two_variants_with_one_file_name_are_refused(tmp_path):
    pipeline = (
        "name: t\nmodels:\n"
        "  m:\n    python: models.linreg:build\n    inputs: [{shape: [1, 4]}]\n"
        "  m_xnnpack:\n    python: models.linreg:build\n    inputs: [{shape: [1, 4]}]\n"
        "backends:\n  portable: {}\n  xnnpack_portable: {recipe: portable}\nquantization: [fp32]\ntargets: false\n"
    )
    project = make_project(tmp_path / "proj", pipeline)
    plan = resolve(project.pipeline)
    for cell in plan.cells:
        fake_export(plan, cell)
    with pytest.raises(
        manifest.ManifestError,
        match="m/xnnpack_portable/fp32 and m_xnnpack/portable/fp32 would both ship as m_xnnpack_portable_fp32.pte",
    ):
        manifest.build_context(plan)
    # The task fails with that reason in its state record (the reporter's finish line reads it).
    assert run_matrix_stage(plan, DEFAULT_TABLE, "manifest", plan.cells, Store(layout_of(plan).cache_dir)) is False
    record = json.loads((layout_of(plan).state_dir / "manifest.json").read_text())
    assert record["status"] == "failed" and "would both ship as" in record["reason"]
    assert not matrix_up_to_date(plan, "manifest", plan.cells, Store(layout_of(plan).cache_dir))
