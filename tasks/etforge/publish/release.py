"""``etforge release``: a versioned, byte-reproducible bundle of the whole matrix.

artifacts/release/<name>-<version>/ holds exactly the files the plan names,
nothing globbed from the working tree:

    models/<stem>.pte     every cell whose outcome ships (etforge.publish.outcome: ok, provisional, on-device)
    models/<stem>.bpte    for on-device cells, the BundledProgram the device checks itself with
    models/<sha>.ptd      external weights, once per distinct file (named by the first 16 hex
                          digits of its sha256; the cells with identical weights share it)
    manifests/<file>      etforge.publish.manifests files, rendered here from the same outcomes
    report.html, provenance.json, SHA256SUMS

Each program is read once, hashed, and packed only when its sha256 is the one its
current record names (the export's for a .pte, the validation's for a .bpte): an
edit that keeps the size and the mtime (``cp -p``, ``rsync -t``) is caught here.
The manifests name those same recorded hashes, so index.json never names a hash
other than the packed file's. <name>-<version>.tar.gz packs the directory with
sorted entries, fixed mtimes, owners and modes and a gzip header without a
timestamp, so two builds of the same revision give identical bytes. Host
timings vary run to run, so they stay out of the archive: they go to
<name>-<version>.bench.json beside it (NOT reproducible: p50, p90, spread, peak
RSS and an LLM's tokens per second, per cell, with the host). provenance.json says,
per backend recipe in the release, whether its programs are byte-reproducible, and
per shipped cell every deterministic figure a later ``etforge diff`` compares
(etforge.publish.cell_metrics ``metrics``), with the toolchain versions.

The release refuses (one line) when a cell fails (failed, unexpectedly passing)
unless ``--allow-failures``, which packs the rest, records the failures in
provenance.json and lets the run exit 0; when a cell has no current verdict
(not built, not validated, blocked); with ``--strict`` when a cell is only
provisional (validated on seeded random inputs); when a file differs from its
record; when nothing ships; when a shipped variant's program is outside the load window
(ExecuTorch's compatibility policy) of a ``manifests.app_runtime`` version, one line per
variant. A refused or failed release removes the previous
archive of the same version (the .tar.gz, its directory and .bench.json), saying
so, so that nothing left there looks current.

The directory, the archive and the .bench.json are staged together and replace the
previous three as one step (etforge.core.swap): whatever signal arrives, and whenever,
a reader finds all three from one release, or (after a SIGKILL mid-swap) the next run
completes the swap before anything reads them. Its provenance names the git revision
and the pipeline.yaml the run was planned from; a file the plan read that changed
during the run refuses the release (no revision names what it built from).
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import etforge
from etforge.cache.records import read_state, write_state
from etforge.core.digest import canonical_json
from etforge.core.errors import EtforgeError
from etforge.core.swap import finish, new_staging, swap_in
from etforge.core.text import first_line
from etforge.pipeline.layout import layout_of
from etforge.pipeline.results import TaskStatus
from etforge.pipeline.specs import spec_of
from etforge.pipeline.stage_results import ReleaseResult
from etforge.pipeline.stages import STAGE, task_name
from etforge.publish import cell_metrics, outcome, outcome_views
from etforge.publish.manifests.naming import data_file_name

FIXED_MTIME = 946684800  # 2000-01-01: tar and zip tools choke on 0
NOT_MEASURED = "not measured: this backend does not lower where etforge is tested"


class ReleaseRefused(EtforgeError):
    pass


def release_name(plan) -> str:
    return f"{plan.name}-{plan.version}"


def release_dir(plan) -> Path:
    return layout_of(plan).release_dir(release_name(plan))


def archive_path(plan) -> Path:
    return layout_of(plan).archive_path(release_name(plan))


def bench_path(plan) -> Path:
    return layout_of(plan).release_bench_path(release_name(plan))


def git_revision(root: Path) -> str:
    """HEAD of the project's checkout (with -dirty when pipeline inputs differ), or 'unknown'."""
    try:
        rev = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=root,
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
        return rev + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def programs(plan, shipped: list) -> list:
    """(archive name, working-tree path, recorded sha256, task that made it) of every program
    the shipped outcomes name, in plan order."""
    by_name = {c.name: c for c in plan.cells}
    layout = layout_of(plan)
    out = []
    for o in shipped:
        facts, cell = o.facts, by_name[o.cell]
        program, export = facts.program, task_name(STAGE["export"], cell)
        pte = layout.pte_path(cell)
        out.append((f"models/{pte.name}", pte, program.sha256, export))
        if program.data_sha256:  # one entry per distinct .ptd: programs() callers dedupe by archive name
            out.append(
                (f"models/{data_file_name(program.data_sha256)}", layout.ptd_path(cell), program.data_sha256, export)
            )
        if o.status == "on-device":
            bundle = layout.bundled_path(cell)
            out.append((f"models/{bundle.name}", bundle, facts.bundle_sha256, task_name(STAGE["validate"], cell)))
    return out


def read_verified(plan, path: Path, recorded: str | None, task: str) -> bytes:
    """The file's bytes, when their sha256 is the one its current record names."""
    shown = _shown(plan, path)
    if not recorded:
        raise ReleaseRefused(
            f"{shown} has no recorded sha256 (its record predates them); delete it and run `etforge {task}`"
        )
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ReleaseRefused(f"cannot read {shown}: {exc.strerror}; run `etforge {task}`") from None
    actual = hashlib.sha256(data).hexdigest()
    if actual != recorded:
        raise ReleaseRefused(
            f"{shown} differs from its record (sha256 {actual[:16]}..., "
            f"{task} recorded {recorded[:16]}...); delete it and run `etforge {task}`"
        )
    return data


def _shown(plan, path: Path) -> str:
    for root in (plan.root, plan.root.resolve()):  # (the digest memo names files by resolved path)
        if Path(path).is_relative_to(root):
            return Path(path).relative_to(root).as_posix()
    return str(path)


def byte_reproducible(member) -> dict:
    """Whether two clean builds give this backend's programs byte for byte (None: unknown), and why not:
    what its recipe measured (``reproducible``)."""
    if member.reproducible is True:
        return {"reproducible": True}
    if isinstance(member.reproducible, str):
        return {"reproducible": False, "reason": member.reproducible}
    return {"reproducible": None, "reason": NOT_MEASURED}


def run_revision(plan) -> str:
    """:func:`git_revision`, when the checkout still holds what this run was planned from. git is
    asked first, then every file the plan read (pipeline.yaml, the models' code and data, etforge's
    code) is checked against what the plan hashed: a file edited, or a commit checked out, while
    the run ran would make the provenance name another state than the one the cells were built from."""
    revision = git_revision(plan.root)
    digests = plan.code.etforge.digests
    edited = digests.changed_since_seen(list(digests.seen)) if digests is not None else None
    if edited is not None:
        raise ReleaseRefused(
            f"{_shown(plan, Path(edited))} changed during this run, so no revision names what it built from; "
            "run `etforge release` again"
        )
    return revision


def provenance(plan, shipped: list, failures: list, not_shipped: list, files: dict, revision: str) -> dict:
    by_name = {c.name: c for c in plan.cells}
    layout = layout_of(plan)
    members = {m.recipe: m for o in shipped for m in by_name[o.cell].backend.members}
    return {
        "format": cell_metrics.PROVENANCE_FORMAT,
        "release": release_name(plan),
        "etforge_version": etforge.__version__,
        "git_revision": revision,
        "toolchain": plan.toolchain,
        "pipeline": {"file": plan.source.path.name, "sha256": plan.source.sha256, "name": plan.name},
        "files": {name: {"sha256": meta["sha256"], "size": meta["size"]} for name, meta in sorted(files.items())},
        "cells": [
            {
                **by_name[o.cell].canonical(),
                "status": o.status,
                "sha256": o.facts.program.sha256,
                "size_bytes": o.facts.program.size_bytes,
                "verdict": outcome_views.verdict(o, by_name[o.cell], layout),
                "metrics": cell_metrics.measured(plan, by_name[o.cell], o),  # what a later diff compares
            }
            for o in shipped
        ],
        "failures": failures,
        "not_shipped": not_shipped,
        "byte_reproducible": {r: byte_reproducible(members[r]) for r in sorted(members)},
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


def _listed(plan, o) -> dict:
    return {"cell": o.cell, "status": o.status, "reason": outcome_views.listing_reason(o, layout_of(plan))}


def build_release(
    plan, cells, allow_failures: bool, host: dict | None = None, strict: bool = False, outcomes=None
) -> dict:
    """Pack the release of ``cells`` from their outcomes (``outcomes``: the run's, etforge.publish.outcome_memo
    RunOutcomes; each cell is decided once per run)."""
    from etforge.publish.manifests import context as manifest
    from etforge.publish.manifests import render
    from etforge.publish.report.page import render_report

    results = outcomes.outcomes(cells) if outcomes is not None else outcome.outcomes(plan, cells, host)
    failing = outcome.failing(results)
    if failing and not allow_failures:
        listed = "; ".join(
            f"{o.cell}: {o.status}: {outcome_views.listing_reason(o, layout_of(plan))}" for o in failing[:3]
        )
        more = f" (+{len(failing) - 3} more)" if len(failing) > 3 else ""
        raise ReleaseRefused(
            f"{len(failing)} cell(s) failed their gates: {listed}{more}; "
            "fix them or run `etforge release --allow-failures`"
        )
    pending = [o for o in results if o.status in outcome.PENDING]
    if pending:
        listed = "; ".join(f"{o.cell}: {o.status} ({o.reason})" for o in pending[:3])
        more = f" (+{len(pending) - 3} more)" if len(pending) > 3 else ""
        raise ReleaseRefused(f"{len(pending)} cell(s) have no current verdict: {listed}{more}")
    provisional = [o.cell for o in results if o.status == "provisional"]
    if strict and provisional:
        raise ReleaseRefused(
            f"--strict: {len(provisional)} cell(s) are provisional (validated only on seeded "
            f"random inputs): {', '.join(provisional)}; name validation data for their models "
            "in pipeline.yaml"
        )
    shipped = [o for o in results if o.ships]
    if not shipped:
        raise ReleaseRefused("no cell built a program to release")
    # checks that gate a release only (the app runtime's load window): one line per variant
    outside = [f"{o.cell}: {c.reason()}" for o in shipped for c in o.facts.checks if c.failed and c.gates == "release"]
    if outside:
        raise ReleaseRefused(
            f"{len(outside)} variant(s) may not load on the app's runtime:\n" + "\n".join(f"  {x}" for x in outside)
        )
    payload: dict = {}  # archive name -> bytes, read and checked once
    for name, path, recorded, task in programs(plan, shipped):
        if name not in payload:  # a shared .ptd is read (and checked) once
            payload[name] = read_verified(plan, path, recorded, task)
    try:
        # no timings: the defaults per platform follow the declared order, so the archive is reproducible
        context = manifest.build_context(plan, cells, host, results={o.cell: o for o in results}, timings=False)
    except manifest.ManifestError as exc:
        raise ReleaseRefused(str(exc)) from None
    for v in context["variants"]:  # the manifests name the bytes being packed, nothing else
        if hashlib.sha256(payload[f"models/{v['file']}"]).hexdigest() != v["sha256"]:
            raise ReleaseRefused(f"the manifests name sha256 {v['sha256']} for {v['file']}, not the packed file's")
    for d in context["data_files"]:
        if hashlib.sha256(payload[f"models/{d['file']}"]).hexdigest() != d["sha256"]:
            raise ReleaseRefused(f"the manifests name sha256 {d['sha256']} for {d['file']}, not the packed file's")
    for name, text in sorted(render.render(context).items()):
        payload[f"manifests/{name}"] = text.encode("utf-8")
    models = {c.model.name for c in cells}
    rejected = [r for r in plan.rejected if r.model in models]
    # No timings in the archive's report: reproducible.
    results_by_name = {o.cell: o for o in results}
    payload["report.html"] = render_report(plan, cells, rejected, host=host, results=results_by_name).encode("utf-8")
    failures = [_listed(plan, o) for o in failing]
    not_shipped = [_listed(plan, o) for o in results if not o.ships and not o.fails_run]
    not_shipped += [{"cell": r.name, "status": "rejected", "reason": " ".join(r.reason.split())} for r in rejected]

    revision = run_revision(plan)
    final = release_dir(plan)
    staging = new_staging(final.parent, ".release-")
    try:
        tree = staging / "tree"
        files: dict = {}

        def add(name: str, data: bytes) -> None:
            target = tree / name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
            files[name] = {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}

        for name in sorted(payload):
            add(name, payload[name])
        add(
            "provenance.json",
            (
                json.dumps(provenance(plan, shipped, failures, not_shipped, files, revision), indent=2, sort_keys=True)
                + "\n"
            ).encode("utf-8"),
        )
        sums = "".join(f"{files[n]['sha256']}  {n}\n" for n in sorted(files))
        (tree / "SHA256SUMS").write_text(sums, encoding="utf-8")
        archive = _tar_bytes(tree, release_name(plan))
        (staging / "archive").write_bytes(archive)
        bench = {o.cell: cell_metrics.timings(o) for o in results if o.facts.benchmark}
        (staging / "bench").write_text(canonical_json({c: bench[c] for c in sorted(bench)}) + "\n", encoding="utf-8")
        os.chmod(tree, 0o755)
        # the directory, the archive and the timings replace the previous ones as a whole
        swap_in(staging, _release_paths(plan))
    except BaseException:
        finish(staging)  # (not journaled yet: dropped; journaled: completed)
        raise
    return {
        "archive": str(archive_path(plan)),
        "sha256": hashlib.sha256(archive).hexdigest(),
        "files": len(files),
        "failures": [f["cell"] for f in failures],
    }


def _release_paths(plan) -> dict[str, str]:
    """Staged item -> the name it replaces beside the others in the release directory."""
    return {
        "tree": release_dir(plan).name,
        "archive": archive_path(plan).name,
        "bench": bench_path(plan).name,
    }


def remove_previous(plan) -> list:
    """Remove this version's archive, directory and .bench.json as a whole; the names of what was there."""
    there = [
        p.name + ("/" if p == release_dir(plan) else "")
        for p in (archive_path(plan), bench_path(plan), release_dir(plan))
        if os.path.lexists(p)
    ]
    if not there:
        return []
    try:
        swap_in(new_staging(release_dir(plan).parent, ".release-"), _release_paths(plan))  # nothing staged: removed
    except OSError:
        return []
    return there


def _record(plan, status: TaskStatus, reason: str = "", result: ReleaseResult | None = None) -> None:
    """The release's record: what the exit status reads (etforge.publish.exit_status)."""
    write_state(spec_of(plan, "release"), status, key="", reason=reason, info=result.to_json() if result else None)


def accepted_failures(plan) -> set:
    """Cells that failed but that the last release packed around with --allow-failures."""
    record = read_state(spec_of(plan, "release").state_file) or {}
    result = ReleaseResult.from_json(record.get("info"))
    if record.get("status") != TaskStatus.OK or not result.allow_failures:
        return set()
    return set(result.failures)


def run_release(plan, cells, host: dict, allow_failures: bool, strict: bool = False, outcomes=None) -> bool:
    try:
        result = build_release(plan, cells, allow_failures, host, strict, outcomes)
    except Exception as exc:  # refused, or failed (a full disk...): nothing old may look current
        refused = isinstance(exc, ReleaseRefused)
        reason = str(exc) if refused else first_line(exc)
        sys.stderr.write(f"etforge: release {'refused' if refused else 'failed'}: {reason}\n")
        removed = remove_previous(plan)
        if removed:
            sys.stderr.write(
                f"etforge: removed the previous release of {release_name(plan)} "
                f"({', '.join(removed)}): it does not match this checkout\n"
            )
        try:
            _record(plan, TaskStatus.FAILED, reason)
        except OSError:
            pass
        return False
    _record(
        plan,
        TaskStatus.OK,
        result=ReleaseResult(
            archive=result["archive"],
            sha256=result["sha256"],
            allow_failures=allow_failures,
            failures=tuple(result["failures"]),
        ),
    )
    print(f"etforge: released {result['archive']} ({result['files']} files, sha256 {result['sha256']})")
    if result["failures"]:
        print(
            f"etforge: --allow-failures: packed without {len(result['failures'])} failing cell(s) "
            f"({', '.join(result['failures'])}); provenance.json lists them"
        )
    return True
