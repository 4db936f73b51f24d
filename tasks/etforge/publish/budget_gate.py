"""The budget gate: a cell whose program is bigger, or plans more memory, than its budget fails.

    over_budget(plan, cell, export) -> one line naming both numbers and the budget, or None

Budgets are ``gates.max_program_bytes`` / ``gates.max_planned_bytes`` (etforge.config.budgets);
the figures are the export's (etforge.builders.lowering.program_costs). Every comparison fails on a
value that is not a number, and a budget on a figure the export did not record fails too:
an unmeasured program cannot be said to fit.
"""

from __future__ import annotations

from etforge.config.budgets import BUDGETS, budget_of
from etforge.pipeline.stage_results import ExportResult
from etforge.program.costs import planned_peak, program_bytes


def _figure(gate: str, export: ExportResult) -> int | None:
    if gate == "max_program_bytes":
        return program_bytes(export.size_bytes, export.data_size_bytes)
    return planned_peak(export.planned_bytes)


def over_budget(plan, cell, export: ExportResult) -> str | None:
    """Why ``cell``'s program does not fit its budgets, or None (no budget, or within every one)."""
    problems = []
    for gate, what in BUDGETS.items():
        budget = budget_of(plan, cell, gate)
        if budget is None:
            continue
        limit, where = budget
        value = _figure(gate, export)
        if value is None:
            problems.append(f"{what} not recorded by the export, {where} is {limit} B")
        elif not value <= limit:
            problems.append(f"{what} {value} B > {where} {limit} B")
    return "over budget: " + "; ".join(problems) if problems else None
