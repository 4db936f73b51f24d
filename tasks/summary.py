"""The end-of-run table: one row per cell, read from the tasks' state records."""

from __future__ import annotations

from tasks.doit_tasks import capture_spec, export_spec, quantize_spec, size_gate_spec, validate_spec
from tasks.plan import Cell, Plan
from tasks.runner import read_state


def human_size(n) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return "-"


def cell_row(plan: Plan, cell: Cell) -> dict:
    capture = read_state(capture_spec(plan, cell.model).state_file) or {}
    quantize = read_state(quantize_spec(plan, cell).state_file) or {} if cell.transform else {}
    export = read_state(export_spec(plan, cell).state_file) or {}
    gate = read_state(size_gate_spec(plan, cell).state_file) or {} if plan.fp32_sibling(cell) else {}
    validate = read_state(validate_spec(plan, cell).state_file) or {}
    export_status = export.get("status", "not built")
    validate_status = validate.get("status", "-")
    failed = next((r for r in (capture, quantize, export, gate, validate) if r.get("status") == "failed"), None)
    if failed is not None:
        status = "failed"
        note = f"{failed['task']}: {failed.get('reason', '')}"
        if failed.get("log"):
            note += f" (log: {failed['log']})"
    elif export_status == "skipped":
        status, note = "skipped", export.get("reason", "")
    elif export_status == "ok":
        status = "ok" if validate_status in ("ok", "-") else validate_status
        note = validate.get("reason", "") if validate_status in ("skipped", "not-runnable") else ""
        if str((quantize.get("info") or {}).get("calibration", "")).startswith("random"):
            note = "; ".join(filter(None, [note, "random calibration data (name some in pipeline.yaml)"]))
    else:
        status, note = export_status, ""
    sqnr = (validate.get("info") or {}).get("sqnr_db")
    if validate_status in ("ok", "failed") and sqnr is None and (validate.get("info") or {}).get("passed") is not None:
        sqnr_text = "exact"
    else:
        sqnr_text = "-" if sqnr is None else f"{sqnr:.1f}"
    info = export.get("info") or {}
    return {
        "cell": cell.name, "status": status,
        "export": export_status, "validate": validate_status,
        "size": human_size(info.get("size_bytes")),
        "sqnr_db": sqnr_text,
        "time": f"{info['lowering_s']:.1f}s" if "lowering_s" in info else "-",
        "p50_ms": "-",  # add_benchmarks fills it in
        "note": note,
    }


def add_benchmarks(plan: Plan, cells, host: dict, rows: list) -> None:
    """Fill each row's p50 latency, and flag cells slower than the pipeline's baseline."""
    from tasks.report import baseline_regressions, benchmark_results

    bench = benchmark_results(plan, cells, host)
    for row in rows:
        p50 = (bench.get(row["cell"]) or {}).get("latency_p50_ms")
        row["p50_ms"] = "-" if p50 is None else f"{p50:.3f}"
    if not plan.benchmark.get("baseline"):
        return
    try:
        flags = baseline_regressions(plan, bench)
    except ValueError as exc:  # a malformed baseline file: say so, once
        rows[0]["note"] = "; ".join(filter(None, [rows[0]["note"], f"baseline not read: {exc}"]))
        return
    by_cell = {f["cell"]: f for f in flags}
    for row in rows:
        flag = by_cell.get(row["cell"])
        if flag:
            text = (f"REGRESSION: p50 {flag['current_p50_ms']:.3f} ms is {flag['change_pct']:+.0f}% vs baseline "
                    f"{flag['baseline_p50_ms']:.3f} ms" + (" (different host)" if flag.get("same_host") is False else ""))
            row["note"] = "; ".join(filter(None, [row["note"], text]))


def rejected_row(rejected) -> dict:
    return {"cell": rejected.name, "status": "rejected", "export": "-", "validate": "-",
            "size": "-", "sqnr_db": "-", "time": "-", "p50_ms": "-", "note": rejected.reason}


def render(rows: list) -> str:
    columns = [("cell", "cell"), ("status", "status"), ("size", "size"), ("sqnr_db", "SQNR dB"),
               ("p50_ms", "p50 ms"), ("time", "lower"), ("note", "")]
    widths = {k: max([len(title)] + [len(str(r[k])) for r in rows]) for k, title in columns}
    lines = ["  ".join(title.ljust(widths[k]) for k, title in columns).rstrip()]
    lines.append("  ".join("-" * widths[k] for k, _ in columns[:-1]))
    for r in rows:
        lines.append("  ".join(str(r[k]).ljust(widths[k]) for k, _ in columns).rstrip())
    counts: dict = {}
    for r in rows:
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    lines.append(", ".join(f"{n} {s}" for s, n in sorted(counts.items())))
    return "\n".join(lines)
