"""doit reporter: a timestamped start/finish line per task, then the summary table."""

from __future__ import annotations

import json
import shutil
import time

from doit.reporter import ConsoleReporter

from tasks import outcome, runlock, summary
from tasks.atomic import atomic_write_text
from tasks.runner import read_state


def make_reporter(plan, state_files: dict, cells_by_task: dict, host: dict):
    """A ConsoleReporter subclass bound to this plan (doit instantiates it)."""

    class EtforgeReporter(ConsoleReporter):
        desc = "etforge: progress lines and a summary table"

        def __init__(self, outstream, options):
            super().__init__(outstream, options)
            self.started: dict = {}
            self.touched_cells: dict = {}
            self.executed = 0
            self.up_to_date = 0
            self.failed: list = []
            self.release_accepts: set = set()  # failing cells a release packed around (allow_failures=1)

        def initialize(self, tasks, selected_tasks):
            # Only `doit run` reaches here (not `doit list`); held until the process exits.
            self.lock = runlock.acquire(plan.artifacts_dir / ".etforge" / "run.lock", self.outstream)
            # Holding the lock, nobody else is writing: scratch dirs left by a killed run go.
            shutil.rmtree(plan.cache_dir / "tmp", ignore_errors=True)

        def _line(self, text: str) -> None:
            self.write(f"[{time.strftime('%H:%M:%S')}] {text}\n")
            self.outstream.flush()

        def _touch(self, task) -> None:
            cell = cells_by_task.get(task.name)
            if cell is not None:
                self.touched_cells[cell.name] = cell

        def execute_task(self, task):
            if task.actions and not task.name.startswith("_"):
                self.started[task.name] = time.monotonic()
                self.executed += 1
                self._touch(task)
                self._line(f"start   {task.name}")

        def _finish_line(self, task, failed_exc=None):
            elapsed = time.monotonic() - self.started.get(task.name, time.monotonic())
            record = read_state(state_files[task.name]) if task.name in state_files else None
            if record is None:
                status = "FAILED" if failed_exc else "done"
                note = failed_exc.get_msg().strip().splitlines()[-1] if failed_exc else ""
            else:
                status = {"ok": "ok", "failed": "FAILED"}.get(record["status"], record["status"])
                if record["status"] == "failed":
                    self.failed.append(task.name)
                note = "restored from cache" if record.get("cached") else ""
                if record.get("reason"):
                    note = record["reason"]
                if record["status"] == "failed" and record.get("log"):
                    note += f"  (log: {record['log']})"
            self._line(f"{status:<7} {task.name}  {elapsed:.1f}s  {note}".rstrip())

        def add_success(self, task):
            if task.name in self.started:
                self._finish_line(task)
            if task.name == "release":
                from tasks.release import accepted_failures

                self.release_accepts = accepted_failures(plan)

        def add_failure(self, task, fail):
            self._touch(task)
            if task.name in self.started:
                self._finish_line(task, fail)
            elif task.name in state_files:  # never started: a dependency failed
                self._line(f"not run {task.name}  ({fail.get_msg().strip().splitlines()[-1]})")

        def skip_uptodate(self, task):
            self.up_to_date += 1
            self._touch(task)

        def skip_ignore(self, task):
            self._touch(task)

        def complete_run(self):
            if self.runtime_errors:
                super().complete_run()
            results = self._outcomes()
            self._write_summary(results)
            # Failed tasks returned success to doit so their dependents still ran (and said
            # why they could not); the cells' outcomes decide whether the run fails.
            failing = [o for o in outcome.failing(results) if o.cell not in self.release_accepts]
            other = [t for t in self.failed if not outcome.is_cell_task(t)]
            for o in failing:
                if o.status == "unexpectedly-passing":
                    self.write(f"etforge: {o.cell} is unexpectedly passing: {o.reason}\n")
            if failing or other:
                parts = [f"{len(failing)} cell(s) failing"] if failing else []
                parts += [f"{len(other)} task(s) failed ({', '.join(other)})"] if other else []
                self.write(f"etforge: {'; '.join(parts)}\n")
                self.outstream.flush()
                raise SystemExit(1)

        def _outcomes(self) -> list:
            """Outcomes of the cells this run touched, and of those a failed task belongs to."""
            selected = {c.name: c for c in cells_by_task.values()}
            names = set(self.touched_cells)
            names.update(c.name for c in outcome.cells_of_tasks(plan, self.failed, selected.values()))
            return outcome.outcomes(plan, [c for c in plan.cells if c.name in names], host)

        def _write_summary(self, results: list):
            if not results:
                return
            rows = summary.rows(plan, results)
            models = {r.cell.split("/")[0] for r in results}
            rows += [summary.rejected_row(r) for r in plan.rejected if r.model in models]
            self.write(f"\n{plan.name}: {self.executed} task(s) run, {self.up_to_date} up to date\n")
            self.write(summary.render(rows) + "\n")
            try:
                atomic_write_text(plan.out_dir / "summary.json", json.dumps(rows, indent=2) + "\n")
            except OSError as exc:
                self.write(f"etforge: cannot write {plan.out_dir / 'summary.json'}: {exc}\n")

    return EtforgeReporter
