"""The report's "changes since <baseline>" section: the baseline the last ``etforge diff`` named.

    remember(plan, baseline)            what ``etforge diff`` leaves for the report
    remembered(plan)                    that baseline: as kept, or read again when it was replaced
    changes_since(plan, cells, host)    the section's rows, recomputed from the current records

The report recomputes the comparison at every render from the remembered baseline and the
cells' current records, so the section is never older than the report (and, being part of
the report's content, it joins the report's key). The baseline is kept with what it recorded
and the stat signatures of the files it was read from, taken before reading them
(etforge.publish.diff_pointer Seen): while they hold, no archive is read on a render; once a
file there was replaced (even by one of the same size and mtime), or when it was written too
recently for its signature to vouch for it, the release there is read again, and the section
leaves the report when it is gone or can no longer be compared with.
"""

from __future__ import annotations

from pathlib import Path

from etforge.core.atomic import atomic_write_text
from etforge.core.digest import canonical_json
from etforge.core.errors import BadValue
from etforge.publish import cell_metrics, diff, diff_baseline, diff_pointer
from etforge.publish.cell_metrics import SCALAR, TEXT, MapOf, Record

# The pointer as remember() writes it (its "seen": diff_pointer.Seen's JSON form).
KEPT = Record(
    {
        "given": TEXT,
        "source": TEXT,
        "label": TEXT,
        "cells": MapOf(cell_metrics.BASELINE_CELL),
        "timings": MapOf(cell_metrics.TIMING),
        "toolchain": MapOf(SCALAR),
    },
    required=("given", "source", "label", "cells"),
)


def remember(plan, baseline: diff_baseline.Baseline) -> None:
    """Keep what the report needs of ``baseline``: what it recorded, and the signatures of the
    files it came from (so that a report renders without reading an archive, and reads the
    release again once one is replaced)."""
    kept = {
        "given": baseline.given or baseline.label,
        "source": str(baseline.source.resolve()),
        "seen": baseline.seen.to_json(),
        "label": baseline.label,
        "cells": baseline.cells,
        "timings": baseline.timings,
        "toolchain": baseline.toolchain,
    }
    atomic_write_text(diff_pointer.path(plan), canonical_json(kept) + "\n")


def remembered(plan) -> diff_baseline.Baseline | None:
    """The baseline the last ``etforge diff`` named: as kept while the files it was read from are
    unchanged, else read again from where it was; None when there is none, or when the release
    there is gone or cannot be compared with (no comparison with nothing)."""
    kept = diff_pointer.kept(plan)
    if kept is None:
        return None
    try:
        cell_metrics.check(kept, KEPT)
        seen = diff_pointer.Seen.from_json(kept.get("seen"))
    except BadValue:
        return None  # not what remember() writes
    source = Path(kept["source"])
    if not seen.unchanged():
        try:
            return diff_baseline.read(plan, kept["given"], source)
        except diff_baseline.BaselineError:
            return None
    return diff_baseline.Baseline(
        label=kept["label"],
        source=source,
        cells=kept["cells"],
        timings=kept.get("timings") or {},
        toolchain=kept.get("toolchain") or {},
        given=kept["given"],
        seen=seen,
    )


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
    """{"label", "summary", "rows"} against the remembered baseline (:func:`remembered`); None
    when there is none."""
    baseline = remembered(plan)
    if baseline is None:
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
