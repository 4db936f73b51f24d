"""Run one cached task: restore its outputs from the store, or build and store them.

A task's state record (``artifacts/<pipeline>/.state/<task>.json``) says which
key its working-tree outputs were made from, with their size and mtime, so
deciding "up to date" is a JSON read and a stat per output. Failures are
recorded but never cached: a failed task runs again next time.

A failed task still returns success to doit, so that nothing downstream of it
is dropped silently (manifests and releases list failed cells instead of not
running); tasks/lifecycle.py turns recorded failures into the run's exit status.
"""

from __future__ import annotations

import json
import shutil
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from tasks.atomic import atomic_write_text
from tasks.cache import Store, materialize
from tasks.keys import canonical_json, sha256_file
from tasks.output_capture import output_to

DONE = ("ok", "skipped", "not-runnable")


@dataclass(frozen=True)
class CachedTask:
    name: str  # the doit task name, e.g. export:linreg/xnnpack/fp32
    key: str
    outputs: dict  # blob name -> working-tree Path, or None to keep it in the store only
    state_file: Path
    log_file: Path


@dataclass
class BuildResult:
    """What a builder returns: blobs it wrote and facts for the summary."""

    files: dict = field(default_factory=dict)  # blob name -> path in the work dir
    info: dict = field(default_factory=dict)
    status: str = "ok"  # ok | failed | skipped | not-runnable
    reason: str = ""  # one line, for failed/skipped/not-runnable


class Skip(Exception):
    """Raised by a builder when the host cannot do this task; the message says why."""


class Blocked(Exception):
    """Raised when an upstream task failed: recorded, never up to date, not a failure itself."""


def read_state(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def is_up_to_date(spec: CachedTask, store: Store) -> bool:
    # (not named `task`: doit would pass its own Task object in that slot)
    record = read_state(spec.state_file)
    if not record or record.get("key") != spec.key or record.get("status") not in DONE:
        return False
    if record["status"] == "skipped":
        return True  # nothing was written; the key already covers what this host lacks
    for name, target in spec.outputs.items():
        if target is None:
            if not store.has(spec.key):
                return False
            continue
        meta = record.get("outputs", {}).get(name)
        try:
            st = target.stat()
        except OSError:
            return False
        if not meta or meta["size"] != st.st_size or meta["mtime_ns"] != st.st_mtime_ns:
            return False
    return True


def _write_state(task: CachedTask, status: str, *, info=None, reason="", cached=False,
                 elapsed=0.0, outputs=None, log=None) -> None:
    record = {"task": task.name, "key": task.key, "status": status, "reason": reason,
              "cached": cached, "elapsed_s": round(elapsed, 3), "info": info or {},
              "outputs": outputs or {}, "log": str(log) if log else None}
    atomic_write_text(task.state_file, canonical_json(record))


def record_failure(task: CachedTask, reason: str) -> None:
    """Fail ``task`` from outside its action (its worker process died running it)."""
    _write_state(task, "failed", reason=reason, log=task.log_file)


def _materialize_all(task: CachedTask, blobs: dict) -> dict:
    outputs = {}
    for name, target in task.outputs.items():
        if target is None:
            continue
        materialize(blobs[name], target)
        st = target.stat()
        # sha256: what the release checks a file against before packing it (size and mtime can lie).
        outputs[name] = {"path": str(target), "size": st.st_size, "mtime_ns": st.st_mtime_ns,
                         "sha256": sha256_file(target)}
    return outputs


def run_cached(task: CachedTask, store: Store, build: Callable[[Path], BuildResult]) -> bool:
    """doit action body. Outcomes go to the state record; False only when even that failed."""
    start = time.monotonic()
    try:
        hit = store.get(task.key)
        if hit is not None:
            blobs, info = hit
            outputs = _materialize_all(task, blobs)
            _write_state(task, info.get("status", "ok"), info=info, reason=info.get("reason", ""),
                         cached=True, elapsed=time.monotonic() - start, outputs=outputs)
            return True
        workdir = store.new_workdir()
        try:
            return _build_and_store(task, store, build, workdir, start)
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
    except Exception as exc:  # the store or the working tree: a full disk, a read-only dir, the remote
        reason = first_line(exc)
        print(f"etforge: {task.name}: {reason}", file=sys.stderr)
        try:
            _write_state(task, "failed", reason=reason, elapsed=time.monotonic() - start)
        except OSError:
            return False  # the state dir itself is unwritable: let doit fail the task
        return True


def _build_and_store(task: CachedTask, store: Store, build, workdir: Path, start: float) -> bool:
    try:
        task.log_file.unlink(missing_ok=True)
        with output_to(task.log_file):
            result = build(workdir)
    except Skip as skip:
        _write_state(task, "skipped", reason=str(skip), elapsed=time.monotonic() - start, log=task.log_file)
        return True
    except Blocked as blocked:
        _write_state(task, "blocked", reason=str(blocked), elapsed=time.monotonic() - start)
        return True
    except Exception as exc:  # any builder error fails this task only
        with open(task.log_file, "a", encoding="utf-8") as log:
            log.write(traceback.format_exc())
        _write_state(task, "failed", reason=first_line(exc), elapsed=time.monotonic() - start,
                     log=task.log_file)
        return True
    info = {**result.info, "status": result.status, "reason": result.reason}
    if result.status == "failed":
        # Show the evidence (e.g. numerics.json) but never cache a failure.
        outputs = _materialize_all(task, result.files)
        _write_state(task, "failed", info=info, reason=result.reason,
                     elapsed=time.monotonic() - start, outputs=outputs, log=task.log_file)
        return True
    stored = store.put(task.key, result.files, info)
    outputs = _materialize_all(task, stored)
    _write_state(task, result.status, info=info, reason=result.reason,
                 elapsed=time.monotonic() - start, outputs=outputs, log=task.log_file)
    return True


def first_line(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.filename:  # name the path: "No space left on device: /x"
        return f"{type(exc).__name__}: {exc.strerror}: {exc.filename}"
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")
