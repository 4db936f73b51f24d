"""doit reporter: a timestamped start/finish line per task, then the summary table.

On a terminal, one more line stays at the bottom and is kept current: tasks done of those to
run, cells finished, elapsed time and the time left from recorded durations
(etforge.publish.progress_line). Off a terminal the lines are plain and parseable, as ever.

Display only: the run lock and cleanup belong to etforge.engine.lifecycle,
summary.json and the exit status to etforge.publish.exit_status, so they hold
with any reporter (``--reporter json``).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

from doit.cmd_base import tasks_and_deps_iter
from doit.reporter import ConsoleReporter

from etforge.cache.durations import recorded_durations
from etforge.cache.records import read_state
from etforge.config.model import Plan
from etforge.pipeline.results import TaskStatus
from etforge.pipeline.specs import cells_of_tasks
from etforge.publish import summary
from etforge.publish.outcome_memo import RunOutcomes
from etforge.publish.progress_line import LiveLine, Progress

EXPECTED_FAILURE = "expected-failure"  # a failure matrix.expected_failures declares: never shown as FAILED
# Every word the status column shows; the column is as wide as the longest.
STATES = ("start", "done", "FAILED", "not run", EXPECTED_FAILURE, *(str(s) for s in TaskStatus if s != "failed"))
WIDTH = max(map(len, STATES))


@dataclass(frozen=True)
class RunView:
    """What the reporter reads: the plan, task name -> TaskSpec (whose record a finish line reads),
    task name -> Cell, the host fingerprint (benchmark rows) and the run's outcomes (each cell
    decided once per run; default: decided for the table)."""

    plan: Plan
    specs: dict
    cells_by_task: dict
    host: dict
    outcomes: RunOutcomes | None = None


class EtforgeReporter(ConsoleReporter):
    """doit's console reporter with a timestamped start/finish line per task and the summary table.

    Registered as a doit REPORTER plugin; etforge's run command instantiates it with the
    run's :class:`RunView` (``--reporter json`` and the others stay doit's)."""

    desc = "etforge: progress lines and a summary table"

    def __init__(self, outstream, options, view: RunView | None = None):
        super().__init__(outstream, options)
        self.view = view
        self.started: dict = {}
        self.touched_cells: dict = {}
        self.executed = 0
        self.up_to_date = 0
        self.workers = max(1, int(options.get("num_process") or 0))
        self.live: LiveLine | None = None

    def initialize(self, tasks, selected_tasks):
        """On a terminal, start the progress line over the tasks this run may execute."""
        if self.view is None or not _is_terminal(self.outstream):
            return
        # the selection and what it depends on: what this run may execute
        reachable = tasks_and_deps_iter(tasks, [n for n in selected_tasks or tasks if n in tasks])
        names = list(dict.fromkeys(t.name for t in reachable if t.actions and t.name in self._specs))
        cells = self.view.cells_by_task
        progress = Progress(
            tasks={n: (cells[n].name if n in cells else None) for n in names},
            durations=recorded_durations({n: self._specs[n] for n in names}),
            workers=self.workers,
        )
        self.live = LiveLine(self.outstream, progress)

    def _line(self, text: str) -> None:
        line = f"[{time.strftime('%H:%M:%S')}] {text}"
        if self.live is not None:
            self.live.print(line)
            return
        self.write(line + "\n")
        self.outstream.flush()

    def _seen(self, task, started: bool = False) -> None:
        if self.live is None:
            return
        if started:
            self.live.progress.start(task.name)
        else:
            self.live.progress.finish(task.name)
        self.live.refresh()

    def _touch(self, task) -> None:
        cell = (self.view.cells_by_task if self.view else {}).get(task.name)
        if cell is not None:
            self.touched_cells[cell.name] = cell

    def execute_task(self, task):
        if task.actions and not task.name.startswith("_"):
            self.started[task.name] = time.monotonic()
            self.executed += 1
            self._touch(task)
            self._line(f"{'start':<{WIDTH}} {task.name}")
            self._seen(task, started=True)

    def _finish_line(self, task, failed_exc=None):
        elapsed = time.monotonic() - self.started.get(task.name, time.monotonic())
        record = read_state(self._specs[task.name].state_file) if task.name in self._specs else None
        failed = "FAILED" if not self._declared_failure(task) else EXPECTED_FAILURE
        if record is None or failed_exc is not None:  # (a record that could not be written is stale)
            status = failed if failed_exc else "done"
            note = failed_exc.get_msg().strip().splitlines()[-1] if failed_exc else ""
        else:
            status = {"ok": "ok", "failed": failed}.get(record["status"], record["status"])
            note = "restored from cache" if record.get("cached") else ""
            if record.get("reason"):
                note = record["reason"]
            if record["status"] == "failed" and record.get("log"):
                note += f"  (log: {record['log']})"
        self._line(f"{status:<{WIDTH}} {task.name}  {elapsed:.1f}s  {note}".rstrip())

    def _declared_failure(self, task) -> bool:
        """Whether every cell the task belongs to is named by ``matrix.expected_failures``."""
        plan = self.view.plan if self.view else None
        if not isinstance(plan, Plan) or not plan.expected_failures:
            return False
        cells = cells_of_tasks(plan, [task.name])
        return bool(cells) and all(plan.expected_failure(c) is not None for c in cells)

    def add_success(self, task):
        if task.name in self.started:
            self._finish_line(task)
        self._seen(task)

    def add_failure(self, task, fail):
        self._touch(task)
        if task.name in self.started:
            self._finish_line(task, fail)
        elif task.name in self._specs:  # never started: a dependency failed
            self._line(f"{'not run':<{WIDTH}} {task.name}  ({fail.get_msg().strip().splitlines()[-1]})")
        self._seen(task)

    def skip_uptodate(self, task):
        self.up_to_date += 1
        self._touch(task)
        self._seen(task)

    def skip_ignore(self, task):
        self._touch(task)
        self._seen(task)

    def complete_run(self):
        if self.live is not None:  # the line goes; the table follows the last task line
            self.live.stop()
            self.live = None
        if self.runtime_errors:
            super().complete_run()
        self._write_table()
        self.outstream.flush()

    @property
    def _specs(self) -> dict:
        return self.view.specs if self.view else {}

    def _write_table(self):
        if self.view is None:
            return
        plan = self.view.plan
        run = self.view.outcomes or RunOutcomes(plan, self.view.host)
        results = run.outcomes([c for c in plan.cells if c.name in self.touched_cells])
        if not results:
            return
        self.write(f"\n{plan.name}: {self.executed} task(s) run, {self.up_to_date} up to date\n")
        self.write(summary.render(summary.table(plan, results)) + "\n")


def _is_terminal(stream) -> bool:
    """A person watching: a TTY, not CI (CI runners often give a pseudo-terminal), not TERM=dumb."""
    isatty = getattr(stream, "isatty", None)
    if not (callable(isatty) and isatty()):
        return False
    return not os.environ.get("CI") and os.environ.get("TERM") != "dumb"
