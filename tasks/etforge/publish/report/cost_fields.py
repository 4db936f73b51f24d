"""The report's view of what a program costs: the matrix's size and planned-memory texts.

    cost_fields(program) -> the row fields (planned_bytes, planned_text, planned_title, size_title,
                            size_parts, subgraphs_text); EMPTY: the same for a row with no program

Figures are the export's result of the outcome (its record, etforge.builders.lowering.program_costs).
"""

from __future__ import annotations

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


def cost_fields(program) -> dict:
    """The row fields of ``program`` (an export's result; None: no program)."""
    if program is None:
        return dict(EMPTY)
    costs = program.costs
    parts = size_parts(costs.size_breakdown or {})
    peak = costs.planned_peak
    methods = "; ".join(
        f"{m}: {', '.join(human_size(n) for n in sizes) or 'none'}" for m, sizes in sorted(costs.planned_bytes.items())
    )
    subgraphs = sum(costs.delegate_subgraphs.values()) if costs.delegate_subgraphs else 0
    return {
        "planned_bytes": peak,
        "planned_text": human_size(peak) if peak is not None else "-",
        "planned_title": "; ".join(filter(None, [methods, costs.planned_note or ""])),
        "size_title": ", ".join(f"{k} {human_size(v)}" for k, v in parts.items())
        + (f"; .ptd {human_size(program.data_size_bytes)}" if program.data_size_bytes else ""),
        "size_parts": parts,
        "subgraphs_text": f"{subgraphs} delegated subgraph(s)" if costs.delegate_subgraphs else "",
    }
