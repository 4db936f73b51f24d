"""The check table: every kind of check etforge knows, registered once.

    CHECKS.parse(raw) -> Check | None             a record's check, by its "check" name (unknown: None)
    CHECKS.parse_all(raws) -> (Check, ...)
    CHECKS.derived(plan, cell, program) -> (Check, ...)   the checks decided from the plan and the program
    CHECKS.adding(CheckKind(...)) -> CheckTable   this table and one more kind (a test, an extension)

A check a task measures is written into its stage's result (``checks``) by the builder and read
back through :meth:`CheckTable.parse`; a check no task measures (a budget, the runtime window)
has a ``derive`` function, called when the cell's outcome is decided (etforge.publish.outcome,
which is handed the table). Adding a check is one module, one entry here and its tests: the
outcome, the report, the manifests, ``etforge diff`` and the release read every check through
the methods of etforge.checks.base.Check.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from etforge.checks.base import Check, ProgramFacts
from etforge.checks.budgets import Budgets
from etforge.checks.budgets import derive as derive_budgets
from etforge.checks.delegation import Delegation
from etforge.checks.llm_quality import LlmQuality
from etforge.checks.not_run import NotRun
from etforge.checks.numerics import Numerics, OnDevice
from etforge.checks.runtime_window import RuntimeWindow
from etforge.checks.runtime_window import derive as derive_runtime_window
from etforge.checks.size import SizeGate
from etforge.checks.task_metrics import Accuracy, UserMetric
from etforge.checks.vela import Vela

Derive = Callable[..., "Check | None"]  # (plan, cell, program: ProgramFacts) -> the check, or None: not applicable


@dataclass(frozen=True)
class CheckKind:
    type: type[Check]
    derive: Derive | None = None  # decided from the plan and the program's facts, not measured by a task


@dataclass(frozen=True)
class CheckTable:
    kinds: tuple[CheckKind, ...]

    def _by_name(self) -> dict:
        return {k.type.kind: k.type for k in self.kinds}

    def parse(self, raw) -> Check | None:
        """The check a record holds (its JSON form), or None for a kind this table does not know
        (a record of a newer etforge) or a value that is no check."""
        if not isinstance(raw, dict):
            return None
        kind = self._by_name().get(raw.get("check"))
        return kind.from_json(raw) if kind is not None else None

    def parse_all(self, raws) -> tuple[Check, ...]:
        found = (self.parse(raw) for raw in (raws if isinstance(raws, list | tuple) else ()))
        return tuple(c for c in found if c is not None)

    def derived(self, plan, cell, program: ProgramFacts) -> tuple[Check, ...]:
        """Every check decided from the plan and the program (each kind's ``derive``; None: not applicable)."""
        found = (k.derive(plan, cell, program) for k in self.kinds if k.derive is not None)
        return tuple(c for c in found if c is not None)

    def adding(self, kind: CheckKind) -> CheckTable:
        return CheckTable(self.kinds + (kind,))


CHECKS = CheckTable(
    (
        CheckKind(Numerics),
        CheckKind(OnDevice),
        CheckKind(Delegation),
        CheckKind(SizeGate),
        CheckKind(Vela),
        CheckKind(NotRun),
        CheckKind(Accuracy),
        CheckKind(UserMetric),
        CheckKind(LlmQuality),
        CheckKind(Budgets, derive=derive_budgets),
        CheckKind(RuntimeWindow, derive=derive_runtime_window),
    )
)
