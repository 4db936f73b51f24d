"""Budgets: a program bigger, or planning more memory, than ``gates.max_program_bytes`` /
``gates.max_planned_bytes`` (etforge.config.budgets) fails its cell.

Derived when a cell's outcome is decided, from the plan and the export's figures (a budget
changes no program, so no task computes it and no build key holds it). A budget on a figure
the export did not record fails too: an unmeasured program cannot be said to fit. Every
comparison fails on a value that is not a number.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from etforge.checks.base import Check, Figure, ProgramFacts
from etforge.config.budgets import BUDGETS, budget_of
from etforge.program.costs import program_bytes


@dataclass(frozen=True, kw_only=True)
class Budgets(Check):
    kind: ClassVar[str] = "budgets"

    program_bytes: int | None = None
    planned_bytes: int | None = None  # the largest arena one method plans
    limits: tuple = ()  # {"gate", "limit", "where"} of each budget that applies
    problems: tuple = ()  # one line per budget missed

    def reason(self) -> str:
        return "over budget: " + "; ".join(self.problems) if self.problems else ""

    def heading(self) -> str:
        return "budget"

    def text(self) -> str:
        return "over" if self.problems else "within"

    def detail(self) -> str:
        return "; ".join(f"{e.get('where')}: {e.get('limit')} B" for e in self.limits if isinstance(e, dict))

    def figures(self) -> tuple[Figure, ...]:
        return ()


def derive(plan, cell, program: ProgramFacts) -> Budgets | None:
    """The cell's budgets check, or None when no budget applies to it."""
    figures = {
        "max_program_bytes": program_bytes(program.size_bytes, program.data_size_bytes),
        "max_planned_bytes": program.costs.planned_peak,
    }
    limits, problems = [], []
    for gate, what in BUDGETS.items():
        budget = budget_of(plan, cell, gate)
        if budget is None:
            continue
        limit, where = budget
        limits.append({"gate": gate, "limit": limit, "where": where})
        value = figures[gate]
        if value is None:
            problems.append(f"{what} not recorded by the export, {where} is {limit} B")
        elif not value <= limit:
            problems.append(f"{what} {value} B > {where} {limit} B")
    if not limits:
        return None
    return Budgets(
        passed=not problems,
        program_bytes=figures["max_program_bytes"],
        planned_bytes=figures["max_planned_bytes"],
        limits=tuple(limits),
        problems=tuple(problems),
    )
