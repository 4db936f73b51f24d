"""The run's exit status and summary.json: the judge the run lifecycle is handed (etforge.app.loader).

After the last task, :meth:`ExitStatus.decide` takes the outcomes of the cells
the run touched (etforge.publish.outcome), writes summary.json, says which
cells pass unexpectedly and which fail, and returns True when the run failed.
:func:`run_failures` is the one rule for what fails a run.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from etforge.cache.records import read_state
from etforge.config.model import Plan
from etforge.core.atomic import atomic_write_text
from etforge.core.console import say
from etforge.pipeline.layout import layout_of
from etforge.pipeline.specs import cells_of_tasks
from etforge.pipeline.stages import is_cell_task
from etforge.publish import outcome, summary
from etforge.publish.outcome_memo import RunOutcomes


@dataclass(frozen=True)
class ExitStatus:
    plan: Plan
    host: dict  # etforge.config.machine.host_fingerprint(): benchmark rows are read for it
    specs: dict  # task name -> TaskSpec (etforge.pipeline.specs run_specs)
    cells_by_task: dict  # task name -> the Cell it belongs to (cell tasks only)
    run: RunOutcomes | None = None  # the run's outcomes, each cell decided once (default: decided here)

    def decide(self, ran: set, touched: set) -> bool:
        """Write summary.json, say what failed; True when the run failed."""
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
        run = self.run or RunOutcomes(self.plan, self.host)
        return run.outcomes(touched_cells(self.plan, self.cells_by_task, task_names))

    def write_summary(self, results: list) -> bool:
        if not results:
            return True
        path = layout_of(self.plan).summary_path
        try:
            atomic_write_text(path, json.dumps(summary.table(self.plan, results), indent=2) + "\n")
        except OSError as exc:
            say(f"etforge: error: cannot write {path}: {exc.strerror or exc}; the next run writes it")
            return False
        return True


def run_failures(plan: Plan, specs: dict, ran, results: list) -> list:
    """What fails this run (non-zero exit when not empty); the one rule for the exit status.

    - every cell whose outcome fails the run (failed, unexpectedly-passing), except
      those a release run in this invocation packed around with ``--allow-failures``;
    - every pipeline-wide task run here (manifest, report, release) whose record
      says failed; a record with another key is an earlier run's and never counts.
    """
    accepted = set()
    if "release" in ran:
        from etforge.publish import release  # tarfile, gzip: not imported by a run that packs nothing

        accepted = release.accepted_failures(plan)
    failed = [o.cell for o in outcome.failing(results) if o.cell not in accepted]
    for name in sorted(ran):
        spec = specs.get(name)
        if spec is None or is_cell_task(name):
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
    names.update(c.name for c in cells_of_tasks(plan, [t for t in task_names if t not in cells_by_task], selected))
    return [c for c in plan.cells if c.name in names]
