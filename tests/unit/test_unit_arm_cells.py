"""Arm cells in the plan and in their outcome: what recipes' runtime.validated_by and
runtime.probe change, from records, without torch.

The end-to-end checks (the reference model, Vela) are in tests/test_arm_cells_validated_here.py,
the VGF scenario runner's in tests/test_vgf_cells.py.
"""

from __future__ import annotations

import hashlib

import pytest

from etforge.builders.arm.ethos_u_vela import summary_fields
from etforge.checks.numerics import Numerics
from etforge.checks.vela import Vela
from etforge.pipeline.keys import key_of
from etforge.pipeline.layout import layout_of
from etforge.pipeline.stage_results import ExportResult
from etforge.pipeline.stages import STAGE
from etforge.publish.outcome import CellState
from etforge.publish.outcome_views import verdict
from unit.support import make_unit_project
from unit.test_unit_outcome import Cell

PIPELINE = """\
name: t
version: 0.0.1
models:
  a:
    python: models.a:build
    inputs: [{name: x, shape: [1, 4]}]
backends:
  arm_tosa: {}
  ethos_u55: {}
  arm_vgf: {}
quantization: [fp32, int8]
matrix:
  exclude: [{backend: ethos_u55, quantization: fp32}]
"""
PROGRAM = b"the int8 program"
SHA = hashlib.sha256(PROGRAM).hexdigest()
RUNNER = "TOSA reference model (tosa-tools 2026.5.0)"


@pytest.fixture
def project(tmp_path):
    return make_unit_project(tmp_path / "proj", PIPELINE, models=("a",))


def _built(project, name: str) -> Cell:
    cell = Cell(project, name)
    cell.write("capture", inputs="random (seeded)", outputs=[{"path": "", "shape": [1, 1], "dtype": "float32"}])
    if "quantize" in cell.stages():
        cell.write("quantize", method="pt2e", calibration="npz data/calib.npz")
    cell.write("export", sha256=SHA, size_bytes=len(PROGRAM), delegates=["TOSABackend"])
    return cell


def test_tosa_ethos_u_and_vgf_cells_are_validated_here(project):
    tosa, ethos, vgf = (Cell(project, n) for n in ("a/arm_tosa/int8", "a/ethos_u55/int8", "a/arm_vgf/fp32"))
    for cell in (tosa, ethos, vgf):
        assert cell.cell.backend.validated_here and not cell.cell.backend.host_runnable
        assert list(cell.spec("validate").outputs) == ["numerics.json"]  # a verdict here, no .bpte
        assert "benchmark" not in cell.stages()  # the reference model is no place to time a program
    assert list(ethos.spec("export").outputs) == [
        "program.pte",
        "export.json",
        "delegates.tosa.npz",
        "selected_operators.yaml",
    ]
    # VGF programs run on Arm's ML SDK scenario runner here, not probed for what is missing
    assert vgf.cell.backend.probe is None
    assert vgf.cell.backend.members[0].validated_by["runner"] == "etforge.builders.arm.vgf_run:vgf_program"


def test_the_validate_key_covers_the_runner_and_its_tools(project):
    cell = Cell(project, "a/arm_tosa/int8")
    before = key_of(cell.plan, STAGE["validate"], cell.cell, fresh=True)
    member = cell.cell.backend.members[0]
    # another tosa-tools (what runs the program here) is another verdict
    object.__setattr__(member, "runtime_tools", {"tosa-tools": "0.0.1"})
    assert key_of(cell.plan, STAGE["validate"], cell.cell, fresh=True) != before
    object.__setattr__(member, "validated_by", {**member.validated_by, "name": "another runner"})
    assert key_of(cell.plan, STAGE["validate"], cell.cell, fresh=True) != before


def test_the_outcome_says_where_the_numbers_come_from(project):
    tosa = _built(project, "a/arm_tosa/fp32")
    tosa.write(
        "validate", program_sha256=SHA, passed=True, inputs="random (seeded)", samples=1, sqnr_db=150.0, runner=RUNNER
    )
    o = tosa.outcome()
    assert o.status == CellState.PROVISIONAL
    assert o.reason.startswith(f"run on the {RUNNER}, not the ExecuTorch runtime; validated on seeded random inputs")
    shown = verdict(o, tosa.cell, layout_of(tosa.plan))
    assert shown["validated_by"] == f"run on the {RUNNER}, not the ExecuTorch runtime"
    assert shown["checked"] == "here" and shown["sqnr_db"] == 150.0


def test_an_ethos_u_verdict_names_its_proxy(project):
    ethos = _built(project, "a/ethos_u55/int8")
    proxy = "the TOSA-INT graph Vela compiled"
    ethos.write(
        "validate", program_sha256=SHA, passed=True, inputs="npz v.npz", sqnr_db=45.0, runner=RUNNER, proxy=proxy
    )
    o = ethos.outcome()
    assert o.status == CellState.OK
    assert o.reason == f"validated by proxy: {proxy}, run on the {RUNNER}"
    # a failed proxy verdict fails the cell like any other
    missed = {"sqnr_db": 3.0, "passed": False, "misses": ["output 0: SQNR 3.0 dB < 20 dB"], "runner": RUNNER}
    ethos.write("validate", "failed", reason="(the record's)", program_sha256=SHA, proxy=proxy, **missed)
    o = ethos.outcome()
    assert o.status == CellState.FAILED
    # the failed check's own reason, with where its numbers come from
    said = f"output 0: SQNR 3.0 dB < 20 dB; validated by proxy: {proxy}, run on the {RUNNER}"
    assert o.reason == f"validate:a/ethos_u55/int8: {said}"


def test_vela_summary_of_two_delegates_adds_up():
    row = {
        "accelerator_configuration": "Ethos_U55_128",
        "system_config": "Ethos_U55_High_End_Embedded",
        "memory_mode": "Shared_Sram",
        "core_clock": 500000000.0,
        "sram_memory_used": 1.453125,
        "off_chip_flash_memory_used": 2.359375,
        "on_chip_flash_memory_used": 0.0,
        "dram_memory_used": 0.0,
        "cycles_npu": 2137,
        "cycles_total": 3490,
        "inference_time": 6.98e-06,
    }
    fields = summary_fields([{**row, "npu_ops": 7, "cpu_ops": 0}, {**row, "npu_ops": 5, "cpu_ops": 1}])
    check = Vela.of(fields)  # every field a typed one of the Vela check
    assert (check.npu_ops, check.cpu_ops) == (12, 1)
    assert (check.sram_bytes, check.offchip_flash_bytes) == (2 * 1488, 2 * 2416)
    assert (check.cycles_npu, check.cycles_total) == (4274, 6980)
    assert check.inference_time_s == pytest.approx(2 * 6.98e-06)
    assert check.accelerator == "Ethos_U55_128" and len(check.delegates) == 2
    export = ExportResult(checks=(check,))
    assert ExportResult.from_json(export.to_json()) == export  # read back through the check table
    assert not check.failed  # an estimate: never a gate


def test_runner_note_is_empty_for_the_runtime():
    assert Numerics(passed=True).runner_note() == ""
    assert Numerics(runner="X").runner_note() == "run on the X, not the ExecuTorch runtime"
