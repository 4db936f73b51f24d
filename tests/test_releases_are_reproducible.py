"""Release bundles: gated on the cells, byte-reproducible across clean checkouts.

One pair of clean builds of a small pipeline with Core ML cells (fp32, 4-bit
weights, and the ios chain Core ML -> XNNPACK), a static int8 cell and an LLM cell
(the tiny Llama on portable, validated at ~130 dB: its figures once differed between builds,
130.01 vs 130.80 dB, because a worker's load order of ExecuTorch's native libraries changed
which kernel code ran; etforge.builders.runtime.determinism) is shared by the module: one
built by a sequential ``doit release``, the other by ``doit -n 2 -P process
release``, so each program comes from a different process with a different
history of earlier lowerings. The two checkouts build at the same time (as two
CI machines would), which halves the wait on two cores.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tarfile
from pathlib import Path

import pytest
import yaml
from conftest import REPO, SMALL_PIPELINE, TINY_LLAMA_CONFIG, copy_project, doit_concurrently, make_project

# linreg alone carries the XNNPACK, portable, int8 and ios cells (the CNN added only build time).
PIPELINE = (
    SMALL_PIPELINE.replace("quantization: [fp32]", "quantization: [fp32, int8, coreml_int4w]")
    .replace("backends:\n", "backends:\n  coreml: {}\n  ios: {chain: [coreml, xnnpack]}\n")
    .replace(
        "models:\n",
        "models:\n  tt:\n    python: models.tiny_transformer:build\n"
        "    kwargs: {dim: 32, heads: 2, hidden: 64}\n    inputs: [{name: tokens, shape: [1, 4, 32]}]\n"
        f"  tl:\n    transformers:\n      task: text-generation\n      config: {TINY_LLAMA_CONFIG}\n"
        "      llm: {max_context_len: 16, prompt_len: 4, decode_steps: 4}\n",
    )
    + """\
matrix:
  product: false
  include:
    - {model: linreg, backend: xnnpack, quantization: fp32}
    - {model: linreg, backend: portable, quantization: fp32}
    - {model: linreg, backend: ios, quantization: fp32}
    - {model: linreg, backend: xnnpack, quantization: int8}
    - {model: tt, backend: coreml, quantization: fp32}
    - {model: tt, backend: coreml, quantization: coreml_int4w}
    - {model: tl, backend: portable, quantization: fp32}
"""
)
CORE_ML_PROGRAMS = ("tt/tt_coreml_fp32.pte", "tt/tt_coreml_coreml_int4w.pte", "linreg/linreg_ios_fp32.pte")


@pytest.fixture(scope="module")
def two_builds(tmp_path_factory):
    root = tmp_path_factory.mktemp("release")
    projects = [make_project(root / name, PIPELINE) for name in ("checkout-a", "checkout-b")]
    runs = doit_concurrently((projects[0], ("release",)), (projects[1], ("-n", "2", "-P", "process", "release")))
    for run in runs:
        assert run.returncode == 0, run.stdout + run.stderr
    return projects


def test_two_clean_builds_of_one_revision_give_identical_archives(two_builds):
    archives = [p.root / "artifacts" / "release" / "t-0.0.1.tar.gz" for p in two_builds]
    assert archives[0].read_bytes() == archives[1].read_bytes()

    project, archive = two_builds[1], archives[1]
    with tarfile.open(archive) as tar:
        names = tar.getnames()
        members = tar.getmembers()
        provenance = json.load(tar.extractfile("t-0.0.1/provenance.json"))
        sums = tar.extractfile("t-0.0.1/SHA256SUMS").read().decode()
        for line in sums.splitlines():
            digest, name = line.split("  ")
            assert hashlib.sha256(tar.extractfile(f"t-0.0.1/{name}").read()).hexdigest() == digest
    assert {m.mtime for m in members} == {946684800} and {m.uid for m in members} == {0}
    assert "t-0.0.1/models/linreg_xnnpack_int8.pte" in names and "t-0.0.1/models/tl_portable_fp32.pte" in names
    assert {f"t-0.0.1/models/{Path(p).name}" for p in CORE_ML_PROGRAMS} <= set(names)
    assert {"t-0.0.1/manifests/models.g.dart", "t-0.0.1/report.html", "t-0.0.1/SHA256SUMS"} <= set(names)
    assert provenance["toolchain"]["executorch"] == "1.5.1"
    assert provenance["pipeline"]["sha256"] == hashlib.sha256(project.pipeline.read_bytes()).hexdigest()
    assert {c["quantization"] for c in provenance["cells"]} == {"fp32", "int8", "coreml_int4w"}
    assert provenance["failures"] == []
    assert provenance["byte_reproducible"] == {r: {"reproducible": True} for r in ("coreml", "portable", "xnnpack")}
    assert (project.root / "artifacts" / "release" / "t-0.0.1.bench.json").is_file()  # timings beside it


def test_a_failed_cell_refuses_the_release_unless_allowed(two_builds, tmp_path):
    """A cell over its program-bytes budget fails its gates (decided with its outcome: no task
    runs again, so no build here), and the release refuses to pack until failures are allowed."""
    project = copy_project(two_builds[0], tmp_path / "p")
    release_dir = project.root / "artifacts" / "release"
    shutil.rmtree(release_dir)  # this checkout released before the budget
    project.write_pipeline(PIPELINE + "gates: {max_program_bytes: {linreg/xnnpack/fp32: 1000}}\n")
    archive = release_dir / "t-0.0.1.tar.gz"
    refused = project.doit("release")
    assert refused.returncode != 0
    statuses = {r["cell"]: r["status"] for r in json.loads((project.out / "summary.json").read_text())}
    failed = [c for c, s in statuses.items() if s == "failed"]
    assert failed == ["linreg/xnnpack/fp32"] and statuses["linreg/portable/fp32"] == "provisional"
    assert f"release refused: {len(failed)} cell(s) failed their gates: linreg/xnnpack/fp32" in refused.stderr
    assert not archive.exists()

    # The release packs exactly the files the plan names: not what else lies in manifests/.
    (project.out / "manifests" / "stale.dart").write_text("// left over\n")
    (project.out / "manifests" / "elsewhere").symlink_to(project.pipeline)
    allowed = project.doit("release", "--allow-failures")
    assert allowed.returncode == 0, allowed.stdout + allowed.stderr  # it packed: the run succeeds
    assert archive.is_file()
    with tarfile.open(archive) as tar:
        provenance = json.load(tar.extractfile("t-0.0.1/provenance.json"))
        names = tar.getnames()
    assert [f["cell"] for f in provenance["failures"]] == failed
    assert "t-0.0.1/models/linreg_xnnpack_fp32.pte" not in names  # a failed program never ships
    assert "t-0.0.1/models/linreg_portable_fp32.pte" in names
    assert sorted(n.split("/", 2)[2] for n in names if n.startswith("t-0.0.1/manifests/")) == sorted(
        [
            "etforge_models.h",
            "index.json",
            "models.cmake",
            "models.g.dart",
            "pubspec_assets.yaml",
            "selected_operators.yaml",
        ]
    )


def test_core_ml_programs_are_identical_across_processes_and_hold_a_valid_core_ml_model(two_builds, tmp_path):
    """Extract each Core ML model with executorch's own tool and open it with coremltools."""
    import coremltools as ct
    from executorch.examples.apple.coreml.scripts.extract_coreml_models import extract_coreml_models

    identifiers = {}
    for program in CORE_ML_PROGRAMS:
        a, b = (p.out / program for p in two_builds)
        assert a.read_bytes() == b.read_bytes(), program
        (model_dir,) = extract_coreml_models(a.read_bytes(), tmp_path / Path(program).stem)
        root = model_dir / "lowered_module"
        metadata = json.loads((root / "metadata.json").read_text())
        spec = ct.models.MLModel(str(root / "model.mlpackage"), skip_model_load=True).get_spec()
        assert [i.name for i in spec.description.input] == metadata["inputNames"]
        assert [o.name for o in spec.description.output] == metadata["outputNames"]
        assert spec.mlProgram.functions["main"].block_specializations  # an ML program with a body
        assert "com.github.apple.coremltools.conversion_date" not in spec.description.metadata.userDefined
        identifiers[program] = metadata["identifier"]
    # The device caches compiled models by identifier: different models never share one.
    assert len(set(identifiers.values())) == len(identifiers), identifiers


def test_the_core_ml_wrapper_is_restored_after_lowering_even_on_error():
    from executorch.backends.apple.coreml.compiler.coreml_preprocess import CoreMLBackend

    from etforge.builders.lowering.coreml_reproducible import deterministic_lowering

    original = CoreMLBackend.__dict__["preprocess_model"]
    with pytest.raises(ZeroDivisionError):
        with deterministic_lowering():
            assert CoreMLBackend.__dict__["preprocess_model"] is not original
            raise ZeroDivisionError
    assert CoreMLBackend.__dict__["preprocess_model"] is original


def test_every_backend_that_lowers_here_says_whether_its_bytes_are_reproducible():
    from types import SimpleNamespace

    from etforge.config.requirements import missing_requirement
    from etforge.publish.release import byte_reproducible

    recipes = {path.stem: yaml.safe_load(path.read_text()) for path in (REPO / "recipes" / "backends").glob("*.yaml")}
    lowers_here = {name for name, data in recipes.items() if missing_requirement(data.get("needs")) is None}
    # measured (true), or the reason its bytes differ (a string): never left unsaid for a backend we can lower
    assert all(recipes[name].get("reproducible") is True or recipes[name].get("reproducible") for name in lowers_here)
    qnn = byte_reproducible(SimpleNamespace(reproducible=recipes["qnn"].get("reproducible")))
    assert qnn["reproducible"] is None and "not measured" in qnn["reason"]
    why = byte_reproducible(SimpleNamespace(reproducible="stamps a uuid"))
    assert why == {"reproducible": False, "reason": "stamps a uuid"}


OPENVINO_PIPELINE = """\
name: t
version: 0.0.1
models:
  first:
    python: models.linreg:build
    inputs: [{name: features, shape: [1, 4]}]
  second:
    python: models.linreg:build
    kwargs: {in_features: 3}
    inputs: [{name: features, shape: [1, 3]}]
backends:
  openvino: {}
quantization: [fp32]
"""


@pytest.mark.slow  # OpenVINO lowers in a fresh interpreter by design; this re-proves it (48 s): `make test-all`
def test_openvino_bytes_do_not_depend_on_what_the_process_lowered_before(tmp_path):
    """OpenVINO numbers graph nodes process-wide: a process that compiled `first` before
    `second` would give `second` other bytes than one that compiled only `second`."""
    both, alone = (make_project(tmp_path / name, OPENVINO_PIPELINE) for name in ("both", "alone"))
    for run in doit_concurrently(
        (both, ("export:first/openvino/fp32", "export:second/openvino/fp32")), (alone, ("export:second/openvino/fp32",))
    ):
        assert run.returncode == 0, run.stdout + run.stderr
    program = "second/second_openvino_fp32.pte"
    assert (both.out / program).read_bytes() == (alone.out / program).read_bytes()


def test_shipped_numbers_are_measured_on_one_thread_and_stored_at_their_precision():
    import numpy as np
    import torch

    from etforge.builders.numerics.compare import compare
    from etforge.builders.runtime.determinism import deterministic

    torch.set_num_threads(2)
    with deterministic():
        assert torch.get_num_threads() == 1 and torch.are_deterministic_algorithms_enabled()
    assert torch.get_num_threads() == 2 and not torch.are_deterministic_algorithms_enabled()
    ref = np.linspace(-1, 1, 1000, dtype=np.float32)
    metrics = compare(ref, ref + np.float32(1.2345678e-4) * np.cos(ref))
    assert metrics["sqnr_db"] == round(metrics["sqnr_db"], 2)
    assert metrics["max_abs_error"] == 0.000123 and len(repr(metrics["mean_abs_error"])) <= 9
