"""The run lifecycle: what happens before the first task and after the last, whatever the reporter.

    begin  take the run lock (etforge.engine.runlock), then clean the scratch left by
           killed runs: build dirs in artifacts/cache/tmp, release staging dirs,
           temp files of interrupted atomic writes.
    end    hand the tasks this run ran and touched to ``judge``, which writes
           summary.json and decides the exit status from the cells' outcomes
           (etforge.publish.exit_status; the loader, etforge.app.loader, wires it in,
           so the engine never imports publishing).

etforge.engine.runners calls these from the runner, the only object every run
creates whichever reporter (``-r json``, ``--reporter=...``) or number of workers
(``-n 2 -P process``) is used; the reporter only displays. Every line
goes to the process's real stderr (etforge.core.console).
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from etforge.cache.records import record_failure
from etforge.core import swap
from etforge.core.console import say
from etforge.engine import doit_db, runlock
from etforge.pipeline.layout import ArtifactLayout

# tempfile.mkstemp names of etforge.core.atomic: ".<target>.<8 random chars>.tmp"
ATOMIC_TEMP = re.compile(r"^\..+\.[a-z0-9_]{8}\.tmp$")


@dataclass(frozen=True)
class RunLifecycle:
    layout: ArtifactLayout
    specs: dict  # task name -> TaskSpec whose record says how the task ended (etforge.pipeline.specs run_specs)
    judge: Callable[[set, set], bool]  # (ran, touched task names) -> True when the run failed

    def begin(self) -> runlock.RunLock:
        lock = runlock.acquire(self.layout.lock_file, say)
        clean_scratch(self.layout)  # holding the lock, nobody else is writing
        return lock

    def close_database(self, dep_manager) -> bool:
        problem = doit_db.close(dep_manager, doit_db.database_path(self.layout.artifacts_dir))
        if problem:
            say(problem)
        return problem is None

    def end(self, ran: set, touched: set) -> bool:
        """After the last task: True when the run failed (the judge says why)."""
        return self.judge(set(ran), set(touched))

    def record_worker_death(self, task_name: str, reason: str) -> bool:
        """A worker died running ``task_name``: say so and fail the task in its record.

        Returns False when the task keeps no record (doit must fail it itself).
        """
        spec = self.specs.get(task_name)
        log = spec.log_file if spec is not None else self.layout.log_path(task_name)
        say(f"etforge: {task_name}: {reason} (log: {log})")
        if spec is None:
            return False
        try:
            record_failure(spec, reason)
        except OSError as exc:
            say(f"etforge: error: cannot write {spec.state_file}: {exc.strerror or exc}")
            return False
        return True


def clean_scratch(layout: ArtifactLayout) -> None:
    """Remove what killed runs left behind; call only while holding the run lock.

    Build dirs under the cache go only when the cache lives under the locked
    artifacts directory: a cache linked elsewhere (``artifacts: {allow_outside: true}``)
    may be shared with a checkout that is building right now.
    """
    artifacts = layout.artifacts_dir
    if _inside(layout.cache_dir.resolve(), artifacts.resolve()):
        shutil.rmtree(layout.cache_dir / "tmp", ignore_errors=True)
    release = layout.release_root
    if release.is_dir():
        for staging in release.glob(".release-*"):
            try:
                swap.finish(staging)  # a release swapped in halfway is completed, any other staging dropped
            except OSError:
                shutil.rmtree(staging, ignore_errors=True)
    (artifacts / doit_db.LEGACY_FILE_NAME).unlink(missing_ok=True)  # the JSON database of earlier versions
    for top, dirs, files in os.walk(artifacts):
        if Path(top) == artifacts:
            dirs[:] = [d for d in dirs if d != layout.cache_dir.name]
        for name in files:
            if ATOMIC_TEMP.match(name):
                try:
                    os.unlink(os.path.join(top, name))
                except OSError:
                    pass


def _inside(path: Path, directory: Path) -> bool:
    try:
        path.relative_to(directory)
        return True
    except ValueError:
        return False
