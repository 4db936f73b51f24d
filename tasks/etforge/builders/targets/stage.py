"""The target stage's builder: a cell's program in the ExecuTorch runtime of each of its targets.

For each target (etforge.config.targets: an aarch64 core) the program runs under qemu-user in the
cross-built runner (etforge.builders.targets.qemu) on the capture's validation samples, and is
judged exactly as the host's validation judges it: etforge.builders.numerics.validate
``build_validate``, with the same inputs, metrics and thresholds, its runner naming the target.
Each target gives one check: ``Numerics`` with ``target`` set (its misses prefixed with the
target's name, so a cell's reason says which runtime missed), or ``NotRun`` saying in one line what
kept the program from running there (this host lacks qemu or the runner, the runtime lacks an
operator library or a delegate, the model kind is judged on the host only). A target that ran and
missed fails the task; one that could not run never does: the cell keeps its host verdict, and
its reason says so.

``targets.json`` holds each target's numerics.json (as the host's validation writes it) or why it
did not run. No time is recorded: qemu's times say nothing of a device's.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from etforge.builders.capture.reference import REFERENCE
from etforge.checks.not_run import NotRun
from etforge.checks.numerics import Numerics
from etforge.config import target_runtime as tr
from etforge.config.model import ModelKind
from etforge.core.errors import BuildError
from etforge.pipeline.results import BuildRequest, BuildResult, TaskStatus
from etforge.pipeline.stage_results import ExportResult, TargetVerdict, Verdict

PROGRAM, DATA = "program.pte", "program.ptd"
TARGETS_JSON = "targets.json"


def target_stage(request: BuildRequest) -> BuildResult:
    from etforge.builders.targets.needs import missing_needs

    cell, export, capture = request.cell, request.upstream["export"], request.upstream["capture"]
    program = export.result(ExportResult)
    program_sha256 = export.sha256.get(PROGRAM)
    record = tr.runner_record()
    lacking = tr.missing(tr.fingerprint())
    if lacking is None and record is not None:
        lacking = missing_needs(program, record)
    if lacking is None and cell.model.kind != ModelKind.MODULE:
        lacking = f"an {cell.model.kind.value} program's decode loop is judged on this host only (targets run nn.Module programs)"
    checks, found = [], {}
    for target in cell.targets:
        if lacking is not None:
            check = NotRun(target=target.label, why=lacking)
            found[target.label] = {"not_run": lacking}
        else:
            check, found[target.label] = _judge(request, target, export.files, capture.files[REFERENCE], program)
        checks.append(check)
    checks = _grouped(checks)
    out = request.workdir / TARGETS_JSON
    out.write_text(json.dumps(found, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    verdict = TargetVerdict(program_sha256=program_sha256, checks=tuple(checks))
    failed = [c for c in checks if c.failed]
    if failed:
        return BuildResult(
            files={TARGETS_JSON: out}, result=verdict, status=TaskStatus.FAILED, reason=failed[0].reason()
        )
    return BuildResult(files={TARGETS_JSON: out}, result=verdict)


def _grouped(checks: list) -> list:
    """NotRun checks with one reason: the first names every target that lacked it, the rest repeat it."""
    first: dict = {}
    for check in checks:
        if isinstance(check, NotRun):
            first.setdefault(check.why, []).append(check.target)
    out = []
    for check in checks:
        if isinstance(check, NotRun):
            targets = first[check.why]
            repeats = check.target != targets[0]
            check = replace(check, also=() if repeats else tuple(targets[1:]), repeats=repeats)
        out.append(check)
    return out


def _judge(request: BuildRequest, target, files: dict, reference: Path, program: ExportResult) -> tuple:
    """(the target's check, its numerics.json) after running the program there on the samples."""
    from etforge.builders.numerics.validate import NUMERICS, Runner, build_validate
    from etforge.builders.runtime.program_io import checked_data_path
    from etforge.builders.targets.needs import runner_binary
    from etforge.builders.targets.qemu import NotRunnable, run_samples

    pte = Path(files[PROGRAM])
    data = checked_data_path(pte, Path(files[DATA]) if DATA in files else None)
    binary = runner_binary()

    def run(path, samples, method="forward"):
        return run_samples(binary, target.cpu, path, samples, method, data)

    workdir = request.workdir / target.profile
    workdir.mkdir()
    runner = Runner(run=run, name=target.label, target=target.label)
    try:
        built = build_validate(
            request.cell, pte, reference, list(program.input_dtypes), workdir, runner=runner,
            program_sha256=request.upstream["export"].sha256.get(PROGRAM),
        )  # fmt: skip
    except NotRunnable as exc:
        return NotRun(target=target.label, why=str(exc)), {"not_run": str(exc)}
    verdict = built.result
    # the numerics check (a target judges the program's outputs; task metrics stay the host's)
    check = next((c for c in verdict.checks if isinstance(c, Numerics)), None) if isinstance(verdict, Verdict) else None
    if check is None:
        raise BuildError(f"the validation on {target.label} gave no numerics check")
    # A target's misses name it: the cell's reason says which runtime missed.
    check = replace(check, misses=tuple(f"{target.label}: {miss}" for miss in check.misses))
    return check, json.loads((workdir / NUMERICS).read_text(encoding="utf-8"))
