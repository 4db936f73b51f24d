"""Release bundles: gated on the cells, byte-reproducible across clean checkouts."""

from __future__ import annotations

import hashlib
import json
import tarfile

from conftest import SMALL_PIPELINE, make_project

PIPELINE = SMALL_PIPELINE.replace("quantization: [fp32]", "quantization: [fp32, int8]") + \
    "matrix:\n  exclude: [{model: linreg, quantization: int8}]\n"


def test_two_clean_builds_of_one_revision_give_identical_archives(tmp_path):
    archives = []
    for name in ("checkout-a", "checkout-b"):
        project = make_project(tmp_path / name, PIPELINE)
        run = project.doit("release")
        assert run.returncode == 0, run.stdout + run.stderr
        archive = project.root / "artifacts" / "release" / "t-0.0.1.tar.gz"
        archives.append(archive.read_bytes())
    assert archives[0] == archives[1]

    with tarfile.open(archive) as tar:
        names = tar.getnames()
        members = tar.getmembers()
        provenance = json.load(tar.extractfile("t-0.0.1/provenance.json"))
        sums = tar.extractfile("t-0.0.1/SHA256SUMS").read().decode()
        for line in sums.splitlines():
            digest, name = line.split("  ")
            assert hashlib.sha256(tar.extractfile(f"t-0.0.1/{name}").read()).hexdigest() == digest
    assert {m.mtime for m in members} == {946684800} and {m.uid for m in members} == {0}
    assert "t-0.0.1/models/cnn_xnnpack_int8.pte" in names
    assert {"t-0.0.1/manifests/models.g.dart", "t-0.0.1/report.html", "t-0.0.1/SHA256SUMS"} <= set(names)
    assert provenance["toolchain"]["executorch"] == "1.5.1"
    assert provenance["pipeline"]["sha256"] == hashlib.sha256(project.pipeline.read_bytes()).hexdigest()
    assert {c["quantization"] for c in provenance["cells"]} == {"fp32", "int8"}
    assert provenance["failures"] == []
    assert (project.root / "artifacts" / "release" / "t-0.0.1.bench.json").is_file()  # timings beside it


def test_a_failed_cell_refuses_the_release_unless_allowed(tmp_path):
    project = make_project(tmp_path / "p", SMALL_PIPELINE.replace(
        "    inputs: [{name: image, shape: [1, 3, 8, 8]}]\n",
        "    inputs: [{name: image, shape: [1, 3, 8, 8]}]\n    thresholds: {fp32: {sqnr_db: 500}}\n"))
    release_dir = project.root / "artifacts" / "release"
    archive = release_dir / "t-0.0.1.tar.gz"
    refused = project.doit("release")
    assert refused.returncode != 0
    statuses = {r["cell"]: r["status"] for r in json.loads((project.out / "summary.json").read_text())}
    failed = [c for c, s in statuses.items() if s == "failed"]
    assert "cnn/xnnpack/fp32" in failed and "linreg/portable/fp32" not in failed  # XNNPACK reorders float sums
    assert f"release refused: {len(failed)} cell(s) failed their gates: cnn/xnnpack/fp32" in refused.stderr
    assert not archive.exists()

    # The release packs exactly the files the plan names: not what else lies in manifests/.
    (project.out / "manifests" / "stale.dart").write_text("// left over\n")
    (project.out / "manifests" / "elsewhere").symlink_to(project.pipeline)
    allowed = project.doit("release", "allow_failures=1")
    assert allowed.returncode == 0, allowed.stdout + allowed.stderr  # it packed: the run succeeds
    assert archive.is_file()
    with tarfile.open(archive) as tar:
        provenance = json.load(tar.extractfile("t-0.0.1/provenance.json"))
        names = tar.getnames()
    assert [f["cell"] for f in provenance["failures"]] == failed
    assert "t-0.0.1/models/cnn_xnnpack_fp32.pte" not in names  # a failed program never ships
    assert "t-0.0.1/models/linreg_portable_fp32.pte" in names
    assert sorted(n.split("/", 2)[2] for n in names if n.startswith("t-0.0.1/manifests/")) == sorted(
        ["etforge_models.h", "index.json", "models.cmake", "models.g.dart", "pubspec_assets.yaml"])

