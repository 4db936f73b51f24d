"""A cell's outcome (etforge.publish.outcome.cell_outcome) from records, rule by rule.

The records are what the engine writes (etforge.cache.records.write_state) under each task's
current key (spec_of(plan, stage, cell).key), holding the stage results' JSON form; the
outcome is what the summary, report, manifests, release and exit status all show.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math

import pytest

from etforge.cache.records import write_state
from etforge.checks.delegation import Delegation
from etforge.checks.numerics import Numerics, OnDevice
from etforge.checks.size import SizeGate
from etforge.pipeline.layout import layout_of
from etforge.pipeline.results import TaskStatus
from etforge.pipeline.specs import cell_specs, spec_of
from etforge.pipeline.stage_results import (
    BenchmarkResult,
    CaptureResult,
    ExportResult,
    GateResult,
    QuantizeResult,
    Verdict,
)
from etforge.publish import summary
from etforge.publish.outcome import CellState, cell_outcome
from etforge.publish.outcome_views import verdict
from unit.support import HOST, make_unit_project

PIPELINE = """\
name: t
version: 0.0.1
models:
  a:
    python: models.a:build
    inputs: [{name: x, shape: [1, 4]}]
backends:
  xnnpack: {}
  vulkan: {}
quantization: [fp32, int8]
targets: false
matrix:
  exclude: [{backend: vulkan, quantization: int8}]
"""
EXPECTED = '  expected_failures: [{model: a, backend: xnnpack, quantization: int8, reason: "known bug", link: "https://x/1"}]\n'
RESULTS = {
    "capture": CaptureResult,
    "quantize": QuantizeResult,
    "export": ExportResult,
    "sizegate": GateResult,
    "validate": Verdict,
    "benchmark": BenchmarkResult,
}
PROGRAM = b"the int8 program"
SHA = hashlib.sha256(PROGRAM).hexdigest()
OTHER = hashlib.sha256(b"another program").hexdigest()
INT8 = "a/xnnpack/int8"  # capture, quantize, export, sizegate, validate, benchmark
ON_DEVICE = "a/vulkan/fp32"  # lowers here, cannot run here: capture, export, validate (a .bpte)


def result(stage: str, fields: dict):
    """A stage's result from ``fields``: its own, and the rest as the check its stage records."""
    kind = RESULTS[stage]
    own = {f.name for f in dataclasses.fields(kind)}
    mine = {k: v for k, v in fields.items() if k in own}
    rest = {k: v for k, v in fields.items() if k not in own}
    if rest:
        check = {"sizegate": SizeGate, "export": Delegation, "validate": Numerics}[stage]
        if stage == "validate" and "test_cases" in rest:
            check = OnDevice
        mine["checks"] = (check.of(rest),)
    return kind.of(mine)


def numerics(o) -> Numerics | None:
    return next((c for c in o.facts.checks if isinstance(c, Numerics)), None)


class Cell:
    """Writes a cell's records, as its tasks would, and reads its outcome."""

    def __init__(self, project, name: str):
        self.project, self.name = project, name
        self.plan = project.plan()
        self.cell = project.cell(self.plan, name)

    def reload(self):
        """Resolve pipeline.yaml again (after an edit): the records stay, the keys may not."""
        self.plan = self.project.plan()
        self.cell = self.project.cell(self.plan, self.name)
        return self

    def stages(self) -> list:
        return [s.name.split(":")[0] for s in cell_specs(self.plan, self.cell, HOST)]

    def spec(self, stage: str):
        return spec_of(self.plan, stage, self.cell, HOST)

    def write(self, stage: str, status="ok", *, reason="", key=None, info=None, **fields):
        spec = self.spec(stage)
        if info is None:
            info = result(stage, fields).to_json()
        write_state(spec, TaskStatus(status), key=key, info=info, reason=reason, log=spec.log_file)
        return spec

    def built(self):
        """Every task up to the export succeeded, on PROGRAM."""
        self.write("capture", inputs="random (seeded)", outputs=[{"path": "0", "shape": [1, 1], "dtype": "float32"}])
        if "quantize" in self.stages():
            self.write("quantize", method="pt2e", calibration="random (seeded)")
        self.write("export", sha256=SHA, size_bytes=len(PROGRAM), lowering_s=0.5, delegates=["XnnpackBackend"])
        if "sizegate" in self.stages():
            self.write("sizegate", size_vs_fp32=0.3)
        return self

    def validated(self, inputs="npz data/val.npz", **fields):
        fields = {"program_sha256": SHA, "passed": True, "inputs": inputs, "samples": 4, "sqnr_db": 41.5, **fields}
        self.write("validate", **fields)
        return self

    def outcome(self):
        return cell_outcome(self.plan, self.cell, HOST)


@pytest.fixture
def project(tmp_path):
    return make_unit_project(tmp_path / "proj", PIPELINE, models=("a",))


@pytest.fixture
def int8(project) -> Cell:
    return Cell(project, INT8)


def test_the_cells_have_the_tasks_these_tests_write(project):
    assert Cell(project, INT8).stages() == ["capture", "quantize", "export", "sizegate", "validate", "benchmark"]
    assert Cell(project, ON_DEVICE).stages() == ["capture", "export", "validate"]


# ---------------------------------------------------------------- the state machine, rule by rule


@pytest.mark.parametrize("stage", ["capture", "quantize", "export", "sizegate", "validate", "benchmark"])
def test_a_failed_record_fails_the_cell_with_its_reason_and_log(int8, stage):
    int8.built().validated()
    int8.write("benchmark", program_sha256=SHA, latency_p50_ms=1.0)
    judged = {"program_sha256": SHA} if stage in ("validate", "benchmark") else {}  # (a verdict on this program)
    spec = int8.write(stage, "failed", reason="it broke\non two lines", **judged)
    o = int8.outcome()
    assert (o.status, o.task, o.log) == (CellState.FAILED, spec.name, str(spec.log_file))
    assert o.reason == f"{spec.name}: it broke on two lines"
    assert o.fails_run and not o.ships


def test_the_first_failure_in_pipeline_order_is_the_one_shown(int8):
    int8.write("validate", "failed", reason="sqnr too low", program_sha256=SHA)
    int8.write("export", "failed", reason="lowering broke")
    int8.write("capture", "failed", reason="the factory raised")
    o = int8.outcome()
    assert (o.status, o.task, o.reason) == (CellState.FAILED, "capture:a", "capture:a: the factory raised")


def test_a_failure_wins_over_a_rejection(int8):
    int8.write("quantize", "rejected", reason="int8 takes none of its layers")
    int8.write("sizegate", "failed", reason="saved too little")
    assert int8.outcome().status == CellState.FAILED


def test_a_rejected_scheme_says_why(int8):
    int8.write("capture")
    int8.write("quantize", "rejected", reason="int8 takes none of its layers")
    int8.write("export", "rejected", reason="quantize:a/int8/xnnpack_int8_static rejected")
    o = int8.outcome()
    assert (o.status, o.reason, o.task) == (
        CellState.REJECTED,
        "int8 takes none of its layers",
        int8.spec("quantize").name,
    )
    assert not o.fails_run and not o.ships


def test_an_export_this_host_cannot_lower_is_skipped_with_what_is_missing(int8):
    int8.write("capture")
    int8.write("export", "skipped", reason="cannot lower here: qnn: missing $QNN_SDK_ROOT")
    int8.write("validate", "skipped", reason="not built on this host")
    o = int8.outcome()
    assert (o.status, o.reason, o.task) == (
        CellState.SKIPPED,
        "cannot lower here: qnn: missing $QNN_SDK_ROOT",
        "export:a/xnnpack/int8",
    )
    assert not o.fails_run and not o.ships


def test_a_blocked_task_blocks_the_cell(int8):
    int8.built()
    int8.write("validate", "blocked", reason="export:a/xnnpack/int8 failed")
    o = int8.outcome()
    assert (o.status, o.task) == (CellState.BLOCKED, "validate:a/xnnpack/int8")
    assert o.reason == "validate:a/xnnpack/int8: export:a/xnnpack/int8 failed"


@pytest.mark.parametrize("written", [(), ("capture",), ("capture", "quantize")])
def test_a_cell_without_a_current_export_is_not_built(int8, written):
    for stage in written:
        int8.write(stage)
    o = int8.outcome()
    assert (o.status, o.reason) == (CellState.NOT_BUILT, "run `etforge export:a/xnnpack/int8`")
    assert not o.ships and not o.fails_run


def test_a_skipped_validation_skips_the_cell(int8):
    int8.built()
    int8.write("validate", "skipped", reason="the runtime cannot load it here")
    o = int8.outcome()
    assert (o.status, o.reason, o.task) == (
        CellState.SKIPPED,
        "the runtime cannot load it here",
        "validate:a/xnnpack/int8",
    )


def test_an_exported_cell_without_a_verdict_is_not_validated(int8):
    int8.built()
    o = int8.outcome()
    assert (o.status, o.reason) == (CellState.NOT_VALIDATED, "run `etforge validate:a/xnnpack/int8`")
    assert o.facts.program.sha256 == SHA and o.facts.program.size_bytes == len(PROGRAM)  # what was built is shown
    assert not o.ships


@pytest.mark.parametrize("judged", [OTHER, None], ids=["other bytes", "no program named"])
def test_a_verdict_on_other_bytes_is_not_a_verdict_on_this_program(int8, judged):
    int8.built().validated(program_sha256=judged)
    o = int8.outcome()
    assert o.status == CellState.NOT_VALIDATED and not o.ships
    shown = judged[:12] if judged else "not recorded"
    assert o.reason == f"the verdict on record judged another program (sha256 {shown}, this one is {SHA[:12]})"
    assert numerics(o) is None  # its numbers are not shown either


def test_a_failed_verdict_on_other_bytes_does_not_fail_this_program(int8):
    int8.built()
    missed = {"sqnr_db": 3.0, "passed": False, "misses": ["sqnr 3 < 20"]}
    int8.write("validate", "failed", reason="sqnr 3 < 20", program_sha256=OTHER, **missed)
    assert int8.outcome().status == CellState.NOT_VALIDATED
    int8.write("validate", "failed", reason="sqnr 3 < 20", program_sha256=SHA, **missed)
    o = int8.outcome()
    assert (o.status, o.reason) == (CellState.FAILED, "validate:a/xnnpack/int8: sqnr 3 < 20")  # the check's reason


def test_a_cell_checked_on_the_device_is_on_device_with_its_bundle_and_tolerances(project):
    cell = Cell(project, ON_DEVICE).built()
    cell.write(
        "validate",
        "not-runnable",
        reason="vulkan cannot run here: check on device with the .bpte",
        program_sha256=SHA,
        test_cases=2,
        rtol=0.01,
        atol=0.001,
    )
    o = cell.outcome()
    assert o.status == CellState.ON_DEVICE and o.ships and not o.fails_run
    assert o.reason.startswith("vulkan cannot run here: check on device with the .bpte")
    shown = verdict(o, cell.cell, layout_of(cell.plan))
    assert (shown["checked"], shown["rtol"], shown["atol"], shown["samples"]) == ("on device", 0.01, 0.001, 2)
    assert shown["bundle"] == "a_vulkan_fp32.bpte"


def test_a_verdict_on_random_inputs_is_provisional_and_says_so(int8):
    int8.built().validated(inputs="random (seeded)")
    o = int8.outcome()
    assert o.status == CellState.PROVISIONAL and o.ships and not o.fails_run
    assert o.reason.startswith("validated on seeded random inputs only (name data under models.a.validation")
    assert "random calibration data" in o.reason  # its quantize record says so too


def test_a_verdict_on_the_models_data_is_ok_with_its_numbers(int8):
    int8.built().validated(inputs="npz data/val.npz", cosine=0.999)
    o = int8.outcome()
    assert o.status == CellState.OK and o.ships and not o.fails_run
    check = numerics(o)
    assert (check.inputs, check.samples, check.sqnr_db, check.cosine) == ("npz data/val.npz", 4, 41.5, 0.999)
    row = summary.outcome_row(o)
    assert (row["status"], row["checks"]["SQNR dB"]) == ("ok", "41.5")
    assert check.detail().startswith("validated on npz data/val.npz (4 samples)")


def test_a_benchmark_is_shown_only_for_the_program_it_timed(int8):
    int8.built().validated()
    int8.write("benchmark", program_sha256=OTHER, latency_p50_ms=9.0)
    assert int8.outcome().facts.latency_p50_ms is None
    int8.write("benchmark", program_sha256=SHA, latency_p50_ms=2.5)
    o = int8.outcome()
    assert o.facts.latency_p50_ms == 2.5 and summary.outcome_row(o)["p50_ms"] == "2.500"
    assert cell_outcome(int8.plan, int8.cell).facts.benchmark is None  # no host: benchmarks are not read


# ---------------------------------------------------------------- expected failures (pytest's strict xfail)

NATURAL = {
    "failed": (lambda c: c.built().write("validate", "failed", reason="sqnr", program_sha256=SHA), "expected-failure"),
    "provisional": (lambda c: c.built().validated(inputs="random (seeded)"), "unexpectedly-passing"),
    "ok": (lambda c: c.built().validated(), "unexpectedly-passing"),
    "not built": (lambda c: None, "not built"),
    "not validated": (lambda c: c.built(), "not validated"),
}


@pytest.mark.parametrize("natural", NATURAL)
def test_an_expected_failure_entry_turns_failure_into_expected_and_success_into_a_run_failure(project, int8, natural):
    write, expected = NATURAL[natural]
    write(int8)
    assert int8.outcome().status == natural
    project.write_pipeline(PIPELINE + EXPECTED)  # changes no key: the records stay current
    o = int8.reload().outcome()
    assert o.status == expected
    assert o.expected is not None and o.expected.link == "https://x/1"
    assert o.fails_run is (expected == "unexpectedly-passing")
    assert not o.ships
    if expected == "expected-failure":
        assert o.reason.startswith("expected to fail: known bug (https://x/1); validate:a/xnnpack/int8: sqnr")
    if expected == "unexpectedly-passing":
        assert "remove that entry" in o.reason


def test_an_expected_failure_checked_on_the_device_is_not_shipped(project):
    cell = Cell(project, ON_DEVICE).built()
    cell.write("validate", "not-runnable", reason="bundled", program_sha256=SHA, test_cases=1)
    project.write_pipeline(PIPELINE + EXPECTED.replace("backend: xnnpack, quantization: int8", "backend: vulkan"))
    o = cell.reload().outcome()
    assert o.status == CellState.EXPECTED_FAILURE and not o.ships and not o.fails_run
    assert o.reason == "expected to fail: known bug (https://x/1); not checked on this host"


# ---------------------------------------------------------------- only current records count


def test_a_verdict_made_before_a_threshold_changed_no_longer_counts(project, int8):
    int8.built().validated()
    fp32 = Cell(project, "a/xnnpack/fp32").built().validated()
    assert int8.outcome().status == fp32.outcome().status == CellState.OK
    project.write_pipeline(PIPELINE + "thresholds:\n  int8: {sqnr_db: 45}\n")
    assert int8.reload().outcome().status == CellState.NOT_VALIDATED  # 41.5 dB was judged against 20
    assert fp32.reload().outcome().status == CellState.OK


@pytest.mark.parametrize("status", ["failed", "ok"])
def test_a_record_under_a_stale_key_never_counts(int8, status):
    int8.write("capture")
    int8.write("export", status, key="0" * 64, reason="an old failure", sha256=SHA)
    o = int8.outcome()
    assert o.status == CellState.NOT_BUILT and o.facts.program is None


def test_a_hand_edited_record_with_another_key_never_counts(int8):
    int8.built().validated()
    spec = int8.spec("validate")
    record = json.loads(spec.state_file.read_text())
    record["key"] = record["key"][::-1]
    spec.state_file.write_text(json.dumps(record))
    assert int8.outcome().status == CellState.NOT_VALIDATED


# ---------------------------------------------------------------- numbers: never a NaN, never a string


def _verdict_info(**numerics) -> dict:
    """A verdict's JSON form with one Numerics check whose fields are ``numerics`` as written (a
    hand-edited record may hold anything)."""
    check = Numerics(passed=True, inputs="npz data/val.npz").to_json()
    return {**Verdict(program_sha256=SHA).to_json(), "checks": [{**check, **numerics}]}


@pytest.mark.parametrize("sqnr", [math.nan, math.inf, -math.inf], ids=["nan", "inf", "-inf"])
def test_a_non_finite_sqnr_is_never_shown_as_a_number(int8, sqnr):
    int8.built()
    int8.write("validate", info=_verdict_info(max_abs_error=0.5, sqnr_db=sqnr))
    o = int8.outcome()
    assert numerics(o).sqnr_db is None and numerics(o).exact is False
    row = summary.outcome_row(o)
    assert row["checks"]["SQNR dB"] == "-"
    shown = verdict(o, int8.cell, layout_of(int8.plan))
    assert shown["sqnr_db"] is None and shown["exact"] is False
    json.dumps(summary.table(int8.plan, [o]), allow_nan=False)  # summary.json stays strict JSON


@pytest.mark.parametrize("value", ["41.5", True, [41.5], {"db": 41.5}], ids=["string", "bool", "list", "object"])
def test_a_hand_edited_non_numeric_sqnr_is_ignored(int8, value):
    int8.built()
    int8.write("validate", info=_verdict_info(cosine=0.99, sqnr_db=value))
    o = int8.outcome()
    assert o.status == CellState.OK
    assert (numerics(o).sqnr_db, numerics(o).cosine) == (None, 0.99)
    assert summary.outcome_row(o)["checks"]["SQNR dB"] == "-"
    assert Numerics.from_json({"sqnr_db": value}).sqnr_db is None


def test_identical_outputs_are_shown_as_exact(int8):
    int8.built()
    int8.write("validate", info=_verdict_info(max_abs_error=0.0))  # no sqnr_db: infinite
    o = int8.outcome()
    assert numerics(o).exact is True and summary.outcome_row(o)["checks"]["SQNR dB"] == "exact"
    shown = verdict(o, int8.cell, layout_of(int8.plan))
    assert shown["exact"] is True and shown["sqnr_db"] is None
