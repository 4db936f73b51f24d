"""The end-of-run table: one row per cell, each the cell's outcome (etforge.publish.outcome).

A row shows the program's size, then one column per check heading (etforge.checks: delegation,
the size gate, SQNR on a runtime, ...) with that check's short text, the benchmark and the
reason; summary.json keeps the same rows (``checks``: heading -> text)."""

from __future__ import annotations

from etforge.config.model import Cell, Plan
from etforge.publish import baseline, outcome
from etforge.publish.outcome import CellOutcome


def human_size(n) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return "-"


def check_texts(o: CellOutcome) -> dict:
    """heading -> the short text of each of the cell's checks (the first check of a heading wins)."""
    out: dict = {}
    for check in o.facts.checks:
        out.setdefault(check.heading(), check.text())
    return out


def outcome_row(o: CellOutcome, shown=None) -> dict:
    """The cell's summary row; ``shown`` turns its log's path into what a shipped file may name
    (the report: relative to the artifacts, so two checkouts write the same bytes)."""
    facts = o.facts
    note = o.reason
    if o.log and o.status in ("failed", "expected-failure"):
        note += f" (log: {shown(o.log) if shown else o.log})"
    p50 = facts.latency_p50_ms
    program = facts.program
    lowering_s = program.lowering_s if program is not None else None
    return {
        "cell": o.cell,
        "status": o.status,
        "size": human_size(program.size_bytes if program is not None else None),
        "checks": check_texts(o),
        "time": "-" if lowering_s is None else f"{lowering_s:.1f}s",
        "p50_ms": "-" if p50 is None else f"{p50:.3f}",
        "note": note,
    }


def cell_row(plan: Plan, cell: Cell, host: dict | None = None) -> dict:
    return outcome_row(outcome.cell_outcome(plan, cell, host))


def rejected_row(rejected) -> dict:
    return outcome_row(outcome.rejected_outcome(rejected))


def rows(plan: Plan, outcomes: list) -> list:
    """Table rows of ``outcomes``, with the benchmark baseline's regressions in the notes."""
    table = [outcome_row(o) for o in outcomes]
    add_baseline_flags(plan, outcomes, table)
    return table


def add_baseline_flags(plan: Plan, outcomes: list, rows: list) -> None:
    """Flag cells slower than the pipeline's benchmark baseline, if it names one."""
    if not plan.benchmark.baseline or not rows:
        return
    bench = {o.cell: o.facts.benchmark.to_json() for o in outcomes if o.facts.benchmark}
    try:
        flags = baseline.regressions(plan, bench)
    except ValueError as exc:  # a malformed baseline file: say so, once
        rows[0]["note"] = "; ".join(filter(None, [rows[0]["note"], f"baseline not read: {exc}"]))
        return
    by_cell = {f["cell"]: f for f in flags}
    for row in rows:
        flag = by_cell.get(row["cell"])
        if flag:
            text = (
                f"REGRESSION: p50 {flag['current_p50_ms']:.3f} ms is {flag['change_pct']:+.0f}% vs baseline "
                f"{flag['baseline_p50_ms']:.3f} ms" + (" (different host)" if flag.get("same_host") is False else "")
            )
            row["note"] = "; ".join(filter(None, [row["note"], text]))


def table(plan: Plan, results: list) -> list:
    """The summary's rows (summary.json, the console table): one per cell outcome, then the
    refused combinations of their models."""
    models = {o.cell.split("/")[0] for o in results}
    return rows(plan, results) + [rejected_row(r) for r in plan.rejected if r.model in models]


def render(rows: list) -> str:
    headings = list(dict.fromkeys(h for r in rows for h in r.get("checks") or {}))
    columns = [("cell", "cell"), ("status", "status"), ("size", "size")]
    columns += [(f"check:{h}", h) for h in headings]
    columns += [("p50_ms", "p50 ms"), ("time", "lower"), ("note", "")]

    def value(row: dict, key: str) -> str:
        if key.startswith("check:"):
            return str((row.get("checks") or {}).get(key[6:], "-"))
        return str(row[key])

    widths = {k: max([len(title)] + [len(value(r, k)) for r in rows]) for k, title in columns}
    lines = ["  ".join(title.ljust(widths[k]) for k, title in columns).rstrip()]
    lines.append("  ".join("-" * widths[k] for k, _ in columns[:-1]))
    for r in rows:
        lines.append("  ".join(value(r, k).ljust(widths[k]) for k, _ in columns).rstrip())
    counts: dict = {}
    for r in rows:
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    order = {s: i for i, s in enumerate(outcome.STATUSES)}
    lines.append(", ".join(f"{counts[s]} {s}" for s in sorted(counts, key=lambda s: (order.get(s, len(order)), s))))
    return "\n".join(lines)
