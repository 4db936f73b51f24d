"""What a task reads from the tasks upstream of it: their verified store entries, healed on the way.

A task reads what its upstream tasks stored through :func:`stored`: when that
entry turns out missing or corrupt (it is verified on every read), the upstream
task is run again right there, through its own cached run with its own record
and log, and the task goes on; the same run heals the store.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable

from etforge.cache.records import PROGRAM, current
from etforge.cache.store import Store
from etforge.core.errors import BuildError
from etforge.pipeline.results import Blocked, Entry, Rejected, Skip, TaskStatus, task_status
from etforge.pipeline.specs import TaskSpec, spec_of
from etforge.pipeline.stage_results import Judgement
from etforge.pipeline.stages import upstream_of

# rebuild(stage, subject) -> bool: run that upstream task again (etforge.engine.actions run_stage)
Rebuild = Callable[[object, object], bool]


def require(upstream: TaskSpec) -> None:
    """Stop early, saying why, when the task this one consumes did not succeed."""
    record = current(upstream) or {}
    status = task_status(record.get("status"))
    if status is None:
        return  # not run in this checkout (another shard built it), or damaged: the store lookup decides
    if status in (TaskStatus.FAILED, TaskStatus.BLOCKED):
        raise Blocked(f"{upstream.name} {record['status']}")
    if status == TaskStatus.SKIPPED:
        raise Skip(f"{upstream.name} skipped: {record.get('reason', '')}")
    if status == TaskStatus.REJECTED:
        raise Rejected(f"{upstream.name} rejected: {record.get('reason', '')}")


def stored(store: Store, upstream: TaskSpec, rebuild: Callable[[], bool]) -> Entry:
    """The verified store entry of ``upstream``.

    When it is missing or fails verification, ``rebuild`` runs the upstream task again here
    (restored from the remote or the working tree when possible, else built), one worker at
    a time per key: another worker needing it meanwhile waits and then reads it.
    """
    require(upstream)
    hit = store.get(upstream.store_key)
    if hit is None:
        with store.lock(upstream.store_key):
            hit = store.get(upstream.store_key)
            if hit is None:
                print(
                    f"etforge: {upstream.name}: its cache entry is missing or corrupt; running it again",
                    file=sys.stderr,
                    flush=True,
                )
                rebuild()
                require(upstream)
                hit = store.get(upstream.store_key)
    if hit is None:
        raise BuildError(f"{upstream.name} left nothing in the cache (log: {upstream.log_file})")
    files, info = hit
    return Entry(task=upstream.name, files=files, info=info, sha256=store.sha256_of(upstream.store_key))


def upstream_entries(plan, stage, subject, store: Store, host, rebuild: Rebuild) -> dict:
    """relation -> Entry of every upstream relation of ``stage`` (etforge.pipeline.stages), in order;
    two relations that name one task (an fp32 cell's graph is its capture) share its entry, fetched once."""
    entries: dict = {}
    by_task: dict = {}
    for relation, up, up_subject in upstream_of(plan, stage, subject):
        spec = spec_of(plan, up, up_subject, host)
        if spec.name not in by_task:
            by_task[spec.name] = stored(store, spec, functools.partial(rebuild, up, up_subject))
        entries[relation] = by_task[spec.name]
    return entries


def judges_current_program(plan, stage, subject, store: Store, host, rebuild: Rebuild):
    """``accept`` of a stored verdict (validation, benchmark): it counts only for the program stored
    under the judged export's current key (a forged or stale entry judged other bytes)."""

    def accept(info: dict) -> str | None:
        relation, up, up_subject = next(u for u in upstream_of(plan, stage, subject) if u[0] == stage.judges)
        export = spec_of(plan, up, up_subject, host)
        stored(store, export, lambda: rebuild(up, up_subject))
        current_sha = store.blob_sha256(export.store_key, PROGRAM)
        judgement = Judgement.from_json(info)
        if not judgement.judges(current_sha):
            judged = judgement.program_sha256
            return (
                f"it judged program sha256 {str(judged)[:12]}, but {export.name}'s program is {str(current_sha)[:12]}"
            )
        return None

    return accept
