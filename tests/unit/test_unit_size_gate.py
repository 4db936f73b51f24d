"""The size gate judges what the scheme took; a failed fp32 sibling never hides a quantized cell's verdict."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from etforge.builders.gates.gates import size_gate
from etforge.pipeline.stage_results import ExportResult
from etforge.publish.outcome import CellState
from unit.support import HOST, make_unit_project
from unit.test_unit_outcome import INT8, PIPELINE, SHA, Cell, numerics


def _cell():
    return SimpleNamespace(
        size_gate={"weights": ["linear"], "max_ratio": 0.3, "overhead_bytes": 0},
        quant=SimpleNamespace(name="8da4w"),
        model=SimpleNamespace(name="vit"),
    )


def test_the_size_gate_judges_only_the_weights_the_scheme_took_and_lists_those_kept_in_float():
    # A model with 100 KB of linear weights of which the scheme took 60 KB (4 layers were kept in float):
    # the program saves 45 KB, 0.25x of what it took but 0.55x of every linear weight.
    fp32, quantized = ExportResult(size_bytes=120_000, sha256="f"), ExportResult(size_bytes=75_000, sha256="q")
    weights = {"all": 110_000, "linear": 100_000}
    kept = [
        {"layer": f"blocks.{i}.mlp", "reason": "in_features 80 is not a multiple of the group size 32"}
        for i in range(4)
    ]
    check = size_gate(_cell(), quantized, fp32, weights)
    assert check.failed and "stored at 0.55x of fp32" in check.reason()  # judged against every linear weight
    layers = {"taken_weight_bytes": {"linear": 60_000}, "kept_float": kept}
    check = size_gate(_cell(), quantized, fp32, weights, layers)
    assert not check.failed and check.passed, check.reason()
    assert (check.weight_bytes, check.weight_ratio) == (60_000, 0.25)
    assert [e["layer"] for e in check.kept_float] == [f"blocks.{i}.mlp" for i in range(4)]
    # and a miss says which weights it judged and lists the float layers it did not
    check = size_gate(_cell(), ExportResult(size_bytes=110_000, sha256="q"), fp32, weights, layers)
    failure = check.reason()
    assert failure.startswith("the linear weights 8da4w took stored at 0.83x of fp32"), failure
    assert "kept in float (not judged): blocks.0.mlp (in_features 80 is not a multiple" in failure
    assert "and 1 more" in failure


@pytest.fixture
def int8(tmp_path) -> Cell:
    return Cell(make_unit_project(tmp_path / "proj", PIPELINE, models=("a",)), INT8)


def _fp32_export(int8: Cell, status: str):
    from etforge.cache.records import write_state
    from etforge.pipeline.results import TaskStatus
    from etforge.pipeline.specs import spec_of

    sibling = int8.plan.fp32_sibling(int8.cell)
    spec = spec_of(int8.plan, "export", sibling, HOST)
    write_state(spec, TaskStatus(status), info={}, reason="backend 'xnnpack' runs 40% of the program's compute")
    return spec


def test_a_failed_fp32_sibling_never_hides_the_quantized_cells_own_verdict(int8):
    int8.built()
    sibling = _fp32_export(int8, "failed")
    int8.write("sizegate", "blocked", reason=f"{sibling.name} failed")
    int8.validated(sqnr_db=32.7)
    o = int8.outcome()
    assert o.status == CellState.OK, o
    assert f"size gate: nothing to compare against ({sibling.name} failed); judged on its numerics" in o.reason
    assert numerics(o).sqnr_db == 32.7
    # judged on its numerics: a verdict that missed fails the cell as usual
    int8.write("validate", "failed", reason="sqnr 3.1 dB < 15", program_sha256=SHA)
    assert int8.outcome().status == CellState.FAILED


def test_a_size_gate_blocked_by_the_cells_own_export_still_blocks(int8):
    int8.write("capture")
    int8.write("quantize", method="torchao")
    int8.write("export", "failed", reason="lowering broke")
    int8.write("sizegate", "blocked", reason="export:a/xnnpack/int8 failed")
    assert int8.outcome().status == CellState.FAILED
    # and while the fp32 sibling is fine, a blocked size gate is not explained away
    int8.built()
    _fp32_export(int8, "ok")
    int8.write("sizegate", "blocked", reason="something else")
    int8.validated()
    assert int8.outcome().status == CellState.BLOCKED
