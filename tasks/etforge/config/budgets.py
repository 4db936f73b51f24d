"""A program's budgets: ``gates: {max_program_bytes, max_planned_bytes}`` of pipeline.yaml.

    check_budgets(doc, cells)      each entry names a backend a cell uses, or a cell (one-line errors)
    budget_of(plan, cell, gate)    (bytes, where) of the entry that applies to ``cell``, or None

An entry is keyed by a backend name (every cell on it) or a cell ``model/backend/scheme``
(that cell; it wins over its backend's). The decision (a cell over budget fails, with both
numbers) is etforge.publish.outcome's: a budget changes no program, so it joins no build key.
"""

from __future__ import annotations

from etforge.config.yamlfile import format_path

BUDGETS = {
    "max_program_bytes": "program bytes (.pte + .ptd)",
    "max_planned_bytes": "planned memory",
}


def check_budgets(doc, cells) -> None:
    """Refuse a budget for a backend no cell uses or a cell the matrix does not build."""
    gates = doc.data.get("gates") or {}
    backends = sorted({c.backend.name for c in cells})
    names = {c.name for c in cells}
    for gate in BUDGETS:
        for key in gates.get(gate) or {}:
            path = ("gates", gate, key)
            if "/" in key and key not in names:
                raise doc.error(path, f"a budget for cell {key!r}, which the matrix does not build")
            if "/" not in key and key not in backends:
                raise doc.error(
                    path, f"a budget for backend {key!r}, which no cell uses (the cells use: {', '.join(backends)})"
                )


def budget_of(plan, cell, gate: str) -> tuple[int, str] | None:
    """(bytes, ``gates.<gate>.<key>``) of the budget that applies to ``cell``, or None."""
    entries = (plan.gates or {}).get(gate) or {}
    for key in (cell.name, cell.backend.name):
        if key in entries:
            return entries[key], format_path(("gates", gate, key))
    return None
