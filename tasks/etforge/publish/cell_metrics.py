"""Every figure a later ``etforge diff`` compares, per cell, in two parts.

    measured(plan, cell, outcome) -> dict    deterministic: goes into provenance.json (reproducible)
    timings(outcome) -> dict | None          host timings: go beside the archive (<release>.bench.json)
    snapshot(plan, cells, host) -> dict      the current run, as a release records it (etforge diff)
    current_form(metrics) -> dict            a release's ``metrics`` of any format, in this one
    read_measured(metrics, path) -> dict     the same, checked first (BadValue naming the key)
    check(value, shape, path)                BadValue unless ``value`` has ``shape`` (MEASURED, TIMING, ...)

``measured`` holds what the program's bytes and its checks decide: the program's own figures
(its size and breakdown, its external weights, planned memory, delegates), a digest of the
model's definition and the tools of its recipes, and per check (etforge.checks, by key) the
figures it compares (each with its direction and tolerance, Figure.to_json) and the structure
that says what changed when the bytes changed. Numbers are rounded to the precision they mean
(Figure.digits), so that the same program gives the same bytes.

``timings`` is the benchmark's result as recorded (p50, p90, spread, iterations, peak RSS, an
LLM's tokens per second, the host): it differs run to run and never enters the archive.

What a diff reads back of a release is checked against the shapes below (MEASURED, FORMAT_1,
TIMING, BASELINE_CELL) by :func:`check`, so that a damaged or hostile release is one error
naming the key path, never a TypeError in the comparison: every field a diff reads, with the
JSON type it must hold (a number: finite, not a bool, within a float's range).
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass

from etforge.checks.base import Check, finite
from etforge.checks.delegation import Delegation
from etforge.checks.numerics import Numerics
from etforge.core.digest import digest
from etforge.core.errors import BadValue
from etforge.core.key_path import format_path
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
    if not isinstance(metrics, dict) or (finite(metrics.get("format")) or 1) >= MEASURED_FORMAT:
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


# ---------------------------------------------------------------- the shapes a diff reads back


@dataclass(frozen=True)
class Scalar:
    """A JSON scalar of one of ``kinds``: "number", "text", "flag" (true or false), "null"."""

    kinds: tuple


@dataclass(frozen=True)
class Record:
    """An object whose named fields have their shapes. A field absent or null was not recorded
    (unless ``required``); a field not named is not read, so not checked."""

    fields: dict
    required: tuple = ()


@dataclass(frozen=True)
class MapOf:
    """An object whose every value has ``value``'s shape (its keys: any names)."""

    value: object


@dataclass(frozen=True)
class ListOf:
    """A list whose every item has ``item``'s shape."""

    item: object


@dataclass(frozen=True)
class Either:
    """Any one of ``shapes``."""

    shapes: tuple


NUMBER, TEXT, FLAG = Scalar(("number",)), Scalar(("text",)), Scalar(("flag",))
SCALAR = Scalar(("number", "text", "flag", "null"))
COUNTS = MapOf(NUMBER)  # e.g. ops per delegate
BREAKDOWN = MapOf(Either((NUMBER, COUNTS)))  # {"constants", "delegates": {backend: bytes}, "program", "total"}
PLANNED = MapOf(ListOf(NUMBER))  # method -> its buffers' bytes
FIGURE = Record(
    {
        "value": NUMBER,
        "unit": TEXT,
        "better": TEXT,
        "tolerance": TEXT,
        "relative": FLAG,
        "scale": NUMBER,
        "tolerance_scale": NUMBER,
    }
)
MEASURED = Record(  # measured(): format 2
    {
        "format": NUMBER,
        "model_sha256": TEXT,
        "tools": MapOf(SCALAR),
        "program": Record(
            {
                "bytes": NUMBER,
                "data_bytes": NUMBER,
                "constant_bytes": NUMBER,
                "breakdown": BREAKDOWN,
                "planned_bytes": PLANNED,
                "delegates": ListOf(TEXT),
            }
        ),
        "checks": MapOf(Record({"figures": MapOf(FIGURE), "structure": MapOf(Either((SCALAR, COUNTS)))})),
    }
)
_OUTPUT = {"sqnr_db": NUMBER, "top1_agreement": NUMBER, "top5_agreement": NUMBER}
FORMAT_1 = Record(  # a release's metrics before checks (etforge-provenance/2), read by current_form
    {
        "format": NUMBER,
        "model_sha256": TEXT,
        "tools": MapOf(SCALAR),
        "size": Record({"bytes": NUMBER, "data_bytes": NUMBER, "constant_bytes": NUMBER, "breakdown": BREAKDOWN}),
        "delegation": Record(
            {
                "coverage": NUMBER,
                "not_delegated": COUNTS,
                "delegated_by_backend": COUNTS,
                "delegated_ops": NUMBER,
                "non_delegated_ops": NUMBER,
                "delegated_subgraphs": NUMBER,
                "delegates": ListOf(TEXT),
            }
        ),
        "numerics": Record({**_OUTPUT, "exact": FLAG, "outputs": ListOf(Record({"output": SCALAR, **_OUTPUT}))}),
        "memory": Record({"planned_bytes": PLANNED}),
    }
)
TIMING = Record(  # timings(): what a diff reads of a cell's benchmark
    {
        "latency_p50_ms": NUMBER,
        "latency_p90_ms": NUMBER,
        "latency_stdev_ms": NUMBER,
        "host_id": TEXT,
        "peak_rss_mb": NUMBER,
        "llm": Record({"decode_tok_s": NUMBER, "prefill_tok_s": NUMBER, "peak_rss_mb": NUMBER}),
    }
)
BASELINE_CELL = Record(  # a baseline's cell as etforge.publish.diff_baseline reads it (and keeps it)
    {"status": TEXT, "sha256": TEXT, "cell": Record({"thresholds": MapOf(SCALAR)}), "metrics": MEASURED},
    required=("status",),
)


def _kind(value) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "flag"
    if isinstance(value, str):
        return "text"
    if isinstance(value, float) and math.isfinite(value) or isinstance(value, int) and abs(value) <= sys.float_info.max:
        return "number"  # (an int is compared exactly: no float() of a huge one)
    if isinstance(value, int | float):
        return "a number out of range" if isinstance(value, int) or math.isinf(value) else "NaN"
    return "list" if isinstance(value, list) else "object"


_SAID = {
    "null": "null",
    "flag": "true or false",
    "text": "a string",
    "number": "a number",
    "list": "a list",
    "object": "an object",
}


def _expected(shape) -> str:
    if isinstance(shape, Scalar):
        return " or ".join(_SAID[k] for k in shape.kinds)
    if isinstance(shape, Either):
        return " or ".join(_expected(s) for s in shape.shapes)
    return "a list" if isinstance(shape, ListOf) else "an object"


def _fits(value, shape) -> bool:
    try:
        check(value, shape)
    except BadValue:
        return False
    return True


def check(value, shape, path: tuple = ()) -> None:
    """Nothing when ``value`` has ``shape``; else BadValue naming the key path of the first field
    that does not (``cells[2].metrics.program.bytes: expected a number, got a string``). Recursive
    along the shape only, so a value nested deeper than its shape is one error, never a RecursionError."""
    if isinstance(shape, Scalar):
        kind = _kind(value)
        ok = kind in shape.kinds
    elif isinstance(shape, Either):
        ok = any(_fits(value, s) for s in shape.shapes)
    elif isinstance(shape, ListOf):
        ok = isinstance(value, list)
        for i, item in enumerate(value if ok else ()):
            check(item, shape.item, (*path, i))
    else:
        ok = isinstance(value, dict)
        for name, item in value.items() if ok and isinstance(shape, MapOf) else ():
            check(item, shape.value, (*path, name))
        for name, item_shape in shape.fields.items() if ok and isinstance(shape, Record) else ():
            if value.get(name) is None and name in shape.required:
                raise BadValue(f"{format_path((*path, name))}: {_expected(item_shape)} is required, none is recorded")
            if value.get(name) is not None:
                check(value[name], item_shape, (*path, name))
    if not ok:
        kind = _kind(value)
        raise BadValue(f"{format_path(path)}: expected {_expected(shape)}, got {_SAID.get(kind, kind)}")


def read_measured(metrics, path: tuple = ()) -> dict:
    """A release's ``metrics`` (of any format, null: none) checked and in today's form (current_form);
    BadValue names the key path of the first field a diff could not read."""
    if metrics is None:
        return {}
    check(metrics, Record({"format": NUMBER}), path)
    older = (finite(metrics.get("format")) or 1) < MEASURED_FORMAT
    check(metrics, FORMAT_1 if older else MEASURED, path)
    return current_form(metrics)
