"""Task records (``artifacts/<pipeline>/.state/<task>.json``): the only module that reads or writes them.

A record says how a task last ended (status, reason, the info its builder
returned), which key it was made from, what it put in the working tree (each
file's size, mtime and sha256) and what its store entry held (each blob's sha256,
size and mtime), so deciding "up to date" is a JSON read and a stat per file.

A record counts only for the key it was made from (:func:`current`): one with any
other key was made before an input changed, by another revision, or by hand.

A record made under the spec's own key also keeps the named inputs of that key
(``inputs``: facts, tool versions, code digests, upstream keys; etforge.pipeline.keys
inputs_of), and each key's inputs are kept once more by key (``.state/keys/<key>.json``,
:func:`inputs_by_key`), so that ``etforge explain`` can say what changed, upstream too,
after the upstream task ran again.
"""

from __future__ import annotations

import json
from pathlib import Path

from etforge.core.atomic import atomic_write_text
from etforge.core.digest import canonical_json
from etforge.pipeline.results import TaskStatus, task_status
from etforge.pipeline.specs import TaskSpec

PROGRAM = "program.pte"  # the export's blob a verdict judges


def read_state(path: Path) -> dict | None:
    """The record at ``path`` as written, or None (missing, unreadable, not JSON)."""
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def current(spec: TaskSpec) -> dict | None:
    """The task's record when it was made from the task's current key, else None."""
    record = read_state(spec.state_file)
    if isinstance(record, dict) and record.get("key") == spec.key:
        return record
    return None


def write_state(
    spec: TaskSpec,
    status: TaskStatus,
    *,
    key: str | None = None,
    info=None,
    reason="",
    cached=False,
    elapsed=0.0,
    outputs=None,
    log=None,
    entry=None,
) -> None:
    """Write the task's record atomically (``key``: instead of the spec's, e.g. "" for a task that
    could not compute its key and so is never up to date)."""
    record = {
        "task": spec.name,
        "key": spec.key if key is None else key,
        "status": str(status),
        "reason": reason,
        "cached": cached,
        "elapsed_s": round(elapsed, 3),
        "info": info or {},
        "outputs": outputs or {},
        "entry": entry or {},
        "log": str(log) if log else None,
    }
    if key is None and spec.inputs is not None:
        record["inputs"] = spec.inputs
        _keep_inputs(spec)
    atomic_write_text(spec.state_file, canonical_json(record))


def _keys_dir(spec: TaskSpec) -> Path:
    return spec.state_file.parent / "keys"


def _keep_inputs(spec: TaskSpec) -> None:
    path = _keys_dir(spec) / f"{spec.key}.json"
    if not path.exists():  # a key's inputs never change: written once
        atomic_write_text(path, canonical_json(spec.inputs))


def inputs_by_key(spec: TaskSpec, key: str | None) -> dict | None:
    """The named inputs a task of ``spec``'s pipeline once recorded for ``key``, or None."""
    if not key or not all(c in "0123456789abcdef" for c in key):
        return None
    found = read_state(_keys_dir(spec) / f"{key}.json")
    return found if isinstance(found, dict) else None


def record_failure(spec: TaskSpec, reason: str) -> None:
    """Fail a task from outside its action (its worker process died running it)."""
    write_state(spec, TaskStatus.FAILED, reason=reason, log=spec.log_file)


def recorded_program_sha256(export: TaskSpec) -> str | None:
    """sha256 of the program the export's current record says it stored (a JSON read)."""
    record = current(export)
    status = task_status((record or {}).get("status"))
    if status is None or not status.stored:
        return None
    return (((record or {}).get("entry") or {}).get(PROGRAM) or {}).get("sha256")
