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
        note = validate.get("reason", "") if validate_status == "skipped" else ""
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
        "note": note,
    }


def rejected_row(rejected) -> dict:
    return {"cell": rejected.name, "status": "rejected", "export": "-", "validate": "-",
            "size": "-", "sqnr_db": "-", "time": "-", "note": rejected.reason}


def render(rows: list) -> str:
    columns = [("cell", "cell"), ("status", "status"), ("size", "size"), ("sqnr_db", "SQNR dB"),
               ("time", "lower"), ("note", "")]
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
