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

Records are read through one guarded reader (:func:`read_state`, :func:`inputs_by_key`): a file
that is not JSON, nests too deep, or whose fields the readers use have other types (RECORD_FIELDS,
INPUT_FIELDS) is no record, as doit treats a damaged database: its task runs again, and the file
is named in one warning per process. No reader meets a RecursionError, AttributeError or TypeError.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from etforge.config.digest_cache import RACY_NS
from etforge.core.atomic import atomic_write_text
from etforge.core.console import say
from etforge.core.digest import canonical_json
from etforge.core.errors import BadValue
from etforge.core.jsonfile import parse_json, read_regular
from etforge.core.text import first_line
from etforge.pipeline.results import TaskStatus, task_status
from etforge.pipeline.specs import TaskSpec

PROGRAM = "program.pte"  # the export's blob a verdict judges


NONE = type(None)
# The fields of a record its readers use: (the JSON types it may hold, what the warning calls them).
# A record must have "key" (null: a matrix-wide task's record made before its key was known) and "status".
RECORD_FIELDS: dict = {
    "task": ((str,), "a string"),
    "key": ((str, NONE), "a string or null"),
    "status": ((str,), "a string"),
    "reason": ((str,), "a string"),
    "cached": ((bool,), "true or false"),
    "retry": ((bool,), "true or false"),
    "elapsed_s": ((int, float), "a number"),
    "info": ((dict,), "an object"),
    "outputs": ((dict,), "an object"),  # file name -> {path, size, mtime_ns, sha256}
    "entry": ((dict,), "an object"),  # blob name -> {sha256, size, mtime_ns}
    "log": ((str, NONE), "a string or null"),
    "inputs": ((dict,), "an object"),  # checked by inputs_problem
}
REQUIRED = ("key", "status")
# The named inputs of a key (etforge.pipeline.keys inputs_of), as etforge explain reads them.
INPUT_FIELDS: dict = {
    "stage": ((str,), "a string"),
    "facts": ((dict,), "an object"),
    "upstream": ((dict,), "an object"),  # relation -> {"task": name, "key": key}
    "code": ((dict,), "an object"),
}
UPSTREAM_FIELDS: dict = {"task": ((str,), "a string"), "key": ((str, NONE), "a string or null")}
_warned: set = set()  # (path, stat signature) of the damaged files this process has named


def _fields_problem(data: dict, table: dict, where: str = "") -> str | None:
    """The first field of ``table`` that ``data`` holds with another JSON type (a bool is no number)."""
    for name, (kinds, what) in table.items():
        if name not in data:
            continue
        value = data[name]
        if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
            return f'"{where}{name}" is not {what}'
    return None


def record_problem(record) -> str | None:
    """Why ``record`` (parsed JSON) is no task record for its readers, or None when it is one."""
    if not isinstance(record, dict):
        return "not a JSON object"
    for name in REQUIRED:
        if name not in record:
            return f'no "{name}"'
    problem = _fields_problem(record, RECORD_FIELDS)
    if problem:
        return problem
    for name in ("outputs", "entry"):
        if not all(isinstance(meta, dict) for meta in record.get(name, {}).values()):
            return f'"{name}" holds a file whose facts are not an object'
    return inputs_problem(record["inputs"], "inputs.") if "inputs" in record else None


def inputs_problem(inputs, where: str = "") -> str | None:
    """Why ``inputs`` (parsed JSON) are no key inputs for etforge explain, or None when they are."""
    if not isinstance(inputs, dict):
        return f'"{where.rstrip(".") or "inputs"}" is not an object'
    problem = _fields_problem(inputs, INPUT_FIELDS, where)
    if problem:
        return problem
    if not isinstance(inputs.get("facts", {}).get("toolchain", {}), dict):
        return f'"{where}facts.toolchain" is not an object'
    for relation, up in inputs.get("upstream", {}).items():
        if not isinstance(up, dict):
            return f'"{where}upstream.{relation}" is not an object'
        problem = _fields_problem(up, UPSTREAM_FIELDS, f"{where}upstream.{relation}.")
        if problem:
            return problem
    return None


def _read_checked(path: Path, problem_of, then: str) -> dict | None:
    """The JSON object at ``path`` when ``problem_of`` finds nothing wrong with it, else None;
    a file that is there but damaged is named in one warning per process, saying ``then``."""
    try:
        data = parse_json(read_regular(Path(path)))
    except FileNotFoundError:
        return None
    except (OSError, BadValue) as exc:  # unreadable, not a regular file, not JSON, too deep
        _warn_once(path, first_line(exc), then)
        return None
    problem = problem_of(data)
    if problem is not None:
        _warn_once(path, problem, then)
        return None
    return data


def _warn_once(path: Path, problem: str, then: str) -> None:
    seen = (str(path), signature(path))
    if seen not in _warned:
        _warned.add(seen)
        say(f"etforge: warning: {path}: damaged ({problem}); {then}")


def read_state(path: Path) -> dict | None:
    """The record at ``path``, or None when there is none: missing, unreadable, not JSON, or damaged
    (record_problem: a field its readers use of another type); the task then runs again."""
    return _read_checked(path, record_problem, "read as no record (its task runs again)")


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
    retry=False,
) -> None:
    """Write the task's record atomically (``key``: instead of the spec's, e.g. "" for a task that
    could not compute its key and so is never up to date; ``retry``: a failure that runs again even
    when declared expected, e.g. its inputs changed while it ran)."""
    record = {
        "task": spec.name,
        "key": spec.key if key is None else key,
        "status": str(status),
        "reason": str(reason) if reason else "",  # (a stored entry's info may hold any JSON)
        "cached": cached,
        "elapsed_s": round(elapsed, 3),
        "info": info or {},
        "outputs": outputs or {},
        "entry": entry or {},
        "log": str(log) if log else None,
    }
    if retry:
        record["retry"] = True
    if key is None and spec.inputs is not None:
        record["inputs"] = spec.inputs
        _keep_inputs(spec)
    atomic_write_text(spec.state_file, canonical_json(record))


def _keys_dir(spec: TaskSpec) -> Path:
    return spec.state_file.parent / "keys"


def _keep_inputs(spec: TaskSpec) -> None:
    path = _keys_dir(spec) / f"{spec.key}.json"
    if inputs_by_key(spec, spec.key) is None:  # a key's inputs never change: written once (again when damaged)
        atomic_write_text(path, canonical_json(spec.inputs))


def inputs_by_key(spec: TaskSpec, key: str | None) -> dict | None:
    """The named inputs a task of ``spec``'s pipeline once recorded for ``key``, or None."""
    if not isinstance(key, str) or not key or not all(c in "0123456789abcdef" for c in key):
        return None
    return _read_checked(_keys_dir(spec) / f"{key}.json", inputs_problem, "read as if it were not there")


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
