"""A cell's outcome: the one decision that the summary, report, manifests, C++ header,
release and the run's exit status all read (none of them re-derives it).

    cell_outcome(plan, cell, host=None, read=current) -> CellOutcome
    outcomes(plan, cells=None, host=None) -> [CellOutcome], in plan order
    rejected_outcome(rejected) -> CellOutcome of a combination refused at plan time
    failing(outcomes) -> the outcomes that fail the run
    listing_reason(outcome, layout) -> one line on why a cell is not shipped

Inputs are the state records of the cell's tasks (capture, quantize, export, size
gate, validate, benchmark) whose key is the task's CURRENT key. A record with any
other key (made before a threshold changed, hand-edited, left by another
revision) does not exist here: the cell is then "not built" or "not validated",
never shown with a stale verdict. A verdict (validate, or the benchmark) counts
only for the program it judged (etforge.pipeline.stage_results Judgement.judges: its
``program_sha256`` is the export's current sha256; one that names none counts for nothing). ``host`` (etforge.config.machine.host_fingerprint()) selects the
benchmark record; without it benchmarks are not read.

The state machine, first rule that applies:

    failed         a current record of capture, quantize, export, size gate, validate or
                   benchmark says failed (the first in that order): its reason and log
    rejected       a current record says rejected: the scheme cannot apply to this model
                   (e.g. a weight-group scheme that takes none of its layers), with why
    skipped        export skipped: this host cannot lower the backend (says what is missing)
    blocked        a current record says blocked (a task it needs did not succeed); not the
                   size gate when only its fp32 sibling's export failed: the size gate has
                   nothing to compare against (a note says so) and the cell is judged on its numerics
    not built      no current export record
    failed         over a budget (gates.max_program_bytes / max_planned_bytes): both numbers
    skipped        validation skipped
    not validated  exported, but no current verdict on this program
    on-device      this host cannot run it: its .bpte carries the validation inputs, eager
                   outputs and tolerances; the device checks itself
    provisional    validated here, on seeded random inputs only
    ok             validated here on the model's ``validation`` data

then, for a cell that ``matrix.expected_failures`` names (pytest's strict xfail):

    failed                  -> expected-failure       listed with reason and link
    on-device               -> expected-failure       not checked here, so not shipped either
    ok, provisional         -> unexpectedly-passing   fails the run until the entry is removed
    any other state stays as it is (nothing was judged yet)

and ``rejected`` for combinations the recipes refuse at plan time.

Ships (manifests, C++ header, release): ok, provisional, on-device.
Fails the run: failed, unexpectedly-passing.

A run decides each cell once (etforge.publish.outcome_memo RunOutcomes, which hands
``read`` in to see which record files a decision read).

This module must not import torch or executorch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

from etforge.cache.records import current
from etforge.config.model import Cell, ExpectedFailure, Plan, RejectedCell, default_range_note
from etforge.pipeline.layout import layout_of
from etforge.pipeline.results import TaskStatus, task_status
from etforge.pipeline.specs import TaskSpec, cell_specs, spec_of
from etforge.pipeline.stage_results import (
    BenchmarkResult,
    CaptureResult,
    ExportResult,
    Judgement,
    QuantizeResult,
    SizeGateResult,
    Verdict,
)
from etforge.pipeline.stages import STAGE, task_name
from etforge.publish.baseline import fastest_of
from etforge.publish.budget_gate import over_budget
from etforge.publish.quant_notes import finite, layers_note, rescue_note


class CellState(StrEnum):
    """A cell's outcome, in the order tables list their counts."""

    OK = "ok"
    PROVISIONAL = "provisional"
    ON_DEVICE = "on-device"
    FAILED = "failed"
    UNEXPECTEDLY_PASSING = "unexpectedly-passing"
    EXPECTED_FAILURE = "expected-failure"
    SKIPPED = "skipped"
    BLOCKED = "blocked"
    NOT_BUILT = "not built"
    NOT_VALIDATED = "not validated"
    REJECTED = "rejected"


SHIPS = frozenset({CellState.OK, CellState.PROVISIONAL, CellState.ON_DEVICE})
FAILS_RUN = frozenset({CellState.FAILED, CellState.UNEXPECTEDLY_PASSING})
PENDING = frozenset({CellState.BLOCKED, CellState.NOT_BUILT, CellState.NOT_VALIDATED})  # no current verdict yet
STATUSES = tuple(CellState)  # every state, in the order tables list their counts
METRICS = ("sqnr_db", "cosine", "max_abs_error", "top1_agreement", "top5_agreement")
TOLERANCES = ("rtol", "atol", "tolerance_rule", "test_cases", "not_checked_on_device")


@dataclass(frozen=True)
class Evidence:
    """What the cell's current records say about its program (None: not known). Read-only."""

    program: Path | None = None  # the .pte in the working tree
    size_bytes: int | None = None
    sha256: str | None = None  # of the .pte, as its export recorded it
    lowering_s: float | None = None
    delegates: tuple = ()
    executorch_version: str | None = None
    data_file: Path | None = None  # external weights: the .ptd beside the .pte in the working tree
    data_sha256: str | None = None  # of that .ptd, as its export recorded it (the program names it too)
    data_size: int | None = None
    input_dtypes: tuple = ()  # as the program takes them (an fp16 program takes float16)
    # what the program costs (its export record; etforge.builders.lowering.program_costs)
    size_breakdown: dict = field(default_factory=dict)
    planned_bytes: dict = field(default_factory=dict)
    planned_note: str | None = None
    delegate_subgraphs: dict = field(default_factory=dict)
    schema_version: int | None = None
    outputs: tuple = ()  # the capture's eager outputs: {"path", "shape", "dtype"} each
    method_outputs: dict = field(default_factory=dict)  # several methods: method -> its outputs, likewise
    delegated_ops: int | None = None
    non_delegated_ops: int | None = None
    compute_coverage: float | None = None  # share of the program's FLOPs the delegates run (the gate's)
    op_coverage: float | None = None  # share of its compute ops delegated (information)
    compute_ops: int | None = None
    delegated_compute_ops: int | None = None
    size_vs_fp32: float | None = None
    calibration: str | None = None  # where static quantization's calibration data came from
    layers: dict | None = None  # the quantize record's: layers quantized and kept in float (layer_filter.py)
    rescue: dict | None = None  # the quantize record's keep_float: auto (etforge.builders.quantization.rescue)
    metrics: dict = field(default_factory=dict)  # of METRICS, finite numbers only
    exact: bool = False  # validated here and identical to eager (infinite SQNR)
    validated_on: str | None = None  # the inputs the verdict was measured on, e.g. "npz data/val.npz"
    samples: int | None = None
    validated_by: str | None = None  # run here but not in the ExecuTorch runtime: on what (Verdict.runner_note)
    bundle: Path | None = None  # on-device: the .bpte
    bundle_sha256: str | None = None
    tolerances: dict = field(default_factory=dict)  # on-device: of TOLERANCES
    benchmark: BenchmarkResult | None = None  # benchmarked here, under its current key, on this program
    llm_metadata: dict | None = None  # an LLM program's runner metadata methods -> values (its export record)
    export: ExportResult | None = None  # the export's whole result (sizes, delegation, structure)

    @property
    def latency_p50_ms(self) -> float | None:
        return self.benchmark.latency_p50_ms if self.benchmark else None

    @property
    def latency_fastest_ms(self) -> float | None:
        """The fastest timed run (the p50 where a record has no minimum): what ranks variants, read
        as the report reads it (baseline.fastest_of)."""
        if not self.benchmark:
            return None
        b = self.benchmark
        return fastest_of({"latency_min_ms": b.latency_min_ms, "latency_p50_ms": b.latency_p50_ms})

    @property
    def coverage(self) -> float | None:
        """Fraction of the graph's ops the backend took, or None."""
        d, n = self.delegated_ops, self.non_delegated_ops
        return d / (d + n) if d is not None and n is not None and d + n > 0 else None


@dataclass(frozen=True)
class CellOutcome:
    cell: str  # model/backend/quantization
    status: CellState
    reason: str  # one line ("" when there is nothing to add)
    log: str | None = None  # the log of the task that decided a failure
    task: str | None = None  # the task whose record decided a failure, skip or block
    evidence: Evidence = field(default_factory=Evidence)
    expected: ExpectedFailure | None = None  # the matrix.expected_failures entry naming the cell

    @property
    def ships(self) -> bool:
        return self.status in SHIPS

    @property
    def fails_run(self) -> bool:
        return self.status in FAILS_RUN


def failing(outcomes) -> list:
    """The outcomes that make the run fail (a non-zero exit), in the order given."""
    return [o for o in outcomes if o.fails_run]


def outcomes(plan: Plan, cells=None, host: dict | None = None) -> list:
    """The outcome of each of ``cells`` (default: every cell of the plan), in that order."""
    return [cell_outcome(plan, c, host) for c in (plan.cells if cells is None else cells)]


def rejected_outcome(rejected: RejectedCell) -> CellOutcome:
    return CellOutcome(cell=rejected.name, status=CellState.REJECTED, reason=rejected.reason)


# ---------------------------------------------------------------- reading records


def _info(record: dict | None) -> dict:
    info = (record or {}).get("info")
    return info if isinstance(info, dict) else {}


def _status(record: dict | None) -> TaskStatus | None:
    return task_status((record or {}).get("status"))


Read = Callable[[TaskSpec], "dict | None"]  # a task's current record or None (cache.records current)


def _records(plan: Plan, cell: Cell, host: dict | None, read: Read) -> list:
    """(task name, current record or None, spec) of the cell's tasks, in pipeline order."""
    return [(s.name, read(s), s) for s in cell_specs(plan, cell, host)]


def _evidence(plan: Plan, cell: Cell, by_kind: dict, export: ExportResult | None) -> Evidence:
    layout = layout_of(plan)
    facts: dict = {}
    if export is not None:
        facts.update(
            program=layout.pte_path(cell),
            size_bytes=export.size_bytes,
            sha256=export.sha256,
            lowering_s=export.lowering_s,
            delegates=export.delegates or tuple(cell.backend.delegates),
            executorch_version=export.executorch_version,
            data_file=layout.ptd_path(cell) if export.data_sha256 else None,
            data_sha256=export.data_sha256,
            data_size=export.data_size_bytes,
            input_dtypes=export.input_dtypes,
            size_breakdown=export.size_breakdown,
            planned_bytes=export.planned_bytes,
            planned_note=export.planned_note,
            delegate_subgraphs=export.delegate_subgraphs,
            schema_version=export.schema_version,
            delegated_ops=export.delegated_ops,
            non_delegated_ops=export.non_delegated_ops,
            compute_coverage=finite(export.compute_coverage),
            op_coverage=finite(export.delegation_coverage),
            compute_ops=export.compute_ops,
            delegated_compute_ops=export.delegated_compute_ops,
            llm_metadata=export.llm_metadata or None,
            export=export,
        )
    if _status(by_kind.get("capture")) == TaskStatus.OK:
        capture = CaptureResult.from_json(_info(by_kind["capture"]))
        facts["outputs"] = tuple(o for o in capture.outputs if isinstance(o, dict))
        facts["method_outputs"] = {
            m: list(v.get("outputs") or []) for m, v in capture.methods.items() if isinstance(v, dict)
        }
    if by_kind.get("sizegate"):
        facts["size_vs_fp32"] = SizeGateResult.from_json(_info(by_kind["sizegate"])).size_vs_fp32
    quantize = QuantizeResult.from_json(_info(by_kind.get("quantize")))
    facts.update(calibration=quantize.calibration, layers=quantize.layers or None, rescue=quantize.rescue or None)
    sha256 = export.sha256 if export is not None else None
    validate = by_kind.get("validate")
    judged = _status(validate) in (TaskStatus.OK, TaskStatus.FAILED, TaskStatus.NOT_RUNNABLE)
    verdict = Verdict.from_json(_info(validate))
    if judged and verdict.judges(sha256):
        facts.update(validated_on=verdict.inputs, samples=verdict.samples)
        if _status(validate) == TaskStatus.NOT_RUNNABLE:
            facts.update(
                samples=verdict.test_cases,
                bundle=layout.bundled_path(cell),
                bundle_sha256=(((validate or {}).get("outputs") or {}).get("program.bpte") or {}).get("sha256"),
                tolerances={k: getattr(verdict, k) for k in TOLERANCES if getattr(verdict, k) not in (None, ())},
            )
        else:
            facts["metrics"] = {k: getattr(verdict, k) for k in METRICS if getattr(verdict, k) is not None}
            facts["validated_by"] = verdict.runner_note() or None
            # identical to eager: no SQNR (infinite), no error; a NaN SQNR is a number in the record
            facts["exact"] = _info(validate).get("sqnr_db") is None and verdict.max_abs_error == 0
    bench = by_kind.get("benchmark")
    if _status(bench) == TaskStatus.OK:
        benchmark = BenchmarkResult.from_json(_info(bench))
        if benchmark.judges(sha256):
            facts["benchmark"] = benchmark
    return Evidence(**facts)


def cell_outcome(plan: Plan, cell: Cell, host: dict | None = None, read: Read = current) -> CellOutcome:
    """The outcome of ``cell`` from its current records (see the module docstring), each read
    with ``read`` (and nothing else read)."""
    records = _records(plan, cell, host, read)
    by_kind = {name.split(":", 1)[0]: record for name, record, _ in records}
    exported = _status(by_kind["export"]) == TaskStatus.OK
    export = ExportResult.from_json(_info(by_kind["export"])) if exported else None
    evidence = _evidence(plan, cell, by_kind, export)
    natural = _natural(plan, cell, records, by_kind, export, evidence, read)
    return _with_expectation(plan.expected_failure(cell), natural)


def _natural(
    plan: Plan, cell: Cell, records: list, by_kind: dict, export, evidence: Evidence, read: Read
) -> CellOutcome:
    """The outcome before ``matrix.expected_failures`` is applied."""

    def out(status, reason="", **kw):
        return CellOutcome(cell=cell.name, status=status, reason=" ".join(str(reason).split()), evidence=evidence, **kw)

    sha256 = export.sha256 if export is not None else None
    moot = _size_gate_moot(plan, cell, by_kind, read)
    if moot:  # a failed fp32 sibling never hides this cell's own verdict: judged on its numerics
        records = [r for r in records if not r[0].startswith(STAGE["sizegate"].name + ":")]
    for name, record, _ in records:
        # A failure under the current key counts, unless it names other bytes than this program
        # (one that names none, e.g. a crash before it could, still counts: failing is the safe side).
        if _status(record) != TaskStatus.FAILED:
            continue  # (parsed only when it failed: a no-op run reads every cell's records)
        judged = Judgement.from_json(_info(record)).program_sha256
        if judged in (None, sha256):
            reason = f"{name}: {record.get('reason') or 'failed'}"
            return out(CellState.FAILED, reason, log=record.get("log"), task=name)
    for name, record, _ in records:
        if _status(record) == TaskStatus.REJECTED:
            return out(CellState.REJECTED, record.get("reason", ""), task=name)
    if _status(by_kind["export"]) == TaskStatus.SKIPPED:
        return out(CellState.SKIPPED, by_kind["export"].get("reason", ""), task=task_name(STAGE["export"], cell))
    for name, record, _ in records:
        if _status(record) == TaskStatus.BLOCKED:
            return out(CellState.BLOCKED, f"{name}: {record.get('reason', '')}", task=name)
    if export is None:
        return out(CellState.NOT_BUILT, f"run `etforge {task_name(STAGE['export'], cell)}`")
    budget = over_budget(plan, cell, export)
    if budget:  # decided here, not by a task: a budget changes no program (no log to name)
        return out(CellState.FAILED, budget)
    validate = by_kind["validate"]
    if _status(validate) == TaskStatus.SKIPPED:
        return out(CellState.SKIPPED, validate.get("reason", ""), task=task_name(STAGE["validate"], cell))
    if _status(validate) not in (TaskStatus.OK, TaskStatus.NOT_RUNNABLE):
        return out(CellState.NOT_VALIDATED, f"run `etforge {task_name(STAGE['validate'], cell)}`")
    verdict = Verdict.from_json(_info(validate))
    if not verdict.judges(sha256):
        judged = verdict.program_sha256
        return out(
            CellState.NOT_VALIDATED,
            f"the verdict on record judged another program "
            f"(sha256 {judged[:12] if judged else 'not recorded'}, "
            f"this one is {str(sha256)[:12]})",
        )
    notes = [
        n for n in (rescue_note(evidence.rescue or {}), layers_note(cell.quant.name, evidence.layers or {}), moot) if n
    ]
    if str(evidence.calibration or "").startswith("random"):
        notes.append("random calibration data (name some in pipeline.yaml)")
    range_note = default_range_note(cell.model)
    if range_note and (cell.model.validation is None or (cell.quant.calibrated and cell.model.calibration is None)):
        notes.append(range_note)
    hf_source = cell.model.source.get("transformers")
    if hf_source and not hf_source.get("checkpoint"):  # built from its config: numerics, not quality
        notes.append("random weights (transformers config, no checkpoint)")
    if export.note:  # what lowering noticed (an LLM's undelegated linears)
        notes.append(export.note)
    if verdict.runner_note():  # run here, but not in the ExecuTorch runtime: say on what (and by which proxy)
        notes.insert(0, verdict.runner_note())
    if _status(validate) == TaskStatus.NOT_RUNNABLE:
        return out(CellState.ON_DEVICE, "; ".join([validate.get("reason", "")] + notes))
    if str(evidence.validated_on or "").startswith("random"):
        notes.insert(
            1 if verdict.runner_note() else 0,
            "validated on seeded random inputs only " + _validation_data_hint(cell.model),
        )
        return out(CellState.PROVISIONAL, "; ".join(notes))
    return out(CellState.OK, "; ".join(notes))


def _size_gate_moot(plan: Plan, cell: Cell, by_kind: dict, read: Read) -> str:
    """What the size gate says when it has nothing to compare against (its fp32 sibling's export did not
    succeed, so it could not run), or "" when it did run or waits for this cell's own export."""
    if _status(by_kind.get("sizegate")) != TaskStatus.BLOCKED or _status(by_kind.get("export")) != TaskStatus.OK:
        return ""
    sibling = plan.fp32_sibling(cell)
    if sibling is None:
        return ""
    spec = spec_of(plan, STAGE["export"].name, sibling)
    status = _status(read(spec))
    if status not in (TaskStatus.FAILED, TaskStatus.BLOCKED, TaskStatus.REJECTED, TaskStatus.SKIPPED):
        return ""
    return f"size gate: nothing to compare against ({spec.name} {status}); judged on its numerics"


def _validation_data_hint(model) -> str:
    """How a provisional cell becomes ok: name data, where the model can take it."""
    if model.multi_method or any(i.dims for i in model.inputs):
        return (
            "(validation data files for dynamic-shape and multi-method models are not supported "
            "yet: the cell stays provisional)"
        )
    return f"(name data under models.{model.name}.validation in pipeline.yaml)"


def _with_expectation(entry: ExpectedFailure | None, natural: CellOutcome) -> CellOutcome:
    if entry is None:
        return natural
    declared = f"expected to fail: {entry.reason} ({entry.link})"
    if natural.status == CellState.FAILED:
        return CellOutcome(
            cell=natural.cell,
            status=CellState.EXPECTED_FAILURE,
            reason=f"{declared}; {natural.reason}",
            log=natural.log,
            task=natural.task,
            evidence=natural.evidence,
            expected=entry,
        )
    if natural.status == CellState.ON_DEVICE:
        return CellOutcome(
            cell=natural.cell,
            status=CellState.EXPECTED_FAILURE,
            reason=f"{declared}; not checked on this host",
            evidence=natural.evidence,
            expected=entry,
        )
    if natural.status in (CellState.OK, CellState.PROVISIONAL):
        return CellOutcome(
            cell=natural.cell,
            status=CellState.UNEXPECTEDLY_PASSING,
            reason=f"passed ({natural.status}) but {entry.where} declares it an expected failure "
            f"({entry.reason}); remove that entry",
            evidence=natural.evidence,
            expected=entry,
        )
    return CellOutcome(
        cell=natural.cell,
        status=natural.status,
        reason=natural.reason,
        log=natural.log,
        task=natural.task,
        evidence=natural.evidence,
        expected=entry,
    )
