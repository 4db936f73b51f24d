"""Cortex-M cells in the plan and in their outcome, from records, without torch: what the
cortex_m55 and cortex_m7 recipes and the int8/fp32 schemes' entries decide.

The end-to-end checks (the lowering, the proxy run, the programs' operators and budgets) are in
tests/test_cortex_m_cells.py.
"""

from __future__ import annotations

import hashlib
from types import SimpleNamespace

import pytest

from etforge.builders.cortex_m.dialect import foreign_operators, registered_operators
from etforge.core.errors import EtforgeError
from etforge.pipeline.keys import key_of
from etforge.pipeline.stages import STAGE
from etforge.publish.outcome import CellState
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
  cortex_m55: {}
  cortex_m7: {}
quantization: [fp32, int8]
"""
PROGRAM = b"the int8 program"
SHA = hashlib.sha256(PROGRAM).hexdigest()
RUNNER = "Cortex-M dialect interpreter"


@pytest.fixture
def project(tmp_path):
    return make_unit_project(tmp_path / "proj", PIPELINE, models=("a",))


def test_float_cells_are_refused_when_the_plan_is_built(project):
    plan = project.plan()
    refused = {r.name: r.reason for r in plan.rejected}
    assert set(refused) == {"a/cortex_m55/fp32", "a/cortex_m7/fp32"}
    assert refused["a/cortex_m55/fp32"].startswith("Cortex-M's CMSIS-NN kernels are int8: a float program holds no")
    assert {c.name for c in plan.cells} == {"a/cortex_m55/int8", "a/cortex_m7/int8"}


def test_int8_cells_are_validated_here_by_the_recipes_runner_and_share_one_quantized_graph(project):
    m55, m7 = Cell(project, "a/cortex_m55/int8"), Cell(project, "a/cortex_m7/int8")
    for cell in (m55, m7):
        backend = cell.cell.backend
        assert backend.validated_here and not backend.host_runnable and backend.delegates == ()
        assert backend.validated_by["runner"] == "etforge.builders.cortex_m.dialect:cortex_m_dialect"
        assert backend.min_coverage is None  # no delegate: no delegation gate
        # a verdict here, no .bpte, and no host timing of a program this host cannot run
        assert cell.stages() == ["capture", "quantize", "export", "validate"]
        assert list(cell.spec("validate").outputs) == ["numerics.json"]
    # the quantizer does not depend on the core: one quantize task for both
    assert m55.spec("quantize").name == m7.spec("quantize").name == "quantize:a/int8/cortex_m_int8"
    assert m55.spec("quantize").key == m7.spec("quantize").key
    assert "MVE kernels" in m55.cell.backend.validated_by["proxy"]
    assert "DSP kernels" in m7.cell.backend.validated_by["proxy"]


def test_the_core_and_its_kernel_family_join_the_export_key_not_the_quantize_key(project):
    cell = Cell(project, "a/cortex_m55/int8")
    export = key_of(cell.plan, STAGE["export"], cell.cell, fresh=True)
    quantize = key_of(cell.plan, STAGE["quantize"], cell.cell, fresh=True)
    project.edit_pipeline("  cortex_m55: {}", "  cortex_m55: {isa: DSP}")
    cell.reload()
    assert cell.cell.backend.primary.options == {"cpu": "cortex-m55", "isa": "DSP"}
    assert key_of(cell.plan, STAGE["export"], cell.cell, fresh=True) != export
    assert key_of(cell.plan, STAGE["quantize"], cell.cell, fresh=True) == quantize
    assert cell.cell.backend.primary.lowering == {"edge": "etforge.builders.cortex_m.lowering:lower_to_edge"}


def test_a_kernel_family_the_core_lacks_is_refused_in_one_line(project):
    project.edit_pipeline("  cortex_m7: {}", "  cortex_m7: {isa: MVE}")
    with pytest.raises(EtforgeError) as raised:
        project.plan()
    said = str(raised.value)
    assert "\n" not in said and "backends.cortex_m7.isa" in said and "DSP" in said, said


def _built(project, name: str) -> Cell:
    cell = Cell(project, name)
    cell.write("capture", inputs="random (seeded)", outputs=[{"path": "", "shape": [1, 1], "dtype": "float32"}])
    cell.write("quantize", method="pt2e", calibration="npz data/calib.npz")
    cell.write("export", sha256=SHA, size_bytes=len(PROGRAM), delegates=[])
    return cell


def test_the_outcome_names_the_proxy_and_a_missed_threshold_fails_the_cell(project):
    m55 = _built(project, "a/cortex_m55/int8")
    proxy = m55.cell.backend.validated_by["proxy"]
    m55.write("validate", program_sha256=SHA, passed=True, inputs="npz v.npz", sqnr_db=45.0, runner=RUNNER, proxy=proxy)
    o = m55.outcome()
    assert o.status == CellState.OK
    assert o.reason == f"validated by proxy: {proxy}, run on the {RUNNER}"
    missed = {"sqnr_db": 12.0, "passed": False, "misses": ["output 0: SQNR 12.0 dB < 20 dB"], "runner": RUNNER}
    m55.write("validate", "failed", reason="(the record's)", program_sha256=SHA, proxy=proxy, **missed)
    o = m55.outcome()
    assert o.status == CellState.FAILED
    assert (
        o.reason
        == f"validate:a/cortex_m55/int8: output 0: SQNR 12.0 dB < 20 dB; validated by proxy: {proxy}, run on the {RUNNER}"
    )


def _program(*plans) -> SimpleNamespace:
    def plan(ops, delegates=()):
        return SimpleNamespace(
            operators=[SimpleNamespace(name=n.rsplit(".", 1)[0], overload=n.rsplit(".", 1)[1]) for n in ops],
            delegates=[SimpleNamespace(id=d) for d in delegates],
        )

    return SimpleNamespace(execution_plan=[plan(*p) for p in plans])


def test_what_a_cortex_m_build_cannot_load_is_named():
    registered = registered_operators()  # read from the installed executorch's kernel YAMLs
    assert {
        "cortex_m::quantized_conv2d_nhwc.out",
        "aten::view_copy.out",
        "quantized_decomposed::quantize_per_tensor.out",
    } <= registered
    loadable = (
        [
            "cortex_m::quantized_linear.out",
            "aten::view_copy.out",
            "executorch_prim::et_view.default",
            "aten::sym_size.int",
        ],
    )
    assert foreign_operators(_program(loadable), registered) == []
    foreign = (["cortex_m::quantized_linear.out", "llama::custom_sdpa.out"], ["XnnpackBackend"])
    assert foreign_operators(_program(loadable, foreign), registered) == [
        "a XnnpackBackend delegate",
        "llama::custom_sdpa.out",
    ]
    # an overload the kernel library does not register counts too
    assert foreign_operators(_program((["cortex_m::quantized_linear.default"],)), registered) == [
        "cortex_m::quantized_linear.default"
    ]
