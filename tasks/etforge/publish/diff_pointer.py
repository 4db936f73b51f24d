"""Where ``etforge diff`` leaves the baseline it compared with, for the report (publish/diff_section.py).

    path(plan)                 the pointer file, in the pipeline's artifact directory
    remembered_source(plan)    the release it names (its provenance.json for a directory), or None
    stat_target(source)        the file whose stat stands for a release (what both compare)

Apart from diff_section so that the memo of the report's key (publish/content_reads.py) can
watch that release without importing the comparison code on every run.
"""

from __future__ import annotations

import json
from pathlib import Path

from etforge.pipeline.layout import layout_of


def path(plan) -> Path:
    return layout_of(plan).out_dir / ".diff-baseline.json"


def stat_target(source: Path) -> Path:
    """The file whose stat stands for a baseline release: a directory's provenance.json, or the archive."""
    return source / "provenance.json" if source.is_dir() else source


def remembered_source(plan) -> Path | None:
    """The file whose stat decides whether the report shows its "changes since" section."""
    try:
        source = Path(json.loads(path(plan).read_text(encoding="utf-8"))["source"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return stat_target(source)
