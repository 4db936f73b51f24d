"""Every figure a later ``etforge diff`` compares, per cell, in two parts.

    measured(plan, cell, outcome) -> dict    deterministic: goes into provenance.json (reproducible)
    timings(outcome) -> dict | None          host timings: go beside the archive (<release>.bench.json)
    snapshot(plan, cells, host) -> dict      the current run, as a release records it (etforge diff)
    current_form(metrics) -> dict            a release's ``metrics`` of any format, in this one

``measured`` holds what the program's bytes and its checks decide: the program's own figures
(its size and breakdown, its external weights, planned memory, delegates), a digest of the
model's definition and the tools of its recipes, and per check (etforge.checks, by key) the
figures it compares (each with its direction and tolerance, Figure.to_json) and the structure
that says what changed when the bytes changed. Numbers are rounded to the precision they mean
(Figure.digits), so that the same program gives the same bytes.

``timings`` is the benchmark's result as recorded (p50, p90, spread, iterations, peak RSS, an
LLM's tokens per second, the host): it differs run to run and never enters the archive.
"""

from __future__ import annotations

from etforge.checks.base import Check, finite
from etforge.checks.delegation import Delegation
from etforge.checks.numerics import Numerics
from etforge.core.digest import digest
from etforge.publish import outcome

MEASURED_FORMAT = 2  # the shape of measured(): a diff reads older ones as far as they go (current_form)
PROVENANCE_FORMAT = "etforge-provenance/3"  # a release's provenance.json; etforge diff refuses a newer one


def _compact(mapping: dict) -> dict:
    return {k: v for k, v in mapping.items() if v not in (None, {}, [], ())}


def check_snapshot(check: Check) -> dict:
    """What a diff compares of one check: its figures (with how each is judged) and its structure."""
    return _compact(
        {
            "figures": {f.name: f.to_json() for f in check.figures()},
            "structure": {k: v for k, v in check.structure().items() if v not in (None, {}, [], ())},
        }
    )


def measured(plan, cell, o: outcome.CellOutcome) -> dict:
    """The deterministic figures of a cell's current program and checks (see the module docstring)."""
    program = o.facts.program
    figures: dict = {}
    if program is not None:
        figures = {
            "bytes": program.size_bytes,
            "data_bytes": program.data_size_bytes,
            "constant_bytes": program.constant_bytes,
            "breakdown": dict(program.costs.size_breakdown) or None,
            "planned_bytes": dict(program.costs.planned_bytes) or None,
            "delegates": list(program.delegates),
        }
    return _compact(
        {
            "format": MEASURED_FORMAT,
            "model_sha256": digest(cell.model.canonical()),
            "tools": tools(cell),
            "program": _compact(figures),
            "checks": {c.key: s for c in o.facts.checks if (s := check_snapshot(c))},
        }
    )


def current_form(metrics: dict) -> dict:
    """``metrics`` as this etforge records them: a release's of format 1 (sections size, delegation,
    numerics, memory) read as far as it goes, through the checks they were (so that their
    figures are judged as today's are)."""
    if not isinstance(metrics, dict) or metrics.get("format", 1) >= MEASURED_FORMAT:
        return metrics if isinstance(metrics, dict) else {}

    def section(name: str) -> dict:
        value = metrics.get(name)
        return value if isinstance(value, dict) else {}

    size, delegation, numerics = section("size"), section("delegation"), section("numerics")
    outputs = [o for o in numerics.get("outputs") or () if isinstance(o, dict)]
    recorded = {
        k: numerics[k] for k in ("sqnr_db", "top1_agreement", "top5_agreement") if finite(numerics.get(k)) is not None
    }
    if numerics.get("exact") is True:  # identical to eager: no SQNR, no error
        recorded = {k: v for k, v in recorded.items() if k != "sqnr_db"} | {"max_abs_error": 0.0}
    checks = (
        Numerics.of(recorded | {"outputs": outputs}),
        Delegation.of(
            {"delegation_coverage": delegation["coverage"]} if finite(delegation.get("coverage")) is not None else {}
        ),
    )
    snapshots = {c.key: check_snapshot(c) for c in checks}
    if numerics.get("exact") is not True:  # not recorded: compared with nothing, never "no longer exact"
        snapshots["numerics"].get("figures", {}).pop("exact", None)
    snapshots["delegation"]["structure"] = {
        "portable op": delegation.get("not_delegated"),
        "ops delegated to": delegation.get("delegated_by_backend"),
        **{k: delegation.get(k) for k in ("delegated_ops", "non_delegated_ops", "delegated_subgraphs")},
    }
    program = {
        "bytes": size.get("bytes"),
        "data_bytes": size.get("data_bytes"),
        "constant_bytes": size.get("constant_bytes"),
        "breakdown": size.get("breakdown"),
        "planned_bytes": section("memory").get("planned_bytes"),
        "delegates": delegation.get("delegates"),
    }
    return {
        **{k: metrics[k] for k in ("model_sha256", "tools") if k in metrics},
        "format": MEASURED_FORMAT,
        "program": _compact(program),
        "checks": snapshots,
    }


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


def timings(o: outcome.CellOutcome) -> dict | None:
    """The cell's benchmark on this program, as recorded (None: not benchmarked here)."""
    return o.facts.benchmark.to_json() if o.facts.benchmark else None


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
        if o.ships and o.facts.program is not None:
            row.update(sha256=o.facts.program.sha256, metrics=measured(plan, cell, o))
        rows[o.cell] = row
        if timings(o):
            bench[o.cell] = timings(o)
    models = {c.model.name for c in cells}
    for r in plan.rejected:
        if r.model in models:
            rows.setdefault(r.name, {"status": "rejected"})
    return {"cells": rows, "timings": bench, "toolchain": dict(plan.toolchain or {})}
