"""Every figure a later ``etforge diff`` compares, per cell, in two parts.

    measured(plan, cell, outcome) -> dict    deterministic: goes into provenance.json (reproducible)
    timings(outcome) -> dict | None          host timings: go beside the archive (<release>.bench.json)
    snapshot(plan, cells, host) -> dict      the current run, as a release records it (etforge diff)

``measured`` holds what the program's bytes and its verdict decide: the size (and its breakdown
where the export measured one), delegation (coverage, ops by backend, ops left on portable
kernels, delegates), numerics (the worst SQNR and top-k agreement, and each output's, read from
the cell's numerics.json when it judged this program), planned memory where recorded, and a
digest of the model's definition. Numbers are rounded to the precision they mean (SQNR to
0.01 dB, fractions to 4 digits), so that the same program gives the same bytes.

``timings`` is the benchmark's result as recorded (p50, p90, spread, iterations, peak RSS, an
LLM's tokens per second, the host): it differs run to run and never enters the archive.
"""

from __future__ import annotations

import json

from etforge.core.digest import digest
from etforge.pipeline.layout import layout_of
from etforge.publish import outcome

MEASURED_FORMAT = 1  # the shape of measured(): a diff reads older ones as far as they go
PROVENANCE_FORMAT = "etforge-provenance/2"  # a release's provenance.json; etforge diff refuses a newer one


def _round(value, digits: int):
    value = outcome.finite(value)
    return None if value is None else round(float(value), digits)


def _compact(mapping: dict) -> dict:
    return {k: v for k, v in mapping.items() if v not in (None, {}, [], ())}


def measured(plan, cell, o: outcome.CellOutcome) -> dict:
    """The deterministic figures of a cell's current program and verdict (see the module docstring)."""
    ev = o.evidence
    export = ev.export
    size = {
        "bytes": ev.size_bytes,
        "data_bytes": ev.data_size,
        "constant_bytes": export.constant_bytes if export else None,
        "breakdown": dict(export.size_breakdown) if export and export.size_breakdown else None,
    }
    delegation = {
        "coverage": _round(export.delegation_coverage if export else None, 4),
        "delegated_ops": ev.delegated_ops,
        "non_delegated_ops": ev.non_delegated_ops,
        "delegated_subgraphs": export.delegated_subgraphs if export else None,
        "delegated_by_backend": dict(export.delegated_by_backend) if export else None,
        "not_delegated": dict(export.not_delegated) if export else None,
        "delegates": list(ev.delegates),
    }
    if delegation["coverage"] is None and ev.coverage is not None:
        delegation["coverage"] = _round(ev.coverage, 4)
    numerics = {
        "exact": ev.exact if ev.validated_on and ev.bundle is None else None,
        "sqnr_db": _round(ev.metrics.get("sqnr_db"), 2),
        "top1_agreement": _round(ev.metrics.get("top1_agreement"), 4),
        "top5_agreement": _round(ev.metrics.get("top5_agreement"), 4),
        "outputs": per_output(plan, cell, o),
    }
    memory = {"planned_bytes": dict(export.planned_bytes) if export and export.planned_bytes else None}
    return _compact(
        {
            "format": MEASURED_FORMAT,
            "model_sha256": digest(cell.model.canonical()),
            "tools": tools(cell),
            "size": _compact(size),
            "delegation": _compact(delegation),
            "numerics": _compact(numerics),
            "memory": _compact(memory),
        }
    )


def tools(cell) -> dict:
    """The versions of the compilers, SDKs and runtimes the cell's recipes use (beyond the
    pipeline's toolchain): its lowering, quantizer and runtime tools, by name."""
    out: dict = {}
    for member in cell.backend.members:
        out.update(member.tools)
        out.update(member.runtime_tools)
    if cell.transform is not None:
        out.update(cell.transform.tools)
    return {k: out[k] for k in sorted(out)}


def per_output(plan, cell, o: outcome.CellOutcome) -> list:
    """Each output's SQNR and top-k agreement from the cell's numerics.json, when it judged this
    program (its ``program_sha256``); [] otherwise (not validated here, or another program)."""
    ev = o.evidence
    if not ev.validated_on or ev.bundle is not None or not ev.sha256:
        return []
    try:
        report = json.loads(layout_of(plan).numerics_path(cell).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    if not isinstance(report, dict) or report.get("program_sha256") != ev.sha256:
        return []
    out = []
    for i, metrics in enumerate(report.get("outputs") or ()):
        if not isinstance(metrics, dict):
            continue
        out.append(
            _compact(
                {
                    "output": str(metrics.get("name") or metrics.get("path") or i),
                    "sqnr_db": _round(metrics.get("sqnr_db"), 2),
                    "top1_agreement": _round(metrics.get("top1_agreement"), 4),
                    "top5_agreement": _round(metrics.get("top5_agreement"), 4),
                }
            )
        )
    return out


def timings(o: outcome.CellOutcome) -> dict | None:
    """The cell's benchmark on this program, as recorded (None: not benchmarked here)."""
    return o.evidence.benchmark.to_json() if o.evidence.benchmark else None


def snapshot(plan, cells, host: dict | None, outcomes=None) -> dict:
    """The current run in the shape a release's provenance gives a diff:
    {"cells": {name: {"status", "sha256", "cell", "metrics"}}, "timings": {name: bench}}."""
    by_name = {c.name: c for c in cells}
    rows: dict = {}
    bench: dict = {}
    # ``outcomes``: the run's (etforge.publish.outcome_memo RunOutcomes), or decided here
    for o in outcomes.outcomes(cells) if outcomes is not None else outcome.outcomes(plan, cells, host):
        cell = by_name[o.cell]
        row = {"status": str(o.status), "cell": cell.canonical()}
        if o.ships:
            row.update(sha256=o.evidence.sha256, metrics=measured(plan, cell, o))
        rows[o.cell] = row
        if timings(o):
            bench[o.cell] = timings(o)
    models = {c.model.name for c in cells}
    for r in plan.rejected:
        if r.model in models:
            rows.setdefault(r.name, {"status": "rejected"})
    return {"cells": rows, "timings": bench, "toolchain": dict(plan.toolchain or {})}
