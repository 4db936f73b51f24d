"""The report's "changes since <baseline>" section: the baseline the last ``etforge diff`` named.

    remember(plan, baseline)            what ``etforge diff`` leaves for the report
    changes_since(plan, cells, host)    the section's rows, recomputed from the current records

The report recomputes the comparison at every render from the remembered baseline (what it
recorded, kept here with the stat of its file: no archive is read on a no-op run) and the
cells' current records, so the section is never older than the report (and, being part of
the report's content, it joins the report's key).
"""

from __future__ import annotations

import json
from pathlib import Path

from etforge.core.atomic import atomic_write_text
from etforge.core.digest import canonical_json
from etforge.publish import cell_metrics, diff, diff_baseline, diff_pointer


def _stat(path) -> list | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return [st.st_size, st.st_mtime_ns]


def remember(plan, baseline: diff_baseline.Baseline) -> None:
    """Keep what the report needs of ``baseline``: what it recorded, and the stat of where it came
    from (so that a report renders without reading an archive, and drops the section once the
    release there is replaced or gone)."""
    kept = {
        "source": str(baseline.source.resolve()),
        "stat": _stat(diff_pointer.stat_target(baseline.source)),
        "label": baseline.label,
        "cells": baseline.cells,
        "timings": baseline.timings,
        "toolchain": baseline.toolchain,
    }
    atomic_write_text(diff_pointer.path(plan), canonical_json(kept) + "\n")


def scoped(plan, cells, baseline_cells: dict) -> dict:
    """The baseline's cells a comparison of ``cells`` covers: the selected ones, and those the
    pipeline no longer has (removed); a cell of the pipeline left out of the selection is not."""
    models = {c.model.name for c in cells}
    selected = {c.name for c in cells} | {r.name for r in plan.rejected if r.model in models}
    known = {c.name for c in plan.cells} | {r.name for r in plan.rejected}
    return {n: v for n, v in baseline_cells.items() if n in selected or n not in known}


def compare(plan, cells, host, baseline: diff_baseline.Baseline, outcomes=None) -> list:
    current = cell_metrics.snapshot(plan, cells, host, outcomes)
    return diff.compare(scoped(plan, cells, baseline.cells), baseline.timings, current, plan.diff, baseline.toolchain)


def changes_since(plan, cells, host, outcomes=None) -> dict | None:
    """{"label", "summary", "rows"} against the remembered baseline; None when there is none, or
    when the release it came from was replaced or removed since (no comparison with nothing)."""
    try:
        kept = json.loads(diff_pointer.path(plan).read_text(encoding="utf-8"))
        source = Path(kept["source"])
        if kept["stat"] != _stat(diff_pointer.stat_target(source)):
            return None
        baseline = diff_baseline.Baseline(
            label=str(kept["label"]),
            source=source,
            cells=dict(kept["cells"]),
            timings=dict(kept["timings"]),
            toolchain=dict(kept.get("toolchain") or {}),
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None
    changes = compare(plan, cells, host, baseline, outcomes)
    return {
        "label": baseline.label,
        "summary": diff.summary_line(changes, baseline.label),
        "rows": [
            {"cell": c.cell, "what": c.what, "before": c.before, "after": c.after, "kind": c.kind, "note": c.note}
            for c in diff.ordered(changes)
        ],
    }
