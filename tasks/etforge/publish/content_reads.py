"""The files the manifests' and the report's content may read, for the memo of their keys.

etforge.cache.content_keys keeps a matrix-wide stage's key while the stat signatures of these
files stay the same. What the content reads (measured with an audit hook on the default
pipeline): the cells' records and published files (programs, numerics) under the pipeline's
artifact directory, etforge's schemas (the runtime compatibility table) and recipes, the
benchmark baseline file, and the release the last ``etforge diff`` named. Skipped: what is
written but never read by the content (logs, the run summary, the two stages' own outputs, the
keys' named inputs).
A file this misses would serve a stale key, so the trees are whole directories, not file lists.
"""

from __future__ import annotations

from etforge.cache.content_keys import FileSet
from etforge.core.paths import SCHEMA_DIR
from etforge.pipeline.layout import layout_of
from etforge.publish import diff_pointer


def content_reads(plan) -> FileSet:
    layout = layout_of(plan)
    files = [plan.root / plan.benchmark.baseline] if plan.benchmark.baseline else []
    files += diff_pointer.remembered_files(plan)  # the release the last diff read: provenance (or archive), timings
    return FileSet(
        trees=(layout.out_dir, SCHEMA_DIR, *plan.recipe_path.dirs),
        skip=(
            layout.out_dir / "logs",
            layout.state_dir / "keys",  # each key's named inputs, for `etforge explain` (cache/records.py)
            layout.summary_path,
            layout.manifest_dir,
            layout.report_path,
        ),
        files=tuple(files),
    )
