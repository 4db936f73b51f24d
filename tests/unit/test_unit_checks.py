"""A check plugs in through the check table alone: a fake one, registered in-process, decides a cell's
state, shows in the report and the summary, and goes through ``etforge diff``, with no line of the
outcome, report or diff naming it (etforge.checks.table)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import ClassVar

from etforge.checks.base import Check, Figure
from etforge.checks.table import CHECKS, CheckKind
from etforge.config import defaults
from etforge.pipeline.stage_results import Verdict
from etforge.publish import cell_metrics, diff, summary
from etforge.publish.outcome import CellState, cell_outcome
from etforge.publish.outcome_memo import RunOutcomes
from etforge.publish.report.page import report_content
from etforge.publish.templates import render
from unit.support import HOST
from unit.test_unit_outcome import INT8, PROGRAM, SHA, Cell, project  # noqa: F401  (project: a fixture)

CAP = 10  # bytes: the fake check fails a program bigger than this


@dataclass(frozen=True, kw_only=True)
class TinyProgram(Check):
    """A made-up gate: the program must be at most CAP bytes."""

    kind: ClassVar[str] = "tiny_program"

    size: int | None = None
    cap: int | None = None

    def reason(self) -> str:
        return f"the program has {self.size} B, the tiny gate allows {self.cap} B" if self.failed else ""

    def heading(self) -> str:
        return "tiny"

    def text(self) -> str:
        return f"{self.size} B"

    def figures(self) -> tuple[Figure, ...]:
        return (Figure("tiny bytes", self.size, " B", "lower", "size_pct", relative=True, digits=0),)


def table(cap: int):
    """The check table every run uses, and the tiny gate at ``cap`` bytes."""

    def tiny(plan, cell, program) -> TinyProgram:
        return TinyProgram(passed=(program.size_bytes or 0) <= cap, size=program.size_bytes, cap=cap)

    return CHECKS.adding(CheckKind(TinyProgram, derive=tiny))


TABLE = table(CAP)


def _ok_cell(project) -> Cell:  # noqa: F811
    return Cell(project, INT8).built().validated()


def test_a_registered_check_decides_the_cells_state(project):  # noqa: F811
    cell = _ok_cell(project)
    assert cell.outcome().status == CellState.OK  # without it: the table every run uses
    o = cell_outcome(cell.plan, cell.cell, HOST, checks=TABLE)
    assert o.status == CellState.FAILED and o.fails_run
    assert o.reason == f"the program has {len(PROGRAM)} B, the tiny gate allows {CAP} B"
    assert summary.outcome_row(o)["checks"]["tiny"] == f"{len(PROGRAM)} B"  # its column of the table


def test_a_registered_check_appears_in_the_report(project):  # noqa: F811
    cell = _ok_cell(project)
    run = RunOutcomes(cell.plan, HOST, checks=TABLE)
    context = report_content(cell.plan, [cell.cell], HOST, run)
    assert "tiny" in context["check_headings"]
    html = render("report.html.j2", **context)
    assert '<th class="check">tiny</th>' in html and f"{len(PROGRAM)} B" in html
    assert "the tiny gate allows" in html  # the failed cell's reason


def test_a_registered_check_goes_through_diff(project):  # noqa: F811
    loose = table(1000)  # both programs pass: both ship, and diff compares their figures
    cell = _ok_cell(project)
    before = cell_metrics.snapshot(cell.plan, [cell.cell], HOST, RunOutcomes(cell.plan, HOST, checks=loose))
    assert before["cells"][INT8]["metrics"]["checks"]["tiny_program"]["figures"]["tiny bytes"]["value"] == len(PROGRAM)
    bigger = PROGRAM * 4
    cell.write("export", sha256=hashlib.sha256(bigger).hexdigest(), size_bytes=len(bigger))
    cell.validated(program_sha256=hashlib.sha256(bigger).hexdigest())
    after = cell_metrics.snapshot(cell.plan, [cell.cell], HOST, RunOutcomes(cell.plan, HOST, checks=loose))
    changes = diff.compare(before["cells"], {}, after, defaults.DIFF_TOLERANCES)
    found = {c.what: c for c in changes}
    tiny = found["tiny bytes"]
    assert (tiny.before, tiny.after, tiny.kind) == (f"{len(PROGRAM)} B", f"{len(bigger)} B", "regression")


def test_a_check_a_record_holds_is_read_only_by_a_table_that_knows_it():
    raw = {"program_sha256": SHA, "checks": [TinyProgram(passed=False, size=99).to_json()]}
    assert Verdict.from_json(raw).checks == ()  # a newer etforge's check: left out, never misread
    (read,) = Verdict.from_json(raw, TABLE).checks
    assert read == TinyProgram(passed=False, size=99) and read.failed


def test_diff_compares_a_checks_figure_by_its_own_direction_and_tolerance():
    def shipped(size: int) -> dict:
        metrics = {"format": 2, "checks": {"tiny_program": cell_metrics.check_snapshot(TinyProgram(size=size))}}
        return {"status": "ok", "sha256": SHA, "metrics": metrics}

    tol = defaults.DIFF_TOLERANCES
    changes = diff.compare({"c": shipped(100)}, {}, {"cells": {"c": shipped(150)}}, tol)
    assert [(c.what, c.before, c.after, c.kind) for c in changes] == [("tiny bytes", "100 B", "150 B", "regression")]
    changes = diff.compare({"c": shipped(100)}, {}, {"cells": {"c": shipped(101)}}, tol)
    assert [c.kind for c in changes] == ["changed"]  # within size_pct
    changes = diff.compare({"c": shipped(100)}, {}, {"cells": {"c": shipped(50)}}, tol)
    assert [c.kind for c in changes] == ["improvement"]
