"""Views of a cell's outcome shared by the manifests and the release: how a shipped variant was
checked (``verdict``) and one deterministic line on why a cell is not shipped (``listing_reason``).
The outcome itself is decided in outcome.py only."""

from __future__ import annotations

from etforge.pipeline.layout import ArtifactLayout
from etforge.publish.outcome import METRICS, CellOutcome, CellState
from etforge.publish.quant_notes import finite


def verdict(o: CellOutcome) -> dict:
    """How a shipped variant was checked, as the manifests, index.json and provenance.json say it:
    validated here (the SQNR and other metrics, and the data they were measured on), or to be
    checked on the device (its .bpte and the tolerances). JSON-ready, deterministic."""
    ev = o.evidence
    out: dict = {"status": o.status, "inputs": ev.validated_on, "samples": ev.samples}
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
        # every metric, null when not measured (or not finite): the manifests read each by name;
        # a null SQNR with exact: identical outputs (infinite SQNR)
        for k in METRICS:
            out.setdefault(k, None)
        if ev.validated_by:  # e.g. on the TOSA reference model, or through a proxy
            out["validated_by"] = ev.validated_by
    return out


def listing_reason(o: CellOutcome, layout: ArtifactLayout) -> str:
    """One line on why a cell is not shipped, the same on every identical run: a failure names
    the task and its log (as ``layout`` shows it), not the error text, which may name temp paths."""
    entry = o.expected
    if o.task is None and o.status in (CellState.FAILED, CellState.EXPECTED_FAILURE):
        return o.reason  # the budget gate's line: deterministic, no task or log to name
    if o.status == CellState.FAILED or (o.status == CellState.EXPECTED_FAILURE and o.task and entry):
        log = layout.shown(o.log) if o.log else None
        failure = f"{o.task} failed" + (f", log: {log}" if log else "")
        if o.status == CellState.FAILED or entry is None:
            return failure
        return f"expected to fail: {entry.reason} ({entry.link}); {failure}"
    if o.status == CellState.UNEXPECTEDLY_PASSING and entry is not None:
        return f"passes, but {entry.where} declares it an expected failure; remove that entry"
    return o.reason
