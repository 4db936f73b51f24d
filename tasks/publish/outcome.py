"""A cell's outcome: the one decision that the summary, report, manifests, C++ header,
release and the run's exit status all read (none of them re-derives it).

    cell_outcome(plan, cell, host=None) -> CellOutcome
    outcomes(plan, cells=None, host=None) -> [CellOutcome], in plan order
    rejected_outcome(rejected) -> CellOutcome of a combination refused at plan time
    failing(outcomes) -> the outcomes that fail the run
    listing_reason(outcome, layout) -> one line on why a cell is not shipped

Inputs are the state records of the cell's tasks (capture, quantize, export, size
gate, validate, benchmark) whose key is the task's CURRENT key. A record with any
other key (made before a threshold changed, hand-edited, left by another
revision) does not exist here: the cell is then "not built" or "not validated",
never shown with a stale verdict. A verdict (validate, or the benchmark) counts
only when the sha256 of the program it judged (``program_sha256``) is the
export's current sha256; one that names none counts for nothing. ``host`` (etforge.config.machine.host_fingerprint()) selects the
benchmark record; without it benchmarks are not read.

The state machine, first rule that applies:

    failed         a current record of capture, quantize, export, size gate, validate or
                   benchmark says failed (the first in that order): its reason and log
    rejected       a current record says rejected: the scheme cannot apply to this model
                   (e.g. a weight-group scheme that takes none of its layers), with why
    skipped        export skipped: this host cannot lower the backend (says what is missing)
    blocked        a current record says blocked (a task it needs did not succeed)
    not built      no current export record
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

This module must not import torch or executorch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from etforge.cache.records import current
from etforge.config.model import Cell, ExpectedFailure, Plan, RejectedCell, default_range_note
from etforge.pipeline.layout import ArtifactLayout, layout_of
from etforge.pipeline.specs import cell_specs
from etforge.pipeline.stages import STAGE, task_name
from etforge.publish.baseline import p50_of

SHIPS = ("ok", "provisional", "on-device")
FAILS_RUN = ("failed", "unexpectedly-passing")
PENDING = ("blocked", "not built", "not validated")  # no current verdict yet
# Every status, in the order tables list their counts.
STATUSES = (
    "ok",
    "provisional",
    "on-device",
    "failed",
    "unexpectedly-passing",
    "expected-failure",
    "skipped",
    "blocked",
    "not built",
    "not validated",
    "rejected",
)
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
    outputs: tuple = ()  # the capture's eager outputs: {"path", "shape", "dtype"} each
    method_outputs: dict = field(default_factory=dict)  # several methods: method -> its outputs, likewise
    delegated_ops: int | None = None
    non_delegated_ops: int | None = None
    size_vs_fp32: float | None = None
    calibration: str | None = None  # where static quantization's calibration data came from
    layers: dict | None = None  # the quantize record's: layers quantized and kept in float (layer_filter.py)
    metrics: dict = field(default_factory=dict)  # of METRICS, finite numbers only
    exact: bool = False  # validated here and identical to eager (infinite SQNR)
    validated_on: str | None = None  # the inputs the verdict was measured on, e.g. "npz data/val.npz"
    samples: int | None = None
    bundle: Path | None = None  # on-device: the .bpte
    bundle_sha256: str | None = None
    tolerances: dict = field(default_factory=dict)  # on-device: of TOLERANCES
    benchmark: dict | None = None  # the benchmark record's info (benchmarked here, current key)
    llm_metadata: dict | None = None  # an LLM program's runner metadata methods -> values (its export record)

    @property
    def latency_p50_ms(self) -> float | None:
        return p50_of(self.benchmark or {})

    @property
    def coverage(self) -> float | None:
        """Fraction of the graph's ops the backend took, or None."""
        d, n = self.delegated_ops, self.non_delegated_ops
        return d / (d + n) if d is not None and n is not None and d + n > 0 else None


@dataclass(frozen=True)
class CellOutcome:
    cell: str  # model/backend/quantization
    status: str  # one of STATUSES
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
    return CellOutcome(cell=rejected.name, status="rejected", reason=rejected.reason)


# ---------------------------------------------------------------- reading records


def finite(value):
    """``value`` when it is a finite number (not a bool), else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return value


def _info(record: dict | None) -> dict:
    info = (record or {}).get("info")
    return info if isinstance(info, dict) else {}


def _judged(record: dict | None) -> str | None:
    """The sha256 of the program a verdict record judged, if it names one."""
    value = _info(record).get("program_sha256")
    return value if isinstance(value, str) else None


def _bound(record: dict | None, sha256: str | None) -> bool:
    """A verdict counts only for the bytes it judged; one that names none counts for nothing."""
    judged = _judged(record)
    return judged is not None and judged == sha256


def _records(plan: Plan, cell: Cell, host: dict | None) -> list:
    """(task name, current record or None, spec) of the cell's tasks, in pipeline order."""
    return [(s.name, current(s), s) for s in cell_specs(plan, cell, host)]


def _evidence(plan: Plan, cell: Cell, by_kind: dict, export_sha: str | None) -> Evidence:
    export, validate, bench = by_kind.get("export"), by_kind.get("validate"), by_kind.get("benchmark")
    einfo = _info(export) if export and export.get("status") == "ok" else {}
    facts: dict = {}
    if einfo:
        facts.update(
            program=layout_of(plan).pte_path(cell),
            size_bytes=finite(einfo.get("size_bytes")),
            sha256=einfo.get("sha256"),
            lowering_s=finite(einfo.get("lowering_s")),
            delegates=tuple(einfo.get("delegates", cell.backend.delegates)),
            executorch_version=einfo.get("executorch_version"),
            data_file=layout_of(plan).ptd_path(cell) if einfo.get("data_sha256") else None,
            data_sha256=einfo.get("data_sha256"),
            data_size=finite(einfo.get("data_size_bytes")),
            input_dtypes=tuple(einfo.get("input_dtypes") or ()),
            delegated_ops=finite(einfo.get("delegated_ops")),
            non_delegated_ops=finite(einfo.get("non_delegated_ops")),
        )
        if isinstance(einfo.get("llm_metadata"), dict):
            facts["llm_metadata"] = dict(einfo["llm_metadata"])
    capture = by_kind.get("capture")
    if capture and capture.get("status") == "ok":
        facts["outputs"] = tuple(o for o in _info(capture).get("outputs") or () if isinstance(o, dict))
        methods = _info(capture).get("methods")
        if isinstance(methods, dict):
            facts["method_outputs"] = {
                m: list(v.get("outputs") or []) for m, v in methods.items() if isinstance(v, dict)
            }
    gate = by_kind.get("sizegate")
    if gate:
        facts["size_vs_fp32"] = finite(_info(gate).get("size_vs_fp32"))
    calibration = _info(by_kind.get("quantize")).get("calibration")
    if isinstance(calibration, str):
        facts["calibration"] = calibration
    layers = _info(by_kind.get("quantize")).get("layers")
    if isinstance(layers, dict):
        facts["layers"] = layers
    if validate and validate.get("status") in ("ok", "failed", "not-runnable") and _bound(validate, export_sha):
        vinfo = _info(validate)
        facts["validated_on"] = vinfo.get("inputs") if isinstance(vinfo.get("inputs"), str) else None
        facts["samples"] = finite(vinfo.get("samples", vinfo.get("test_cases")))
        if validate["status"] == "not-runnable":
            facts["bundle"] = layout_of(plan).bundled_path(cell)
            facts["bundle_sha256"] = ((validate.get("outputs") or {}).get("program.bpte") or {}).get("sha256")
            facts["tolerances"] = {k: vinfo[k] for k in TOLERANCES if k in vinfo}
        else:
            facts["metrics"] = {k: finite(vinfo.get(k)) for k in METRICS if finite(vinfo.get(k)) is not None}
            facts["exact"] = vinfo.get("sqnr_db") is None and vinfo.get("max_abs_error") == 0
    if bench and bench.get("status") == "ok" and _bound(bench, export_sha):
        facts["benchmark"] = _info(bench)
    return Evidence(**facts)


def cell_outcome(plan: Plan, cell: Cell, host: dict | None = None) -> CellOutcome:
    """The outcome of ``cell`` from its current records (see the module docstring)."""
    records = _records(plan, cell, host)
    by_kind = {name.split(":", 1)[0]: record for name, record, _ in records}
    export = by_kind["export"]
    export_sha = _info(export).get("sha256") if export and export.get("status") == "ok" else None
    evidence = _evidence(plan, cell, by_kind, export_sha)
    natural = _natural(plan, cell, records, by_kind, export_sha, evidence)
    return _with_expectation(plan.expected_failure(cell), natural)


def _natural(plan: Plan, cell: Cell, records: list, by_kind: dict, export_sha, evidence: Evidence) -> CellOutcome:
    """The outcome before ``matrix.expected_failures`` is applied."""

    def out(status, reason="", **kw):
        return CellOutcome(cell=cell.name, status=status, reason=" ".join(str(reason).split()), evidence=evidence, **kw)

    for name, record, _ in records:
        # A failure under the current key counts, unless it names other bytes than this program
        # (one that names none, e.g. a crash before it could, still counts: failing is the safe side).
        if record and record.get("status") == "failed" and _judged(record) in (None, export_sha):
            return out("failed", f"{name}: {record.get('reason') or 'failed'}", log=record.get("log"), task=name)
    for name, record, _ in records:
        if record and record.get("status") == "rejected":
            return out("rejected", record.get("reason", ""), task=name)
    export = by_kind["export"]
    if export and export.get("status") == "skipped":
        return out("skipped", export.get("reason", ""), task=task_name(STAGE["export"], cell))
    for name, record, _ in records:
        if record and record.get("status") == "blocked":
            return out("blocked", f"{name}: {record.get('reason', '')}", task=name)
    if export is None or export.get("status") != "ok":
        return out("not built", f"run `doit {task_name(STAGE['export'], cell)}`")
    validate = by_kind["validate"]
    if validate and validate.get("status") == "skipped":
        return out("skipped", validate.get("reason", ""), task=task_name(STAGE["validate"], cell))
    if validate is None or validate.get("status") not in ("ok", "not-runnable"):
        return out("not validated", f"run `doit {task_name(STAGE['validate'], cell)}`")
    if not _bound(validate, export_sha):
        judged = _judged(validate)
        return out(
            "not validated",
            f"the verdict on record judged another program "
            f"(sha256 {judged[:12] if judged else 'not recorded'}, "
            f"this one is {str(export_sha)[:12]})",
        )
    notes = [n for n in (layers_note(cell.quant.name, evidence.layers or {}),) if n]
    if str(evidence.calibration or "").startswith("random"):
        notes.append("random calibration data (name some in pipeline.yaml)")
    range_note = default_range_note(cell.model)
    if range_note and (cell.model.validation is None or (cell.quant.calibrated and cell.model.calibration is None)):
        notes.append(range_note)
    hf_source = cell.model.source.get("transformers")
    if hf_source and not hf_source.get("checkpoint"):  # built from its config: numerics, not quality
        notes.append("random weights (transformers config, no checkpoint)")
    if (export.get("info") or {}).get("note"):  # what lowering noticed (an LLM's undelegated linears)
        notes.append(export["info"]["note"])
    if validate["status"] == "not-runnable":
        return out("on-device", "; ".join([validate.get("reason", "")] + notes))
    if str(evidence.validated_on or "").startswith("random"):
        notes.insert(0, "validated on seeded random inputs only " + _validation_data_hint(cell.model))
        return out("provisional", "; ".join(notes))
    return out("ok", "; ".join(notes))


def _validation_data_hint(model) -> str:
    """How a provisional cell becomes ok: name data, where the model can take it."""
    if model.multi_method or any(i.dims for i in model.inputs):
        return (
            "(validation data files for dynamic-shape and multi-method models are not supported "
            "yet: the cell stays provisional)"
        )
    return f"(name data under models.{model.name}.validation in pipeline.yaml)"


def layers_note(scheme: str, layers: dict) -> str:
    """'8da4w quantized 3 of 5 layers; kept in float: side (in_features 24 ...); ...', or "" when it took all."""
    kept = [e for e in layers.get("kept_float") or () if isinstance(e, dict)]
    quantized = finite(layers.get("quantized")) or 0
    if not kept:
        return ""
    shown = "; ".join(f"{e.get('layer')} ({e.get('reason')})" for e in kept[:3])
    more = f"; and {len(kept) - 3} more" if len(kept) > 3 else ""
    return f"{scheme} quantized {quantized} of {quantized + len(kept)} layers; kept in float: {shown}{more}"


def _with_expectation(entry: ExpectedFailure | None, natural: CellOutcome) -> CellOutcome:
    if entry is None:
        return natural
    declared = f"expected to fail: {entry.reason} ({entry.link})"
    if natural.status == "failed":
        return CellOutcome(
            cell=natural.cell,
            status="expected-failure",
            reason=f"{declared}; {natural.reason}",
            log=natural.log,
            task=natural.task,
            evidence=natural.evidence,
            expected=entry,
        )
    if natural.status == "on-device":
        return CellOutcome(
            cell=natural.cell,
            status="expected-failure",
            reason=f"{declared}; not checked on this host",
            evidence=natural.evidence,
            expected=entry,
        )
    if natural.status in ("ok", "provisional"):
        return CellOutcome(
            cell=natural.cell,
            status="unexpectedly-passing",
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


# ---------------------------------------------------------------- views shared by the manifests and the release


def verdict(o: CellOutcome) -> dict:
    """How a shipped variant was checked, as the manifests, index.json and provenance.json say it:
    validated here (the SQNR and other metrics, and the data they were measured on), or to be
    checked on the device (its .bpte and the tolerances). JSON-ready, deterministic."""
    ev = o.evidence
    out = {"status": o.status, "inputs": ev.validated_on, "samples": ev.samples}
    if o.status == "on-device" or ev.bundle is not None:
        out.update(
            checked="on device",
            bundle=ev.bundle.name if ev.bundle else None,
            bundle_sha256=ev.bundle_sha256,
            rtol=finite(ev.tolerances.get("rtol")),
            atol=finite(ev.tolerances.get("atol")),
            not_checked_on_device=list(ev.tolerances.get("not_checked_on_device") or []),
        )
    else:
        out.update(checked="here", exact=ev.exact, **{k: ev.metrics.get(k) for k in METRICS if k in ev.metrics})
        out.setdefault("sqnr_db", None)  # null with exact: identical outputs (infinite SQNR)
    return out


def listing_reason(o: CellOutcome, layout: ArtifactLayout) -> str:
    """One line on why a cell is not shipped, the same on every identical run: a failure names
    the task and its log (as ``layout`` shows it), not the error text, which may name temp paths."""
    if o.status == "failed" or (o.status == "expected-failure" and o.task):
        log = layout.shown(o.log) if o.log else None
        failure = f"{o.task} failed" + (f", log: {log}" if log else "")
        if o.status == "failed":
            return failure
        return f"expected to fail: {o.expected.reason} ({o.expected.link}); {failure}"
    if o.status == "unexpectedly-passing":
        return f"passes, but {o.expected.where} declares it an expected failure; remove that entry"
    return o.reason
