"""The run lifecycle: what happens before the first task and after the last, whatever the reporter.

    begin  take the run lock (tasks/runlock.py), then clean the scratch left by
           killed runs: build dirs in artifacts/cache/tmp, release staging dirs,
           temp files of interrupted atomic writes.
    end    write summary.json and decide the exit status (:func:`run_failures`, the
           one place that decides it): the outcomes of the cells this run touched
           (tasks/outcome.py) and the pipeline-wide tasks it ran.

tasks/doit_runner.py calls these from doit's runner, the only object every
``doit run`` creates whichever reporter (``-r json``, ``--reporter=...``) or
runner (``-n 2 -P process``) is used; the reporter only displays. Every line
goes to the process's real stderr (``sys.__stderr__``): doit's JSON reporter
swaps ``sys.stdout``/``sys.stderr`` for buffers and stdout must stay JSON.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from tasks.engine import doit_db
from tasks.engine import taskdicts as doit_tasks
from tasks.publish import outcome
from tasks.publish import release
from tasks.engine import runlock
from tasks.publish import summary
from tasks.core.atomic import atomic_write_text
from tasks.core.console import say
from tasks.config.model import Plan
from tasks.engine.cached_run import CachedTask, read_state, record_failure

# tempfile.mkstemp names of tasks/atomic.py: ".<target>.<8 random chars>.tmp"
ATOMIC_TEMP = re.compile(r"^\..+\.[a-z0-9_]{8}\.tmp$")


@dataclass(frozen=True)
class RunLifecycle:
    plan: Plan
    host: dict  # tasks.config.machine.host_fingerprint(): benchmark rows are read for it
    specs: dict  # task name -> CachedTask whose state record says how the task ended (key None: any key)
    cells_by_task: dict  # task name -> the Cell it belongs to (cell tasks only)

    @property
    def lock_file(self) -> Path:
        return self.plan.artifacts_dir / ".etforge" / "run.lock"

    def begin(self) -> runlock.RunLock:
        lock = runlock.acquire(self.lock_file, say)
        clean_scratch(self.plan)  # holding the lock, nobody else is writing
        return lock

    def close_database(self, dep_manager) -> bool:
        problem = doit_db.close(dep_manager, doit_db.database_path(self.plan.artifacts_dir))
        if problem:
            say(problem)
        return problem is None

    def end(self, ran: set, touched: set) -> bool:
        """After the last task: write summary.json, say what failed; True when the run failed."""
        results = self.outcomes(touched | set(ran))
        ok = self.write_summary(results)
        failures = run_failures(self.plan, self.specs, ran, results)
        for o in results:
            if o.status == "unexpectedly-passing":
                say(f"etforge: {o.cell} is unexpectedly passing: {o.reason}")
        if failures:
            listed = ", ".join(failures[:5]) + (f" (+{len(failures) - 5} more)" if len(failures) > 5 else "")
            say(f"etforge: {len(failures)} failing: {listed}")
        return bool(failures) or not ok

    def outcomes(self, task_names) -> list:
        """Outcomes of the cells the tasks belong to (a capture belongs to every cell of its model)."""
        return outcome.outcomes(self.plan, touched_cells(self.plan, self.cells_by_task, task_names), self.host)

    def write_summary(self, results: list) -> bool:
        if not results:
            return True
        path = self.plan.out_dir / "summary.json"
        try:
            atomic_write_text(path, json.dumps(summary_rows(self.plan, results), indent=2) + "\n")
        except OSError as exc:
            say(f"etforge: error: cannot write {path}: {exc.strerror or exc}; the next run writes it")
            return False
        return True

    def record_worker_death(self, task_name: str, reason: str) -> bool:
        """A worker died running ``task_name``: say so and fail the task in its state record.

        Returns False when the task keeps no state record (doit must fail it itself).
        """
        spec = self.specs.get(task_name)
        log = spec.log_file if spec is not None else self.plan.log_path(task_name)
        say(f"etforge: {task_name}: {reason} (log: {log})")
        if spec is None:
            return False
        try:
            record_failure(spec, reason)
        except OSError as exc:
            say(f"etforge: error: cannot write {spec.state_file}: {exc.strerror or exc}")
            return False
        return True


def run_failures(plan: Plan, specs: dict, ran, results: list) -> list:
    """What fails this run (non-zero exit when not empty); the one rule for the exit status.

    - every cell whose outcome fails the run (failed, unexpectedly-passing), except
      those a release run in this invocation packed around with ``allow_failures=1``;
    - every pipeline-wide task run here (manifest, report, release) whose state record
      says failed; a record with another key is an earlier run's and never counts.
    """
    accepted = release.accepted_failures(plan) if "release" in ran else set()
    failed = [o.cell for o in outcome.failing(results) if o.cell not in accepted]
    for name in sorted(ran):
        spec = specs.get(name)
        if spec is None or outcome.is_cell_task(name):
            continue  # cells are judged by their outcome; no record: doit's own result decides
        record = read_state(spec.state_file)
        if record is None or record.get("status") != "failed":
            continue
        if spec.key is not None and record.get("key") != spec.key:
            continue
        failed.append(name)
    return failed


def touched_cells(plan: Plan, cells_by_task: dict, task_names) -> list:
    """The selected cells that ``task_names`` belong to, in plan order."""
    selected = list({c.name: c for c in cells_by_task.values()}.values())
    names = {cells_by_task[t].name for t in task_names if t in cells_by_task}
    names.update(c.name for c in outcome.cells_of_tasks(plan, [t for t in task_names if t not in cells_by_task],
                                                        selected))
    return [c for c in plan.cells if c.name in names]


def summary_rows(plan: Plan, results: list) -> list:
    """The summary's rows: one per cell outcome, then the refused combinations of their models."""
    rows = summary.rows(plan, results)
    models = {o.cell.split("/")[0] for o in results}
    return rows + [summary.rejected_row(r) for r in plan.rejected if r.model in models]


def clean_scratch(plan: Plan) -> None:
    """Remove what killed runs left behind; call only while holding the run lock.

    Build dirs under the cache go only when the cache lives under the locked
    artifacts directory: a cache linked elsewhere (``artifacts: {allow_outside: true}``)
    may be shared with a checkout that is building right now.
    """
    artifacts = plan.artifacts_dir
    if _inside(plan.cache_dir.resolve(), artifacts.resolve()):
        shutil.rmtree(plan.cache_dir / "tmp", ignore_errors=True)
    release = artifacts / "release"
    if release.is_dir():
        for staging in release.glob(".release-*"):
            shutil.rmtree(staging, ignore_errors=True)
    (artifacts / doit_db.LEGACY_FILE_NAME).unlink(missing_ok=True)  # the JSON database of earlier versions
    for top, dirs, files in os.walk(artifacts):
        if Path(top) == artifacts:
            dirs[:] = [d for d in dirs if d != plan.cache_dir.name]
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


def task_specs(plan: Plan, cells, host: dict) -> tuple[dict, dict]:
    """(task name -> CachedTask, task name -> Cell) of every task of ``cells`` that keeps a state record."""
    specs, cells_by_task = {}, {}
    for cell in cells:
        for spec in (doit_tasks.export_spec(plan, cell), doit_tasks.validate_spec(plan, cell),
                     doit_tasks.benchmark_spec(plan, cell, host)):
            specs[spec.name] = spec
            cells_by_task[spec.name] = cell
        if cell.transform is not None:
            spec = doit_tasks.quantize_spec(plan, cell)
            specs[spec.name] = spec
        if plan.fp32_sibling(cell) in cells:
            spec = doit_tasks.size_gate_spec(plan, cell)
            specs[spec.name] = spec
            cells_by_task[spec.name] = cell
    for model in {c.model.name: c.model for c in cells}.values():
        spec = doit_tasks.capture_spec(plan, model)
        specs[spec.name] = spec
    for name in ("manifest", "report", "release"):  # their keys depend on what the run builds
        specs[name] = CachedTask(name=name, key=None, outputs={}, state_file=plan.state_dir / f"{name}.json",
                                 log_file=plan.log_path(name))
    return specs, cells_by_task
