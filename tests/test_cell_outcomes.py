"""A cell's outcome (etforge.publish.outcome), as every reader shows it, through real runs.

One small project is built once per module with `doit -n 2 -P process`:

- linreg on xnnpack and portable, validated on seeded random inputs: provisional;
- linreg on vulkan, which lowers here but cannot run here: on-device (a .bpte);
- cnn on xnnpack with validation data in pipeline.yaml: ok;
- broken (its factory raises) on xnnpack, declared in matrix.expected_failures.

Each test that changes something works on a copy.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import tarfile
from pathlib import Path

import numpy as np
import pytest
from conftest import Project, make_project
from test_app_manifests import dart_constants, parse_dart, syntax_errors

from etforge.config.machine import host_fingerprint
from etforge.config.resolve import resolve
from etforge.pipeline.specs import spec_of
from etforge.publish import outcome, release, summary
from etforge.publish.manifests import context as manifest

LINK = "https://github.com/pytorch/executorch/issues/1"
PIPELINE = f"""\
name: t
version: 0.0.1
models:
  linreg:
    python: models.linreg:build
    inputs: [{{name: features, shape: [1, 4]}}]
  cnn:
    python: models.small_cnn:build
    kwargs: {{num_classes: 3, width: 4}}
    inputs: [{{name: image, shape: [1, 3, 8, 8]}}]
    validation: {{npz: data/val.npz}}
  broken:
    python: models.broken:build
    inputs: [{{name: x, shape: [1, 4]}}]
backends:
  xnnpack: {{}}
  portable: {{}}
  vulkan: {{}}
quantization: [fp32]
targets: false  # aarch64 verdicts: tests/test_aarch64_targets.py
matrix:
  exclude: [{{backend: vulkan}}, {{model: cnn, backend: portable}}, {{model: broken, backend: portable}}]
  include: [{{model: linreg, backend: vulkan, quantization: fp32}}]
  expected_failures:
    - {{model: broken, reason: "the factory raises on purpose", link: "{LINK}"}}
"""
BROKEN = "def build():\n    raise RuntimeError('this factory is broken on purpose')\n"
STATUSES = {
    "linreg/xnnpack/fp32": "provisional",
    "linreg/portable/fp32": "provisional",
    "linreg/vulkan/fp32": "on-device",
    "cnn/xnnpack/fp32": "ok",
    "broken/xnnpack/fp32": "expected-failure",
}
SHIPPED = [c for c, s in STATUSES.items() if s in outcome.SHIPS]


def rows(project: Project) -> dict:
    return {r["cell"]: r for r in json.loads((project.out / "summary.json").read_text())}


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Project:
    project = make_project(tmp_path_factory.mktemp("outcome") / "proj", PIPELINE)
    (project.root / "models" / "broken.py").write_text(BROKEN)
    (project.root / "data").mkdir()
    images = np.random.default_rng(7).standard_normal((4, 3, 8, 8)).astype(np.float32)
    np.savez(project.root / "data" / "val.npz", image=images)
    plan = resolve(project.pipeline)
    if next(c for c in plan.cells if c.backend.name == "vulkan").backend.missing:
        pytest.skip("vulkan cannot lower on this host")
    project.first_run = project.doit("-n", "2", "-P", "process")
    return project


@pytest.fixture
def copy(built, tmp_path) -> Project:
    target = tmp_path / "proj"
    shutil.copytree(built.root, target, symlinks=True)
    return Project(target)


# ---------------------------------------------------------------- statuses


def test_statuses_in_the_summary_and_the_report(built):
    run = built.first_run
    assert run.returncode == 0, run.stdout + run.stderr  # an expected failure does not fail the run
    table = rows(built)
    assert {c: table[c]["status"] for c in STATUSES} == STATUSES
    assert "validated on seeded random inputs only" in table["linreg/xnnpack/fp32"]["note"]
    assert table["cnn/xnnpack/fp32"]["status"] == "ok"  # validated on data/val.npz (the report's SQNR title)
    assert "validated on npz data/val.npz" in (built.out / "report.html").read_text()
    broken = table["broken/xnnpack/fp32"]["note"]
    assert "the factory raises on purpose" in broken and LINK in broken and "broken on purpose" in broken
    assert "check on device" in table["linreg/vulkan/fp32"]["note"]
    html = (built.out / "report.html").read_text()
    for cell, status in STATUSES.items():
        assert f'data-cell="{cell}" data-status="{status}"' in html


def test_every_shipped_variant_carries_its_verdict_in_index_json(built):
    index = json.loads((built.out / "manifests" / "index.json").read_text())
    entries = {e["name"]: e for e in index["models"]}
    assert sorted(entries) == sorted(c.replace("/", "_") + ".pte" for c in SHIPPED)
    for cell in SHIPPED:
        model = cell.split("/")[0]
        entry = entries[cell.replace("/", "_") + ".pte"]
        verdict = entry["verdict"]
        assert verdict["status"] == STATUSES[cell]
        assert entry["hash"] == sha256(built.out / model / entry["name"])
        if verdict["status"] == "on-device":
            bpte = built.out / model / verdict["bundle"]
            assert verdict["checked"] == "on device" and verdict["bundle"] == cell.replace("/", "_") + ".bpte"
            assert verdict["bundle_sha256"] == sha256(bpte)
            assert verdict["rtol"] >= 0 and verdict["atol"] > 0 and verdict["inputs"] == "random (seeded)"
        else:
            assert verdict["checked"] == "here" and "sqnr_db" in verdict and verdict["cosine"] > 0.99
            assert verdict["inputs"] == ("npz data/val.npz" if model == "cnn" else "random (seeded)")
            assert verdict["samples"] == (4 if model == "cnn" else 1)
            numerics = json.loads((built.out / model / entry["name"].replace(".pte", ".numerics.json")).read_text())
            assert verdict["sqnr_db"] == numerics["outputs"][0]["sqnr_db"]
            assert verdict["exact"] is (verdict["sqnr_db"] is None)
    excluded = {e["cell"]: e for e in index["excluded"]}
    assert excluded["broken/xnnpack/fp32"]["status"] == "expected-failure"
    assert excluded["broken/xnnpack/fp32"]["reason"] == (
        f"expected to fail: the factory raises on purpose ({LINK}); capture:broken failed, "
        "log: logs/capture__broken.log"
    )


def test_every_shipped_variant_carries_its_verdict_in_the_dart_and_cmake_manifests(built):
    text = (built.out / "manifests" / "models.g.dart").read_text()
    tree = parse_dart(text)
    assert syntax_errors(tree) == []
    variants = {
        f"{v['model']}/{v['backend']}/{v['quantization']}": v for v in dart_constants(tree, "ModelVariant").values()
    }
    assert sorted(variants) == sorted(SHIPPED)
    for cell, v in variants.items():
        assert v["verdict"] == STATUSES[cell]
        if v["verdict"] == "on-device":
            assert v["bundleFile"] == cell.replace("/", "_") + ".bpte"
            assert v["bundleSha256"] == sha256(built.out / cell.split("/")[0] / v["bundleFile"])
            assert v["atol"] > 0 and "sqnrDb" not in v
        else:
            assert v["validatedOn"] in ("npz data/val.npz", "random (seeded)") and "bundleFile" not in v
            assert v["sqnrDb"] is not None and v["maxAbsError"] is not None
    assert "broken" not in text.split("class EtforgeModels")[1]
    assert re.search(r"^//\s+broken/xnnpack/fp32: expected-failure \(expected to fail", text, re.M)
    cmake = (built.out / "manifests" / "models.cmake").read_text()
    assert 'set(ETFORGE_CNN_XNNPACK_FP32_VERDICT "ok")' in cmake
    assert 'set(ETFORGE_LINREG_VULKAN_FP32_BUNDLE "linreg_vulkan_fp32.bpte")' in cmake


CPP_MAIN = """\
#include <cstdio>
#include "etforge_models.h"
int main() {
  using namespace etforge::models;
  for (size_t i = 0; i < kNumModels; ++i) {
    for (size_t j = 0; j < kModels[i].num_variants; ++j) {
      const Variant& v = kModels[i].variants[j];
      std::printf("%s|%s|%s|%g|%s|%s|%g|%g\\n", v.id, v.verdict, v.validated_on, v.sqnr_db,
                  v.bundle_file, v.bundle_sha256, v.rtol, v.atol);
    }
  }
  return 0;
}
"""


def test_every_shipped_variant_carries_its_verdict_in_the_cpp_header(built, tmp_path):
    if shutil.which("c++") is None:
        pytest.skip("needs a C++ compiler")
    (tmp_path / "main.cpp").write_text(CPP_MAIN)
    compiled = subprocess.run(
        [
            "c++",
            "-std=c++17",
            "-Wall",
            "-I",
            str(built.out / "manifests"),
            str(tmp_path / "main.cpp"),
            "-o",
            str(tmp_path / "main"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert compiled.returncode == 0, compiled.stderr
    printed = subprocess.run([str(tmp_path / "main")], capture_output=True, text=True, timeout=60).stdout
    variants = {line.split("|")[0]: line.split("|")[1:] for line in printed.splitlines()}
    assert sorted(variants) == sorted(SHIPPED)
    index = {
        e["name"]: e["verdict"] for e in json.loads((built.out / "manifests" / "index.json").read_text())["models"]
    }
    for cell, (verdict, validated_on, sqnr, bundle, bundle_sha, rtol, atol) in variants.items():
        expected = index[cell.replace("/", "_") + ".pte"]
        assert (verdict, validated_on) == (expected["status"], expected["inputs"])
        if verdict == "on-device":
            assert (bundle, bundle_sha) == (expected["bundle"], expected["bundle_sha256"])
            assert sqnr == "nan" and float(atol) == pytest.approx(expected["atol"], rel=1e-5)
        else:
            assert bundle == bundle_sha == "" and rtol == atol == "nan"
            assert sqnr == "inf" if expected["exact"] else float(sqnr) == pytest.approx(expected["sqnr_db"], rel=1e-5)


# ---------------------------------------------------------------- expected failures


def test_an_unexpectedly_passing_cell_fails_the_run_until_its_entry_is_removed(copy):
    declared = PIPELINE + (f'    - {{model: linreg, backend: portable, reason: "thought broken", link: "{LINK}"}}\n')
    copy.write_pipeline(declared)
    run = copy.doit("--models", "linreg")
    assert run.returncode == 1, run.stdout + run.stderr
    assert not {t for t in run.started if t.split(":")[0] in ("capture", "export", "validate")}  # keys unchanged
    assert re.search(
        r"^etforge: linreg/portable/fp32 is unexpectedly passing: passed \(provisional\) but "
        r"\S*pipeline\.yaml:\d+: matrix\.expected_failures\[1\] declares it an expected failure "
        r"\(thought broken\); remove that entry$",
        run.stderr,
        re.M,
    ), run.stderr
    assert rows(copy)["linreg/portable/fp32"]["status"] == "unexpectedly-passing"
    index = json.loads((copy.out / "manifests" / "index.json").read_text())
    assert "linreg_portable_fp32.pte" not in [e["name"] for e in index["models"]]
    assert {"cell": "linreg/portable/fp32", "status": "unexpectedly-passing"}.items() <= next(
        e for e in index["excluded"] if e["cell"] == "linreg/portable/fp32"
    ).items()

    refused = copy.doit("release", "--models", "linreg")
    assert refused.returncode != 0
    assert "release refused: 1 cell(s) failed their gates: linreg/portable/fp32: unexpectedly-passing" in refused.stderr
    allowed = copy.doit("release", "--allow-failures")
    assert allowed.returncode == 0, allowed.stdout + allowed.stderr  # it packed: the run succeeds
    archive = copy.root / "artifacts" / "release" / "t-0.0.1.tar.gz"
    with tarfile.open(archive) as tar:
        names = tar.getnames()
        provenance = json.load(tar.extractfile("t-0.0.1/provenance.json"))
        index = json.load(tar.extractfile("t-0.0.1/manifests/index.json"))
        packed = {
            e["name"]: hashlib.sha256(tar.extractfile(f"t-0.0.1/models/{e['name']}").read()).hexdigest()
            for e in index["models"]
        }
    assert [f["cell"] for f in provenance["failures"]] == ["linreg/portable/fp32"]
    assert "t-0.0.1/models/linreg_portable_fp32.pte" not in names
    assert {"t-0.0.1/models/linreg_vulkan_fp32.pte", "t-0.0.1/models/linreg_vulkan_fp32.bpte"} <= set(names)
    assert sorted(packed) == sorted(c.replace("/", "_") + ".pte" for c in SHIPPED if c != "linreg/portable/fp32")
    assert all(packed[e["name"]] == e["hash"] for e in index["models"])  # index.json names the packed bytes
    not_shipped = {e["cell"]: e["status"] for e in provenance["not_shipped"]}
    assert not_shipped == {"broken/xnnpack/fp32": "expected-failure"}

    copy.write_pipeline(PIPELINE)  # the entry is removed: green again, nothing rebuilt
    again = copy.doit("--models", "linreg")
    assert again.returncode == 0, again.stdout + again.stderr
    assert rows(copy)["linreg/portable/fp32"]["status"] == "provisional"


def test_strict_release_refuses_provisional_cells(copy):
    strict = copy.doit("release", "--strict", "--models", "linreg,cnn")
    assert strict.returncode != 0
    line = next(line for line in strict.stderr.splitlines() if "release refused" in line)
    assert line == (
        "etforge: release refused: --strict: 2 cell(s) are provisional (validated only on seeded "
        "random inputs): linreg/xnnpack/fp32, linreg/portable/fp32; "
        "name validation data for their models in pipeline.yaml"
    )
    assert not (copy.root / "artifacts" / "release" / "t-0.0.1.tar.gz").exists()
    assert copy.doit("release", "--strict", "--models", "cnn").returncode == 0  # validated on its data: ok


def test_a_same_size_same_mtime_edit_of_a_shipped_program_refuses_the_release(copy):
    release_dir = copy.root / "artifacts" / "release"
    archive = release_dir / "t-0.0.1.tar.gz"
    assert copy.doit("release", "--models", "linreg,cnn").returncode == 0 and archive.is_file()
    pte = copy.out / "linreg" / "linreg_portable_fp32.pte"
    st = pte.stat()
    data = bytearray(pte.read_bytes())
    data[len(data) // 2] ^= 0xFF
    pte.write_bytes(bytes(data))
    os.utime(pte, ns=(st.st_atime_ns, st.st_mtime_ns))  # what cp -p or rsync -t leave
    assert (pte.stat().st_size, pte.stat().st_mtime_ns) == (st.st_size, st.st_mtime_ns)
    edited = copy.doit("release", "--models", "linreg,cnn")
    assert edited.returncode != 0
    assert re.search(
        r"^etforge: release refused: artifacts/t/linreg/linreg_portable_fp32\.pte differs from its "
        r"record \(sha256 [0-9a-f]{16}\.\.\., export:linreg/portable/fp32 recorded [0-9a-f]{16}\.\.\.\); "
        r"delete it and run `etforge export:linreg/portable/fp32`$",
        edited.stderr,
        re.M,
    ), edited.stderr
    # Nothing left there looks current.
    assert (
        "etforge: removed the previous release of t-0.0.1 (t-0.0.1.tar.gz, t-0.0.1.bench.json, t-0.0.1/): "
        "it does not match this checkout"
    ) in edited.stderr
    assert list(release_dir.iterdir()) == []

    pte.unlink()  # what the message says: the program comes back from the store
    assert "restored from cache" in copy.doit("export:linreg/portable/fp32").stdout
    assert copy.doit("release", "--models", "linreg,cnn").returncode == 0 and archive.is_file()


# ---------------------------------------------------------------- stale records


def test_a_stale_record_is_never_shown_as_the_verdict(copy):
    host = host_fingerprint()
    cell = "cnn/xnnpack/fp32"
    # A threshold the program cannot meet, without re-running validation: the record on disk
    # says ok under the old key.
    copy.write_pipeline(
        PIPELINE.replace(
            "    validation: {npz: data/val.npz}\n",
            "    validation: {npz: data/val.npz}\n    thresholds: {fp32: {max_abs_error: 0.0}}\n",
        )
    )
    run = copy.doit("export", "--models", "cnn")  # the summary of a real run that did not validate
    assert run.returncode == 0, run.stdout + run.stderr
    assert "validate:" + cell not in run.started
    row = rows(copy)[cell]
    assert row["status"] == "not validated" and "SQNR dB" not in row["checks"], row
    plan = resolve(copy.pipeline)
    target = next(c for c in plan.cells if c.name == cell)
    assert summary.cell_row(plan, target, host)["status"] == "not validated"
    context = manifest.build_context(plan, host=host)
    assert cell not in [v["id"] for v in context["variants"]]
    assert {"cell": cell, "status": "not validated", "reason": f"run `etforge validate:{cell}`"} in context["excluded"]
    with pytest.raises(release.ReleaseRefused, match=f"1 cell\\(s\\) have no current verdict: {cell}: not validated"):
        release.build_release(plan, plan.cells, allow_failures=True, host=host)

    # A hand-edited record: under the current key, but naming other bytes than the program's.
    spec = spec_of(plan, "validate", target)
    record = json.loads(spec.state_file.read_text())
    assert record["key"] != spec.key and record["status"] == "ok"  # the stale record, still on disk
    forged = {**record, "key": spec.key, "info": {**record["info"], "program_sha256": "0" * 64}}
    spec.state_file.write_text(json.dumps(forged))
    judged = outcome.cell_outcome(plan, target, host)
    assert judged.status == "not validated" and "judged another program" in judged.reason
    assert summary.cell_row(plan, target, host)["status"] == "not validated"
    assert cell not in [v["id"] for v in manifest.build_context(plan, host=host)["variants"]]


# ---------------------------------------------------------------- declaring expected failures

ERRORS_BASE = """\
name: t
models:
  linreg:
    python: models.linreg:build
    inputs: [{shape: [1, 4]}]
backends:
  xnnpack: {}
quantization: [fp16]
targets: false  # aarch64 verdicts: tests/test_aarch64_targets.py
matrix:
  expected_failures:
"""


@pytest.mark.parametrize(
    "entry, line, key, message",
    [
        (
            '{model: lineg, reason: "r", link: "https://x.org/1"}',
            12,
            "matrix.expected_failures[0].model",
            "model 'lineg' is not declared in 'models'; declared: linreg",
        ),
        (
            '{model: linreg, link: "https://x.org/1"}',
            12,
            "matrix.expected_failures[0]",
            "missing required key 'reason'",
        ),
        (
            '{model: linreg, reason: "r", link: "issue 12"}',
            12,
            "matrix.expected_failures[0].link",
            "expected an http(s) URL of the issue that tracks it, e.g. https://github.com/pytorch/executorch/issues/1234, "
            'got "issue 12"',
        ),
        (
            '{model: linreg, reason: "  ", link: "https://x.org/1"}',
            12,
            "matrix.expected_failures[0].reason",
            'expected a one-line reason why the cell fails, got "  "',
        ),
        (
            '{reason: "r", link: "https://x.org/1"}',
            12,
            "matrix.expected_failures[0]",
            "expected a mapping naming at least one of model, backend, quantization, with a reason and a link, "
            "got a mapping with keys reason, link",
        ),
        (
            '{model: linreg, backend: xnnpack, quantization: fp16, reason: "r", link: "https://x.org/1", why: 1}',
            12,
            "matrix.expected_failures[0].why",
            "unknown key 'why'",
        ),
    ],
)
def test_a_bad_expected_failure_entry_is_a_one_line_error(tmp_path, entry, line, key, message):
    from etforge.core.errors import PipelineError

    path = make_project(tmp_path / "p", ERRORS_BASE + f"    - {entry}\n").pipeline
    with pytest.raises(PipelineError) as error:
        resolve(path)
    assert (error.value.line, error.value.key) == (line, key), str(error.value)
    assert error.value.message.startswith(message), str(error.value)


def test_an_expected_failure_that_names_no_cell_is_an_error(tmp_path):
    from etforge.core.errors import PipelineError

    path = make_project(tmp_path / "p").pipeline
    path.write_text(
        ERRORS_BASE.replace("quantization: [fp16]", "quantization: [fp32, fp16]").replace(
            "  xnnpack: {}\n", "  xnnpack: {}\n  portable: {}\n"
        )
        + "    - {backend: xnnpack, reason: r, link: 'https://x.org/1'}\n"
        "    - {backend: portable, quantization: fp16, reason: r, link: 'https://x.org/2'}\n"
    )
    with pytest.raises(PipelineError) as error:
        resolve(path)
    assert (error.value.line, error.value.key) == (14, "matrix.expected_failures[1]")
    assert error.value.message == (
        "names no cell of the matrix (only refused combinations, which never build: "
        "linreg/portable/fp16); remove the entry"
    )
    # A pattern: one entry names every cell it matches; nothing else changes.
    path.write_text(path.read_text().rsplit("    - {backend: portable", 1)[0])
    plan = resolve(path)
    assert [c.name for c in plan.cells if plan.expected_failure(c)] == ["linreg/xnnpack/fp32", "linreg/xnnpack/fp16"]
    assert plan.expected_failure(plan.cells[0]).where.endswith("pipeline.yaml:13: matrix.expected_failures[0]")
