"""Task records (``artifacts/<pipeline>/.state/<task>.json``): the only module that reads or writes them.

A record says how a task last ended (status, reason, the info its builder
returned), which key it was made from, what it put in the working tree (each
file's size, mtime and sha256) and what its store entry held (each blob's sha256,
size and mtime), so deciding "up to date" is a JSON read and a stat per file.

A record counts only for the key it was made from (:func:`current`): one with any
other key was made before an input changed, by another revision, or by hand.

A run reads each record several times (its task's up-to-date check, the check of each verdict
on its program, every reader of the cells' outcomes): :class:`RunRecords` parses a record file
once per run while it keeps its stat signature (size, mtime, ctime, inode), and does not trust
one written less than RACY_NS before it was read (git's "racily clean" rule).

A record made under the spec's own key also keeps the named inputs of that key
(``inputs``: facts, tool versions, code digests, upstream keys; etforge.pipeline.keys
inputs_of), and each key's inputs are kept once more by key (``.state/keys/<key>.json``,
:func:`inputs_by_key`), so that ``etforge explain`` can say what changed, upstream too,
after the upstream task ran again.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from etforge.config.digest_cache import RACY_NS
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


def current(spec: TaskSpec, records: RunRecords | None = None) -> dict | None:
    """The task's record when it was made from the task's current key, else None (``records``: the
    run's parsed records; the record returned is then shared: read it, never change it)."""
    record = read_state(spec.state_file) if records is None else records.state(spec.state_file)[1]
    if isinstance(record, dict) and record.get("key") == spec.key:
        return record
    return None


def signature(path: Path | str) -> tuple | None:
    """(size, mtime_ns, ctime_ns, inode) of the file at ``path``, or None when there is none."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)


def trusted(sig: tuple | None) -> bool:
    """Whether a file with signature ``sig`` is old enough for its signature to vouch for its bytes."""
    return sig is None or time.time_ns() - max(sig[1], sig[2]) >= RACY_NS


class RunRecords:
    """The records of one run, each file parsed once while its stat signature stays the same."""

    def __init__(self):
        self._kept: dict = {}  # path -> (signature, record)

    def state(self, path: Path) -> tuple:
        """(signature before reading, the record as written or None) of the record file at ``path``."""
        sig = signature(path)
        kept = self._kept.get(path)
        if kept is not None and kept[0] == sig:
            return kept
        found = (sig, read_state(path) if sig is not None else None)
        if trusted(sig):
            self._kept[path] = found
        else:
            self._kept.pop(path, None)
        return found


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


def recorded_program_sha256(export: TaskSpec, records: RunRecords | None = None) -> str | None:
    """sha256 of the program the export's current record says it stored (a JSON read)."""
    record = current(export, records)
    status = task_status((record or {}).get("status"))
    if status is None or not status.stored:
        return None
    return (((record or {}).get("entry") or {}).get(PROGRAM) or {}).get("sha256")
