"""What runs on a cluster worker (``etforge -P dask``): one doit task, and what the driver needs back.

The driver (etforge.engine.cluster) sends the pickled task (its actions are module functions
with picklable arguments: the plan, the subject, the store settings), the state records of the
task's direct upstream tasks, and the driver's code fingerprint. Nothing else travels: the
task reads its upstream store entries from the remote cache (through its own local store, which
restores what it lacks) and uploads what it builds there, as any machine sharing the cache does.

Back go doit's values, the failure, the task's state record and the tail of its log (a few KB),
and when it started and ended (the driver's scheduling overhead).

Workers keep the checkout at the driver's path (as CI images and a shared disk do): the records
are written to the paths the plan names. A worker whose etforge code differs from the driver's
fails the task with that reason instead of building something else under the driver's keys.
"""

from __future__ import annotations

import functools
import hashlib
import os
import socket
import time
from pathlib import Path

LOG_TAIL = 64 * 1024  # bytes of the task's log sent back (the whole log stays on the worker)


@functools.cache
def code_fingerprint() -> str:
    """A digest of etforge's source files as this process first saw them (a warm worker keeps the
    modules it imported: an edit since then is other code, even on a shared disk)."""
    package = Path(__file__).resolve().parent.parent
    h = hashlib.sha256()
    for path in sorted(package.rglob("*.py")):
        data = path.read_bytes()
        h.update(f"{path.relative_to(package)}:{len(data)}\n".encode() + data)
    return h.hexdigest()[:16]


def _read(path: str | None, limit: int | None = None) -> str | None:
    if not path:
        return None
    try:
        with open(path, "rb") as f:
            if limit:
                size = f.seek(0, os.SEEK_END)
                f.seek(max(0, size - limit))
            return f.read().decode("utf-8", errors="replace")
    except OSError:
        return None


def write_if_changed(path: str, text: str) -> None:
    """Write ``text`` at ``path`` atomically unless it holds it already (a shared disk: nothing to do)."""
    if _read(path) == text:
        return
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)


def run_job(job: bytes, upstream_records: dict, stream, code: str, files: dict) -> dict:
    """Run one doit task here. ``files``: {"state_file", "log_file"} of the task (or None)."""
    import cloudpickle
    from doit.exceptions import TaskError

    started = time.time()
    worker = os.environ.get("ETFORGE_WORKER_NAME") or socket.gethostname()
    out = {"worker": worker, "pid": os.getpid(), "started": started}
    if code != code_fingerprint():
        here = Path(__file__).resolve().parent.parent
        reason = f"worker {worker} runs other etforge code than the driver ({here}): update or restart it"
        return {**out, "failure": TaskError(reason), "values": {}, "result": None, "out": [], "err": [],
                "record": None, "log": None, "ended": time.time()}  # fmt: skip
    task = cloudpickle.loads(job)
    for path, text in upstream_records.items():  # their statuses say "blocked"; their keys, current
        write_if_changed(path, text)
    try:
        failure = task.execute(stream)
    except SystemExit as exc:  # the task's code exited: its failure, not the worker's
        failure = TaskError(f"{task.name}: its code called sys.exit({exc.code!r})")
    return {
        **out,
        "failure": failure,
        "values": task.values,
        "result": task.result,
        "out": [action.out for action in task.actions],
        "err": [action.err for action in task.actions],
        "record": _read(files.get("state_file")),
        "log": _read(files.get("log_file"), LOG_TAIL),
        "ended": time.time(),
    }
