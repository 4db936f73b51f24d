"""``doit release``: a versioned, byte-reproducible bundle of the whole matrix.

artifacts/release/<name>-<version>/ holds every shippable .pte (and .bpte), the
manifests, a report, SHA256SUMS and provenance.json; <name>-<version>.tar.gz
packs it with sorted entries, fixed mtimes, owners and modes and a gzip header
without a timestamp, so two builds of the same revision give identical bytes.
Host timings vary run to run, so they stay out of the archive: they go to
<name>-<version>.bench.json beside it. provenance.json says, per backend
recipe in the release, whether its programs are byte-reproducible.

A release refuses to pack when a cell failed; ``doit release allow_failures=1``
packs anyway and records the failures in provenance.json.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import shutil
import subprocess
import tarfile
import tempfile
from pathlib import Path

import tasks
from tasks import summary
from tasks.atomic import atomic_write_bytes, atomic_write_text
from tasks.doit_tasks import export_spec, matrix_task_deps, validate_spec
from tasks.keys import canonical_json, sha256_file
from tasks.runner import read_state

FIXED_MTIME = 946684800  # 2000-01-01: tar and zip tools choke on 0
# Backend recipes whose .pte bytes were measured identical across two clean builds in
# separate processes (sequential and `-n 2`), for fp32 and every scheme the default
# pipeline gives them. Core ML needs tasks/coreml_reproducible.py, OpenVINO a fresh
# interpreter per lowering (tasks.partitioners.FRESH_PROCESS).
REPRODUCIBLE_RECIPES = frozenset({"xnnpack", "portable", "coreml", "vulkan", "openvino",
                                  "arm_tosa", "arm_vgf", "ethos_u55", "ethos_u85"})
# Recipes whose lowering is still not byte-reproducible, each with the reason. Empty:
# every recipe that lowers here is reproducible.
NONDETERMINISTIC_RECIPES: dict = {}
NOT_MEASURED = "not measured: this backend does not lower where etforge is tested"


class ReleaseRefused(Exception):
    pass


def release_name(plan) -> str:
    return f"{plan.name}-{plan.version}"


def release_dir(plan) -> Path:
    return plan.artifacts_dir / "release" / release_name(plan)


def archive_path(plan) -> Path:
    return plan.artifacts_dir / "release" / f"{release_name(plan)}.tar.gz"


def git_revision(root: Path) -> str:
    """HEAD of the project's checkout (with -dirty when pipeline inputs differ), or 'unknown'."""
    try:
        rev = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True,
                             timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True, timeout=10, check=True).stdout.strip()
        return rev + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def collect(plan, cells) -> tuple[list, list]:
    """(shippable cells with their files, failed cells with reasons)."""
    shippable, failures = [], []
    for cell in cells:
        row = summary.cell_row(plan, cell)
        if row["status"] == "failed":
            failures.append({"cell": cell.name, "reason": row["note"].split(" (log:")[0]})
            continue
        export = read_state(export_spec(plan, cell).state_file) or {}
        if export.get("status") != "ok" or export.get("key") != plan.export_key(cell):
            continue  # skipped (host cannot lower it) or not built: nothing to ship
        files = [plan.pte_path(cell)]
        bpte = plan.cell_dir(cell) / f"{cell.stem}.bpte"
        if bpte.is_file():
            files.append(bpte)
        validate = read_state(validate_spec(plan, cell).state_file) or {}
        shippable.append({"cell": cell, "files": files, "export": export.get("info", {}),
                          "validate": {"status": validate.get("status"), **(validate.get("info") or {})}})
    return shippable, failures


def byte_reproducible(recipe: str) -> dict:
    """Whether two clean builds give this backend's programs byte for byte (None: unknown), and why not."""
    if recipe in NONDETERMINISTIC_RECIPES:
        return {"reproducible": False, "reason": NONDETERMINISTIC_RECIPES[recipe]}
    if recipe in REPRODUCIBLE_RECIPES:
        return {"reproducible": True}
    return {"reproducible": None, "reason": NOT_MEASURED}


def provenance(plan, shippable, failures, files: dict) -> dict:
    recipes = sorted({m.recipe for item in shippable for m in item["cell"].backend.members})
    return {
        "format": "etforge-provenance/1",
        "release": release_name(plan),
        "etforge_version": tasks.__version__,
        "git_revision": git_revision(plan.root),
        "toolchain": plan.toolchain,
        "pipeline": {"file": plan.file.name, "sha256": sha256_file(plan.file)},
        "files": {name: {"sha256": meta["sha256"], "size": meta["size"]} for name, meta in sorted(files.items())},
        "cells": [{**item["cell"].canonical(),
                   "size_bytes": item["export"].get("size_bytes"),
                   "delegated_ops": item["export"].get("delegated_ops"),
                   "non_delegated_ops": item["export"].get("non_delegated_ops"),
                   "numerics": {k: item["validate"].get(k) for k in
                                ("status", "sqnr_db", "cosine", "max_abs_error", "top1_agreement", "inputs")
                                if item["validate"].get(k) is not None}}
                  for item in shippable],
        "failures": failures,
        "byte_reproducible": {r: byte_reproducible(r) for r in recipes},
        "not_in_archive": {"benchmarks": "host timings differ run to run; see the .bench.json beside the archive"},
    }


def _tar_bytes(directory: Path, prefix: str) -> bytes:
    """A gzip'd tar of ``directory`` whose bytes depend only on file names and contents."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path in sorted(directory.rglob("*"), key=lambda p: p.relative_to(directory).as_posix()):
            info = tarfile.TarInfo(f"{prefix}/{path.relative_to(directory).as_posix()}")
            info.mtime, info.uid, info.gid, info.uname, info.gname = FIXED_MTIME, 0, 0, "", ""
            if path.is_dir():
                info.type, info.mode = tarfile.DIRTYPE, 0o755
                tar.addfile(info)
            else:
                info.size, info.mode = path.stat().st_size, 0o644
                with open(path, "rb") as f:
                    tar.addfile(info, f)
    out = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=out, mtime=0, compresslevel=9) as gz:
        gz.write(raw.getvalue())
    return out.getvalue()


def build_release(plan, cells, allow_failures: bool, bench: dict) -> dict:
    shippable, failures = collect(plan, cells)
    if failures and not allow_failures:
        listed = "; ".join(f"{f['cell']}: {f['reason']}" for f in failures[:3])
        more = f" (+{len(failures) - 3} more)" if len(failures) > 3 else ""
        raise ReleaseRefused(f"{len(failures)} cell(s) failed their gates: {listed}{more}; "
                             "fix them or run `doit release allow_failures=1`")
    if not shippable:
        raise ReleaseRefused("no cell built a program to release")
    from tasks.report import render_report

    final = release_dir(plan)
    final.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".release-", dir=final.parent))
    os.chmod(staging, 0o755)
    try:
        files: dict = {}

        def add(name: str, data: bytes) -> None:
            target = staging / name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
            files[name] = {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}

        for item in shippable:
            for path in item["files"]:
                add(f"models/{path.name}", path.read_bytes())
        manifests = plan.out_dir / "manifests"
        for path in sorted(manifests.glob("*")) if manifests.is_dir() else ():
            add(f"manifests/{path.name}", path.read_bytes())
        models = {c.model.name for c in cells}
        rejected = [r for r in plan.rejected if r.model in models]
        add("report.html", render_report(plan, cells, rejected).encode("utf-8"))  # no timings: reproducible
        add("provenance.json", (json.dumps(provenance(plan, shippable, failures, files), indent=2,
                                           sort_keys=True) + "\n").encode("utf-8"))
        sums = "".join(f"{files[n]['sha256']}  {n}\n" for n in sorted(files))
        (staging / "SHA256SUMS").write_text(sums, encoding="utf-8")
        archive = _tar_bytes(staging, release_name(plan))
        if final.exists():
            shutil.rmtree(final)
        os.rename(staging, final)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    atomic_write_bytes(archive_path(plan), archive)
    bench_file = archive_path(plan).with_name(f"{release_name(plan)}.bench.json")
    atomic_write_text(bench_file, canonical_json({c: bench[c] for c in sorted(bench)}) + "\n")
    return {"archive": str(archive_path(plan)), "sha256": hashlib.sha256(archive).hexdigest(),
            "files": len(files), "failures": len(failures)}


def run_release(plan, cells, host: dict, allow_failures: bool) -> bool:
    import sys

    from tasks.report import benchmark_results

    try:
        result = build_release(plan, cells, allow_failures, benchmark_results(plan, cells, host))
    except ReleaseRefused as exc:
        sys.stderr.write(f"etforge: release refused: {exc}\n")
        return False
    print(f"etforge: released {result['archive']} ({result['files']} files, sha256 {result['sha256']})")
    return True


def release_task(plan, cells, host: dict, allow_failures: bool) -> dict:
    return {
        "basename": "release",
        "doc": f"pack {archive_path(plan).relative_to(plan.root)} (refuses when a cell failed; allow_failures=1)",
        "actions": [(run_release, [plan, cells, host, allow_failures])],
        "task_dep": matrix_task_deps(plan, cells) + ["manifest"],
        "uptodate": [False],  # cheap, and it re-checks the gates every time
        "verbosity": 2,
    }
