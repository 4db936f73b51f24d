"""Run one cached task: restore its outputs from the store, or build and store them.

A task's state record (``artifacts/<pipeline>/.state/<task>.json``) says which
key its working-tree outputs were made from, with their size and mtime, and
what its store entry held when it was installed (each file's size and mtime,
each blob's sha256), so deciding "up to date" is a JSON read and a stat per
file: a task whose entry other tasks read is up to date only while that entry
is still there, and a verdict (validation, benchmark) only while the program
it judged is the one stored under the export's key. Nothing is hashed on a
no-op run; a blob that kept its size and mtime but not its bytes is caught
when a consumer reads it (etforge.engine.inputs rebuilds it there). Failures are
recorded but never cached: a failed task runs again next time, unless its cell is a
declared expected failure (``matrix.expected_failures``): then its failure, recorded
under its key, is replayed until the key changes or ``--retry-failed`` (``replay``).

A failed task still returns success to doit, so that nothing downstream of it
is dropped silently (manifests and releases list failed cells instead of not
running); etforge.publish.exit_status turns recorded failures into the run's exit status.
"""

from __future__ import annotations

import shutil
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path

from etforge.cache.records import RunRecords, read_state, recorded_program_sha256, write_state
from etforge.cache.store import ENTRY_MANIFEST, Store, materialize
from etforge.core.digest import sha256_file
from etforge.core.text import first_line
from etforge.engine.log_capture import output_to
from etforge.pipeline.results import Blocked, Rejected, Skip, TaskStatus, task_status
from etforge.pipeline.specs import TaskSpec
from etforge.pipeline.stage_results import Judgement


def is_up_to_date(spec: TaskSpec, store: Store, replay: tuple | None = None, records: RunRecords | None = None) -> bool:
    """Whether the task's record says it is done for its key and its files are still there.

    ``replay``: the specs of the task's upstream tasks when its failure is declared expected
    (None: a failure runs again, as doit users expect). Then a failure recorded under the
    current key is up to date, and so is a block while an upstream task still fails. ``records``:
    the run's parsed records (etforge.cache.records RunRecords), else each is read here."""
    # (not named `task`: doit would pass its own Task object in that slot)
    record = (read_state(spec.state_file) if records is None else records.state(spec.state_file)[1]) or {}
    status = task_status(record.get("status"))
    if status is None or record.get("key") != spec.key:
        return False
    if not status.done:
        return (
            replay is not None
            and not record.get("retry")
            and (status == TaskStatus.FAILED or any(_not_ok(upstream, records) for upstream in replay))
        )
    if status in (TaskStatus.SKIPPED, TaskStatus.REJECTED):
        return True  # nothing was written; the key already covers what this host lacks or the scheme refuses
    for name, target in spec.outputs.items():
        if target is None:
            continue  # in the store only: checked with the entry below
        meta = record.get("outputs", {}).get(name)
        if not meta or not _same_stat(target, meta):
            return False
    if spec.keep_entry or None in spec.outputs.values():
        entry = record.get("entry") or {}
        if ENTRY_MANIFEST not in entry or not all(
            _same_stat(store.entry_dir(spec.store_key) / name, meta) for name, meta in entry.items()
        ):
            return False
    if spec.judges is not None and not Judgement.from_json(record.get("info")).judges(
        recorded_program_sha256(spec.judges, records)
    ):
        return False
    return True


def _not_ok(upstream: TaskSpec, records: RunRecords | None = None) -> bool:
    """Whether the upstream task's record for its current key says it failed or was blocked."""
    record = (read_state(upstream.state_file) if records is None else records.state(upstream.state_file)[1]) or {}
    return record.get("key") == upstream.key and record.get("status") in (TaskStatus.FAILED, TaskStatus.BLOCKED)


def _same_stat(path: Path, meta: dict) -> bool:
    try:
        st = path.stat()
    except OSError:
        return False
    return meta.get("size") == st.st_size and meta.get("mtime_ns") == st.st_mtime_ns


def _materialize_all(task: TaskSpec, blobs: dict, shas: dict | None = None) -> dict:
    """Copy the blobs to the task's working-tree outputs; ``shas``: their sha256 as the store verified
    them (a copy of a verified blob is not hashed again), else each copy is hashed."""
    outputs = {}
    for name, target in task.outputs.items():
        if target is None:
            continue
        materialize(blobs[name], target)
        st = target.stat()
        # sha256: what the release checks a file against before packing it (size and mtime can lie).
        outputs[name] = {
            "path": str(target),
            "size": st.st_size,
            "mtime_ns": st.st_mtime_ns,
            "sha256": (shas or {}).get(name) or sha256_file(target),
        }
    return outputs


def run_cached(
    task: TaskSpec,
    store: Store,
    build: Callable,
    *,
    inputs: Callable | None = None,
    accept: Callable[[dict], str | None] | None = None,
    changed: Callable[[], str | None] | None = None,
) -> bool:
    """doit action body. Outcomes go to the state record; False only when even that failed.

    ``build(workdir)`` makes the outputs; with ``inputs``, ``build(workdir, inputs())``:
    ``inputs`` fetches (or rebuilds) what the builder reads, outside the task's log, and may
    raise Skip or Blocked. ``accept(info)`` vets a stored result before it is restored: a
    reason string discards the entry (locally and on a writable remote) and builds instead.
    ``changed()``, asked once the build ended: the first input file edited since the key was
    computed (None: none). Then the result is not the key's: it is thrown away, not stored.
    """
    start = time.monotonic()
    try:
        hit = store.get(task.store_key) or _from_working_tree(task, store)
        if hit is not None and not _trusted(task, store, hit[1], accept):
            hit = None
        if hit is not None:
            blobs, info = hit
            outputs = _materialize_all(task, blobs, store.sha256_of(task.store_key))
            write_state(
                task,
                task_status(info.get("status", "ok")) or TaskStatus.OK,  # (_trusted refused any other)
                info=info,
                reason=info.get("reason", ""),
                cached=True,
                elapsed=time.monotonic() - start,
                outputs=outputs,
                entry=store.entry_record(task.store_key),
            )
            return True
        workdir = store.new_workdir()
        try:
            return _build_and_store(task, store, build, inputs, workdir, start, changed)
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
    except Exception as exc:  # the store or the working tree: a full disk, a read-only dir
        reason = first_line(exc)
        print(f"etforge: {task.name}: {reason}", file=sys.stderr)
        try:
            write_state(task, TaskStatus.FAILED, reason=reason, elapsed=time.monotonic() - start)
        except OSError:
            return False  # the state dir itself is unwritable: let doit fail the task
        return True


def _from_working_tree(task: TaskSpec, store: Store) -> tuple[dict, dict] | None:
    """Put a missing entry back from this task's own working-tree outputs, when its state
    record is for this key and every blob it stored is there with the recorded sha256
    (e.g. after ``rm -rf artifacts/cache``: the exports need not be lowered again)."""
    record = read_state(task.state_file) or {}
    status = task_status(record.get("status"))
    if status is None or not status.stored or record.get("key") != task.key:
        return None
    blobs = {name: meta.get("sha256") for name, meta in (record.get("entry") or {}).items() if name != ENTRY_MANIFEST}
    if not blobs or any(task.outputs.get(name) is None for name in blobs):
        return None
    try:
        if any(sha256_file(task.outputs[name]) != sha for name, sha in blobs.items()):
            return None
        return store.put(
            task.store_key, {name: task.outputs[name] for name in blobs}, record.get("info") or {}, expect=blobs
        )
    except Exception:  # noqa: BLE001  (changed under us, unreadable: build it instead)
        return None


def _trusted(task: TaskSpec, store: Store, info: dict, accept) -> bool:
    status = task_status(info.get("status", "ok"))
    if status is None or not status.stored:  # a damaged or forged entry: never restored
        store.reject(task.store_key)
        return False
    if accept is None:
        return True
    try:
        why = accept(info)
    except Exception:  # noqa: BLE001  (what it judged is not here: the build says why, e.g. Blocked)
        return False
    if why:
        print(
            f"etforge: {task.name}: not using its stored result: {why}; running it again", file=sys.stderr, flush=True
        )
        store.reject(task.store_key)
        return False
    return True


def _build_and_store(task: TaskSpec, store: Store, build, inputs, workdir: Path, start: float, changed) -> bool:
    try:
        task.log_file.unlink(missing_ok=True)
        given = inputs() if inputs is not None else None
        with output_to(task.log_file):
            result = build(workdir) if inputs is None else build(workdir, given)
    except Skip as skip:
        if not _discarded(task, changed, start):
            write_state(task, TaskStatus.SKIPPED, reason=str(skip), elapsed=time.monotonic() - start, log=task.log_file)
        return True
    except Rejected as rejected:
        if not _discarded(task, changed, start):
            write_state(
                task, TaskStatus.REJECTED, reason=str(rejected), elapsed=time.monotonic() - start, log=task.log_file
            )
        return True
    except Blocked as blocked:
        write_state(task, TaskStatus.BLOCKED, reason=str(blocked), elapsed=time.monotonic() - start)
        return True
    except (Exception, SystemExit) as exc:  # any builder error fails this task only (a model's sys.exit too)
        task.log_file.parent.mkdir(parents=True, exist_ok=True)
        with open(task.log_file, "a", encoding="utf-8") as log:
            log.write(traceback.format_exc())
        write_state(
            task, TaskStatus.FAILED, reason=first_line(exc), elapsed=time.monotonic() - start, log=task.log_file
        )
        return True
    info = result.info
    if result.status == TaskStatus.FAILED:
        # Show the evidence (e.g. numerics.json) but never cache a failure.
        outputs = _materialize_all(task, result.files)
        write_state(
            task,
            TaskStatus.FAILED,
            info=info,
            reason=result.reason,
            elapsed=time.monotonic() - start,
            outputs=outputs,
            log=task.log_file,
        )
        return True
    if _discarded(task, changed, start):
        return True
    # the stored info: another writer may have won; the build's seconds go with the entry (ci-matrix)
    stored, info = store.put(task.store_key, result.files, info, build_s=time.monotonic() - start)
    outputs = _materialize_all(task, stored, store.sha256_of(task.store_key))
    write_state(
        task,
        task_status(info.get("status")) or result.status,
        info=info,
        reason=info.get("reason", ""),
        elapsed=time.monotonic() - start,
        outputs=outputs,
        log=task.log_file,
        entry=store.entry_record(task.store_key),
    )
    return True


def _discarded(task: TaskSpec, changed, start: float) -> bool:
    """Whether a file the task's key covers was edited while it ran (Bazel checks its inputs' digests
    again after an action for the same reason). Its result is then another content's: it is
    thrown away with one warning, and the task fails this run and runs again on the next
    (``retry``: even when its cell's failure is declared expected)."""
    edited = changed() if changed is not None else None
    if edited is None:
        return False
    reason = f"{edited} changed while this task ran: its result is not kept (the next run builds it)"
    print(f"etforge: warning: {task.name}: {reason}", file=sys.stderr, flush=True)
    write_state(task, TaskStatus.FAILED, reason=reason, elapsed=time.monotonic() - start, log=task.log_file, retry=True)
    return True
