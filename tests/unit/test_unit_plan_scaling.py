"""Planning is linear in cells: counted in lookups among the cells, not timed (benchmarks/plan_scaling.py
times it).

A pipeline of N models and one of 4N (x 5 backends x 3 schemes) are planned as a run plans them:
every task's spec and key (run_specs) and every stage's doit task dicts (stage_tasks). The cells
looked at for 4x the cells must stay within 4.5x: a scan of every cell for each cell (the fp32
sibling of each quantized cell was found that way) makes the count grow with the square of the cells.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from etforge.cache.store import Store
from etforge.pipeline.specs import run_specs
from etforge.pipeline.stages import DEFAULT_TABLE, STAGES
from unit.support import HOST, make_unit_project

BACKENDS = ("xnnpack", "portable", "vulkan", "coreml", "openvino")
SCHEMES = ("fp32", "int8", "fp16")


def _pipeline(models: int) -> str:
    lines = ["name: t", "version: 0.0.1", "models:"]
    for i in range(models):
        lines += [f"  m{i}:", "    python: models.a:build", "    inputs: [{name: x, shape: [1, 4]}]"]
    lines += ["backends:"] + [f"  {b}: {{}}" for b in BACKENDS] + [f"quantization: [{', '.join(SCHEMES)}]"]
    lines += [
        "matrix:",
        '  expected_failures: [{model: m0, quantization: int8, reason: "a known bug", link: "https://x/1"}]',
    ]
    return "\n".join(lines) + "\n"


class Counted(tuple):
    """The plan's cells, counting each cell handed out by iteration: a lookup among the cells."""

    def __iter__(self):
        for cell in super().__iter__():
            self.lookups += 1
            yield cell


def _lookups_to_plan(root: Path, models: int) -> tuple[int, int]:
    """(cells, cells looked at while planning every task of every cell)."""
    from etforge.engine.taskdicts import stage_tasks

    project = make_unit_project(root, _pipeline(models), ("a",))
    cells = Counted(project.plan().cells)
    cells.lookups = 0
    plan = replace(project.plan(), cells=cells)
    store = Store(root / "artifacts" / "cache")
    run_specs(plan, plan.cells, HOST)
    for stage in STAGES:
        stage_tasks(plan, DEFAULT_TABLE, stage, plan.cells, store, HOST)
    return len(cells), cells.lookups


def test_planning_four_times_the_cells_looks_at_most_four_and_a_half_times_as_often(tmp_path):
    small_cells, small = _lookups_to_plan(tmp_path / "small", 8)
    large_cells, large = _lookups_to_plan(tmp_path / "large", 32)
    assert large_cells == 4 * small_cells  # (the recipes refuse a few combinations at plan time)
    assert large <= 4.5 * small, f"{small} lookups for {small_cells} cells, {large} for {large_cells}"
