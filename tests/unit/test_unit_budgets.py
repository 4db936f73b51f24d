"""Budgets (gates.max_program_bytes / max_planned_bytes): checked at load, decided in the outcome.

A budget is one line of pipeline.yaml; a bad one is refused in one line naming file, line and
key; a cell whose export records more bytes or more planned memory than its budget fails with
both numbers, and its listing line says so.
"""

from __future__ import annotations

import hashlib

import pytest

from etforge.cache.records import write_state
from etforge.checks.numerics import Numerics
from etforge.core.errors import PipelineError
from etforge.pipeline.layout import layout_of
from etforge.pipeline.results import TaskStatus
from etforge.pipeline.specs import spec_of
from etforge.pipeline.stage_results import CaptureResult, ExportResult, Verdict
from etforge.program.costs import ProgramCosts
from etforge.publish.outcome import CellState, cell_outcome
from etforge.publish.outcome_views import listing_reason
from unit.support import HOST, make_unit_project

PIPELINE = """\
name: t
version: 0.0.1
models:
  a:
    python: models.a:build
    inputs: [{name: x, shape: [1, 4]}]
backends: {xnnpack: {},
  portable: {}}
quantization: [fp32]
targets: false  # same line count: tests name pipeline.yaml lines
"""
PROGRAM = b"a program"
SHA = hashlib.sha256(PROGRAM).hexdigest()
COSTS = {
    "size_breakdown": {"constants": 96944, "delegates": {"XnnpackBackend": 2784}, "program": 2456, "total": 102184},
    "planned_bytes": {"forward": [12400], "etforge_meta_json": []},
    "delegate_subgraphs": {"XnnpackBackend": 1},
}


def _outcome(project, name: str, costs: dict | None = None, **export):
    plan = project.plan()
    cell = project.cell(plan, name)

    def write(stage, result):
        spec = spec_of(plan, stage, cell, HOST)
        write_state(spec, TaskStatus.OK, key=None, info=result.to_json(), reason="", log=spec.log_file)

    write("capture", CaptureResult(inputs="random (seeded)"))
    costs = ProgramCosts.of({**COSTS, **(costs or {})})
    write("export", ExportResult.of({"sha256": SHA, "size_bytes": 102184, "costs": costs, **export}))
    check = Numerics(passed=True, inputs="npz data/val.npz", samples=2, sqnr_db=50.0)
    write("validate", Verdict(program_sha256=SHA, checks=(check,)))
    return plan, cell_outcome(plan, cell, HOST)


def test_a_cell_over_its_planned_memory_budget_fails_with_both_numbers(tmp_path):
    project = make_unit_project(tmp_path / "p", PIPELINE + "gates: {max_planned_bytes: {xnnpack: 12399}}\n", ("a",))
    plan, o = _outcome(project, "a/xnnpack/fp32")
    assert o.status == CellState.FAILED and o.fails_run and not o.ships
    assert o.reason == "over budget: planned memory 12400 B > gates.max_planned_bytes.xnnpack 12399 B"
    assert listing_reason(o, layout_of(plan)) == o.reason


def test_a_cell_entry_wins_over_its_backend_and_program_bytes_count_the_ptd(tmp_path):
    gates = 'gates: {max_planned_bytes: {xnnpack: 1, "a/xnnpack/fp32": 12400}, max_program_bytes: {xnnpack: 110000}}\n'
    project = make_unit_project(tmp_path / "p", PIPELINE + gates, ("a",))
    assert _outcome(project, "a/xnnpack/fp32")[1].status == CellState.OK
    project = make_unit_project(tmp_path / "q", PIPELINE + gates, ("a",))
    o = _outcome(project, "a/xnnpack/fp32", data_size_bytes=10000, data_sha256="0" * 64)[1]
    assert o.reason == "over budget: program bytes (.pte + .ptd) 112184 B > gates.max_program_bytes.xnnpack 110000 B"


def test_a_budget_on_a_figure_the_export_did_not_record_fails(tmp_path):
    project = make_unit_project(tmp_path / "p", PIPELINE + "gates: {max_planned_bytes: {portable: 100}}\n", ("a",))
    o = _outcome(project, "a/portable/fp32", costs={"planned_bytes": {}})[1]
    assert o.status == CellState.FAILED
    assert "planned memory not recorded by the export" in o.reason


@pytest.mark.parametrize(
    "gates, message",
    [
        (
            "gates: {max_planned_bytes: {xnnpack: -1}}",
            "pipeline.yaml:11: gates.max_planned_bytes.xnnpack: expected a number of bytes (an integer >= 0), got -1",
        ),
        (
            "gates: {max_program_bytes: {xnnpack: lots}}",
            'pipeline.yaml:11: gates.max_program_bytes.xnnpack: expected a number of bytes (an integer >= 0), got "lots"',
        ),
        (
            "gates: {max_program_bytes: {vulkan: 1000}}",
            "pipeline.yaml:11: gates.max_program_bytes.vulkan: a budget for backend 'vulkan', which no cell uses "
            "(the cells use: portable, xnnpack)",
        ),
        (
            'gates: {max_planned_bytes: {"b/xnnpack/fp32": 1000}}',
            "pipeline.yaml:11: gates.max_planned_bytes[\"b/xnnpack/fp32\"]: a budget for cell 'b/xnnpack/fp32', "
            "which the matrix does not build",
        ),
    ],
)
def test_a_bad_budget_is_one_line_naming_file_line_and_key(tmp_path, gates, message):
    project = make_unit_project(tmp_path / "p", PIPELINE + gates + "\n", ("a",))
    with pytest.raises(PipelineError) as raised:
        project.plan()
    assert str(raised.value).split("/p/", 1)[1] == message
