"""The report's view of what a program costs: the matrix's size and planned-memory texts.

    cost_fields(ev) -> the row fields (planned_bytes, planned_text, planned_title, size_title,
                       size_parts, subgraphs_text); EMPTY: the same for a row with no program

Figures are the outcome's evidence (the export's record, etforge.builders.lowering.program_costs).
"""

from __future__ import annotations

from etforge.program.costs import planned_peak
from etforge.publish.summary import human_size

EMPTY: dict = {
    "planned_bytes": None,
    "planned_text": "-",
    "planned_title": "",
    "size_title": "",
    "size_parts": {},
    "subgraphs_text": "",
}


def size_parts(breakdown: dict) -> dict:
    """{"constants", "delegate <id>"..., "program"} -> bytes, in that order, zero parts left out."""
    parts = {"constants": breakdown.get("constants")}
    for backend, n in (breakdown.get("delegates") or {}).items():
        parts[f"delegate {backend}"] = n
    parts["program"] = breakdown.get("program")
    return {k: int(v) for k, v in parts.items() if isinstance(v, int) and not isinstance(v, bool) and v > 0}


def cost_fields(ev) -> dict:
    parts = size_parts(ev.size_breakdown or {})
    peak = planned_peak(ev.planned_bytes)
    methods = "; ".join(
        f"{m}: {', '.join(human_size(n) for n in sizes) or 'none'}" for m, sizes in sorted(ev.planned_bytes.items())
    )
    subgraphs = sum(ev.delegate_subgraphs.values()) if ev.delegate_subgraphs else 0
    return {
        "planned_bytes": peak,
        "planned_text": human_size(peak) if peak is not None else "-",
        "planned_title": "; ".join(filter(None, [methods, ev.planned_note or ""])),
        "size_title": ", ".join(f"{k} {human_size(v)}" for k, v in parts.items())
        + (f"; .ptd {human_size(ev.data_size)}" if ev.data_size else ""),
        "size_parts": parts,
        "subgraphs_text": f"{subgraphs} delegated subgraph(s)" if ev.delegate_subgraphs else "",
    }
