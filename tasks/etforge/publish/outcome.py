"""A cell's outcome: the one decision that the summary, report, manifests, C++ header,
release and the run's exit status all read (none of them re-derives it).

    cell_outcome(plan, cell, host=None, read=current) -> CellOutcome
    outcomes(plan, cells=None, host=None) -> [CellOutcome], in plan order
    rejected_outcome(rejected) -> CellOutcome of a combination refused at plan time
    failing(outcomes) -> the outcomes that fail the run
    listing_reason(outcome, layout) -> one line on why a cell is not shipped

Inputs are the state records of the cell's tasks (capture, quantize, export, size
gate, validate, benchmark) whose key is the task's CURRENT key, and the checks they hold
(etforge.checks: delegation, the size gate, numerics on a runtime, ...), read through the
check table the caller hands in (etforge.checks.table CHECKS), plus the checks that table
derives from the plan and the program (budgets, the runtime window). A record with any
other key (made before a threshold changed, hand-edited, left by another
revision) does not exist here: the cell is then "not built" or "not validated",
never shown with a stale verdict. A verdict (validate, or the benchmark) counts
only for the program it judged (etforge.pipeline.stage_results Judgement.judges: its
``program_sha256`` is the export's current sha256; one that names none counts for nothing). ``host`` (etforge.config.machine.host_fingerprint()) selects the
benchmark record; without it benchmarks are not read.

The state machine, first rule that applies:

    failed         a current record of capture, quantize, export, size gate, validate, target or
                   benchmark says failed (the first in that order): the reason of the check
                   that failed in it (else the record's own, e.g. a crash), and its log
    rejected       a current record says rejected: the scheme cannot apply to this model
                   (e.g. a weight-group scheme that takes none of its layers), with why
    skipped        export skipped: this host cannot lower the backend (says what is missing)
    blocked        a current record says blocked (a task it needs did not succeed); not the
                   size gate when only its fp32 sibling's export failed: the size gate has
                   nothing to compare against (a note says so) and the cell is judged on its numerics
    not built      no current export record
    failed         a derived check that gates the cell failed (a budget: gates.max_program_bytes
                   / max_planned_bytes, with both numbers)
    skipped        validation skipped
    not validated  exported, but no current verdict on this program (here, and on each of its targets)
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

from etforge.cache.records import current
from etforge.checks.base import Check
from etforge.checks.table import CHECKS, CheckTable
from etforge.config.model import Cell, ExpectedFailure, Plan, RejectedCell, default_range_note
from etforge.pipeline.results import TaskStatus, task_status
from etforge.pipeline.specs import TaskSpec, cell_specs, spec_of
from etforge.pipeline.stage_results import (
    BenchmarkResult,
    CaptureResult,
    ExportResult,
    GateResult,
    Judgement,
    QuantizeResult,
    TargetVerdict,
    Verdict,
)
from etforge.pipeline.stages import STAGE, task_name
from etforge.publish.baseline import fastest_of
from etforge.publish.quant_notes import layers_note, rescue_note


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


@dataclass(frozen=True)
class CellFacts:
    """What the cell's current records say (None: not known), each read once. Read-only.

    ``program`` is the export's result (its bytes, costs, interface), ``checks`` every check of
    this program: those its records hold (export, size gate, validate) and those the check table
    derives (budgets, the runtime window). A verdict or benchmark on other bytes is not here."""

    program: ExportResult | None = None
    capture: CaptureResult | None = None
    quantize: QuantizeResult | None = None
    benchmark: BenchmarkResult | None = None  # benchmarked here, under its current key, on this program
    checks: tuple[Check, ...] = ()
    judged: bool = False  # a verdict (validate) on this program is among the checks
    bundled: bool = False  # the verdict is a .bpte for the device to check itself
    bundle_sha256: str | None = None  # of that .bpte, as its validate record stored it

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
    def provisional(self) -> bool:
        """Judged here on seeded random inputs only (a check's own say)."""
        return any(c.provisional for c in self.checks)


@dataclass(frozen=True)
class CellOutcome:
    cell: str  # model/backend/quantization
    status: CellState
    reason: str  # one line ("" when there is nothing to add)
    log: str | None = None  # the log of the task that decided a failure
    task: str | None = None  # the task whose record decided a failure, skip or block
    facts: CellFacts = field(default_factory=CellFacts)
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


def outcomes(plan: Plan, cells=None, host: dict | None = None, checks: CheckTable = CHECKS) -> list:
    """The outcome of each of ``cells`` (default: every cell of the plan), in that order."""
    return [cell_outcome(plan, c, host, checks=checks) for c in (plan.cells if cells is None else cells)]


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


def _facts(plan: Plan, cell: Cell, by_kind: dict, table: CheckTable) -> CellFacts:
    """The cell's facts from its current records (``by_kind``: stage name -> record), checks read by ``table``."""
    exported = _status(by_kind["export"]) == TaskStatus.OK
    program = ExportResult.from_json(_info(by_kind["export"]), table) if exported else None
    sha256 = program.sha256 if program is not None else None
    checks: tuple = ()
    if program is not None:
        checks += program.checks
        gate = by_kind.get("sizegate")
        if _status(gate) in (TaskStatus.OK, TaskStatus.FAILED):
            checks += GateResult.from_json(_info(gate), table).checks
    capture = (
        CaptureResult.from_json(_info(by_kind["capture"])) if _status(by_kind.get("capture")) == TaskStatus.OK else None
    )
    quantize = QuantizeResult.from_json(_info(by_kind.get("quantize")))
    validate = by_kind.get("validate")
    verdict = Verdict.from_json(_info(validate), table)
    judged = _status(validate) in (TaskStatus.OK, TaskStatus.FAILED, TaskStatus.NOT_RUNNABLE) and verdict.judges(sha256)
    bundled = judged and _status(validate) == TaskStatus.NOT_RUNNABLE
    bundle_sha256 = None
    if judged:
        checks += verdict.checks
    if bundled:
        bundle_sha256 = (((validate or {}).get("outputs") or {}).get("program.bpte") or {}).get("sha256")
    target = by_kind.get("target")  # the same program on the cell's targets (aarch64 cores): one check each
    if _status(target) in (TaskStatus.OK, TaskStatus.FAILED):
        on_targets = TargetVerdict.from_json(_info(target), table)
        checks += on_targets.checks if on_targets.judges(sha256) else ()
    if program is not None:
        checks += table.derived(plan, cell, program)
    benchmark = None
    bench = by_kind.get("benchmark")
    if _status(bench) == TaskStatus.OK:
        found = BenchmarkResult.from_json(_info(bench))
        benchmark = found if found.judges(sha256) else None
    return CellFacts(
        program=program,
        capture=capture,
        quantize=quantize,
        benchmark=benchmark,
        checks=checks,
        judged=judged,
        bundled=bundled,
        bundle_sha256=bundle_sha256,
    )


def cell_outcome(
    plan: Plan, cell: Cell, host: dict | None = None, read: Read = current, checks: CheckTable = CHECKS
) -> CellOutcome:
    """The outcome of ``cell`` from its current records (see the module docstring), each read
    with ``read`` (and nothing else read), their checks through ``checks``."""
    records = _records(plan, cell, host, read)
    by_kind = {name.split(":", 1)[0]: record for name, record, _ in records}
    facts = _facts(plan, cell, by_kind, checks)
    natural = _natural(plan, cell, records, by_kind, facts, read, checks)
    return _with_expectation(plan.expected_failure(cell), natural)


def _natural(
    plan: Plan, cell: Cell, records: list, by_kind: dict, facts: CellFacts, read: Read, table: CheckTable
) -> CellOutcome:
    """The outcome before ``matrix.expected_failures`` is applied."""

    def out(status, reason="", **kw):
        return CellOutcome(cell=cell.name, status=status, reason=" ".join(str(reason).split()), facts=facts, **kw)

    program = facts.program
    sha256 = program.sha256 if program is not None else None
    moot = _size_gate_moot(plan, cell, by_kind, read)
    if moot:  # a failed fp32 sibling never hides this cell's own verdict: judged on its numerics
        records = [r for r in records if not r[0].startswith(STAGE["sizegate"].name + ":")]
    for name, record, _ in records:
        # A failure under the current key counts, unless it names other bytes than this program
        # (one that names none, e.g. a crash before it could, still counts: failing is the safe side).
        if _status(record) != TaskStatus.FAILED:
            continue  # (parsed only when it failed: a no-op run reads every cell's records)
        info = _info(record)
        judged = Judgement.from_json(info).program_sha256
        if judged in (None, sha256):
            check = next((c for c in table.parse_all(info.get("checks")) if c.failed), None)
            why = _beside(check, facts.checks) if check is not None else record.get("reason")  # else it crashed
            return out(CellState.FAILED, f"{name}: {why or 'failed'}", log=record.get("log"), task=name)
    for name, record, _ in records:
        if _status(record) == TaskStatus.REJECTED:
            return out(CellState.REJECTED, record.get("reason", ""), task=name)
    if _status(by_kind["export"]) == TaskStatus.SKIPPED:
        return out(CellState.SKIPPED, by_kind["export"].get("reason", ""), task=task_name(STAGE["export"], cell))
    for name, record, _ in records:
        if _status(record) == TaskStatus.BLOCKED:
            return out(CellState.BLOCKED, f"{name}: {record.get('reason', '')}", task=name)
    if program is None:
        return out(CellState.NOT_BUILT, f"run `etforge {task_name(STAGE['export'], cell)}`")
    derived = next((c for c in facts.checks if c.failed and c.gates == "cell"), None)
    if derived is not None:  # decided here, not by a task (a budget changes no program: no log to name)
        return out(CellState.FAILED, derived.reason())
    validate = by_kind["validate"]
    if _status(validate) == TaskStatus.SKIPPED:
        return out(CellState.SKIPPED, validate.get("reason", ""), task=task_name(STAGE["validate"], cell))
    if _status(validate) not in (TaskStatus.OK, TaskStatus.NOT_RUNNABLE):
        return out(CellState.NOT_VALIDATED, f"run `etforge {task_name(STAGE['validate'], cell)}`")
    if not facts.judged:
        judged = Judgement.from_json(_info(validate)).program_sha256
        return out(
            CellState.NOT_VALIDATED,
            f"the verdict on record judged another program "
            f"(sha256 {judged[:12] if judged else 'not recorded'}, "
            f"this one is {str(sha256)[:12]})",
        )
    target = by_kind.get("target")  # every target must have judged this program too
    if cell.targets and not (
        _status(target) in (TaskStatus.OK, TaskStatus.FAILED) and TargetVerdict.from_json(_info(target)).judges(sha256)
    ):
        return out(CellState.NOT_VALIDATED, f"run `etforge {task_name(STAGE['target'], cell)}`")
    said = [c.note() for c in facts.checks if c.note()]  # e.g. run on the TOSA reference model, not the runtime
    quantize = facts.quantize or QuantizeResult()
    notes = said + [n for n in (rescue_note(quantize.rescue), layers_note(cell.quant.name, quantize.layers), moot) if n]
    if str(quantize.calibration or "").startswith("random"):
        notes.append("random calibration data (name some in pipeline.yaml)")
    range_note = default_range_note(cell.model)
    if range_note and (cell.model.validation is None or (cell.quant.calibrated and cell.model.calibration is None)):
        notes.append(range_note)
    hf_source = cell.model.source.get("transformers")
    if hf_source and not hf_source.get("checkpoint"):  # built from its config: numerics, not quality
        notes.append("random weights (transformers config, no checkpoint)")
    if program.note:  # what lowering noticed (an LLM's undelegated linears)
        notes.append(program.note)
    if _status(validate) == TaskStatus.NOT_RUNNABLE:
        return out(CellState.ON_DEVICE, "; ".join([validate.get("reason", "")] + notes))
    if facts.provisional:
        notes.insert(len(said), "validated on seeded random inputs only " + _validation_data_hint(cell.model))
        return out(CellState.PROVISIONAL, "; ".join(notes))
    return out(CellState.OK, "; ".join(notes))


def _beside(check: Check, checks: tuple) -> str:
    """A failed check's reason, with the figures of the checks of its kind that passed (the host's
    numerics beside an aarch64 core's): two runtimes that disagree show both figures."""
    passed = [f"{c.heading()} {c.text()}" for c in checks if c.kind == check.kind and c.key != check.key and c.passed]
    return check.reason() + (f" (passed: {', '.join(passed)})" if passed else "")


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
    where = f"models.{model.name}.validation"  # etforge.config.validation_data's and llm_tokens' forms
    if model.kind == "llm":
        return f"(name a token file under {where}.tokens, or a text and its tokenizer under {where}.text, in pipeline.yaml)"
    if model.kind == "seq2seq":  # the decoder is driven from the encoder's output
        return f"(name the encoder's data under {where}.methods.encoder in pipeline.yaml)"
    if model.multi_method:
        return f"(name data per method under {where}.methods in pipeline.yaml)"
    if any(i.dims for i in model.inputs):
        return f"(name one npz per shape under {where}.shapes in pipeline.yaml)"
    return f"(name data under {where} in pipeline.yaml)"


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
            facts=natural.facts,
            expected=entry,
        )
    if natural.status == CellState.ON_DEVICE:
        return CellOutcome(
            cell=natural.cell,
            status=CellState.EXPECTED_FAILURE,
            reason=f"{declared}; not checked on this host",
            facts=natural.facts,
            expected=entry,
        )
    if natural.status in (CellState.OK, CellState.PROVISIONAL):
        return CellOutcome(
            cell=natural.cell,
            status=CellState.UNEXPECTEDLY_PASSING,
            reason=f"passed ({natural.status}) but {entry.where} declares it an expected failure "
            f"({entry.reason}); remove that entry",
            facts=natural.facts,
            expected=entry,
        )
    return CellOutcome(
        cell=natural.cell,
        status=natural.status,
        reason=natural.reason,
        log=natural.log,
        task=natural.task,
        facts=natural.facts,
        expected=entry,
    )
