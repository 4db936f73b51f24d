"""Views of a cell's outcome shared by the manifests and the release: how a shipped variant was
checked (``verdict``) and one deterministic line on why a cell is not shipped (``listing_reason``).
The outcome itself is decided in outcome.py only."""

from __future__ import annotations

from etforge.config.model import Cell
from etforge.pipeline.layout import ArtifactLayout
from etforge.publish.outcome import CellOutcome, CellState


def verdict(o: CellOutcome, cell: Cell, layout: ArtifactLayout) -> dict:
    """How a shipped variant was checked, as the manifests, index.json and provenance.json say it:
    what each of its checks says of itself (etforge.checks: validated here, with the SQNR and
    other metrics and the data they were measured on; or to be checked on the device, with the
    tolerances), and for the device its .bpte. JSON-ready, deterministic."""
    out: dict = {"status": o.status, "inputs": None, "samples": None}  # (every variant names both)
    for check in o.facts.checks:
        out.update(check.manifest())
    if o.facts.bundled:
        out.update(bundle=layout.bundled_path(cell).name, bundle_sha256=o.facts.bundle_sha256)
    return out


def listing_reason(o: CellOutcome, layout: ArtifactLayout) -> str:
    """One line on why a cell is not shipped, the same on every identical run: a failure names
    the task and its log (as ``layout`` shows it), not the error text, which may name temp paths."""
    entry = o.expected
    if o.task is None and o.status in (CellState.FAILED, CellState.EXPECTED_FAILURE):
        return o.reason  # a derived check's line (a budget): deterministic, no task or log to name
    if o.status == CellState.FAILED or (o.status == CellState.EXPECTED_FAILURE and o.task and entry):
        log = layout.shown(o.log) if o.log else None
        failure = f"{o.task} failed" + (f", log: {log}" if log else "")
        if o.status == CellState.FAILED or entry is None:
            return failure
        return f"expected to fail: {entry.reason} ({entry.link}); {failure}"
    if o.status == CellState.UNEXPECTEDLY_PASSING and entry is not None:
        return f"passes, but {entry.where} declares it an expected failure; remove that entry"
    return o.reason
