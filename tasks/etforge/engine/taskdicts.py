"""doit task dicts from the stage table (etforge.pipeline.stages), one function for every stage.

Building the dicts and checking ``uptodate`` only reads records and stats files;
task actions (etforge.engine.actions) import the builders, and the builders
import torch and executorch.

``task_dep``: a task waits for the tasks of its upstream relations, except when
it skips at once (``skip_if``) and so reads nothing; a matrix-wide task waits
for the tasks of the stages it lists in ``after``, for the selected cells.
"""

from __future__ import annotations

from functools import cache
from string import Formatter

from etforge.engine.actions import matrix_up_to_date, run_matrix_stage, run_stage, run_uncached
from etforge.engine.cached_run import is_up_to_date
from etforge.pipeline.layout import layout_of
from etforge.pipeline.specs import spec_of, subjects
from etforge.pipeline.stages import STAGE, Stage, StageTable, holds, needs_of, subject_of, task_name, upstream_of


def doc_fields(plan, stage: Stage, subject) -> dict:
    """What a task's ``task_doc`` may name; only the fields it does name are computed (a no-op run
    makes every task's doc, and most fields are paths made relative)."""
    layout = layout_of(plan)
    fields: dict = {
        "files": lambda: ", ".join(blob for blob, *_ in stage.outputs),
        "manifest_dir": lambda: layout.manifest_dir.relative_to(plan.root),
        "report": lambda: layout.report_path.relative_to(plan.root),
        "archive": lambda: layout.archive_path(f"{plan.name}-{plan.version}").relative_to(plan.root),
    }
    if stage.subject == "model":
        fields["model"] = lambda: subject.name
    elif subject is not None:
        cell = subject

        def sibling() -> str:
            found = plan.fp32_sibling(cell)
            return found.name if found else ""

        fields.update(
            model=lambda: cell.model.name,
            backend=lambda: cell.backend.name,
            scheme=lambda: cell.quant.name,
            cell=lambda: cell.name,
            pte=lambda: layout.pte_path(cell).name,
            sibling=sibling,
            method=lambda: getattr(cell.transform, "method", ""),
            ref=lambda: getattr(cell.transform, "ref", ""),
        )
    return {name: fields[name]() for name in _named(stage.task_doc) if name in fields}


@cache
def _named(template: str) -> tuple:
    """The field names a str.format template uses (``{cell.name}`` uses ``cell``)."""
    names = (name.split(".")[0].split("[")[0] for _, name, _, _ in Formatter().parse(template) if name)
    return tuple(dict.fromkeys(names))


def matrix_task_deps(plan, stage: Stage, cells) -> list:
    """The tasks a matrix-wide stage waits for: every task of its ``after`` stages for ``cells``."""
    deps = []
    for name in stage.matrix.after:
        after = STAGE[name]
        for subject in subjects(plan, after, cells):
            deps.append(task_name(after, subject))
    return list(dict.fromkeys(deps))


def _deps(plan, stage: Stage, subject) -> list:
    if any(holds(predicate, plan, subject) for predicate, _ in stage.skip_if):
        return []  # it skips without reading anything
    # dict.fromkeys: two relations may name one task (an fp32 cell's graph is its capture)
    return list(dict.fromkeys(task_name(up, up_subject) for _, up, up_subject in upstream_of(plan, stage, subject)))


def declared_failure(plan, stage: Stage, subject) -> bool:
    """Whether a failure of this task is declared expected: every cell of the plan it belongs to
    is named by ``matrix.expected_failures`` (a capture or quantize task serves several cells)."""
    if not plan.expected_failures:
        return False
    if stage.subject == "cell":
        return plan.expected_failure(subject) is not None
    served = plan.memo.get(("served", stage.name))
    if served is None:  # task name -> the cells it serves, made once per stage (linear in cells)
        found: dict[str, list] = {}
        for c in plan.cells:
            if stage.subject == "model" or c.transform is not None:
                found.setdefault(task_name(stage, subject_of(stage, c)), []).append(c)
        served = plan.memo[("served", stage.name)] = found
    mine = served.get(task_name(stage, subject), [])
    return bool(mine) and all(plan.expected_failure(c) is not None for c in mine)


def replay_of(plan, stage: Stage, subject, host: dict) -> tuple | None:
    """``is_up_to_date``'s ``replay``: the upstream specs of a task whose failure is declared, else None."""
    if not declared_failure(plan, stage, subject):
        return None
    return tuple(spec_of(plan, up, up_subject, host) for _, up, up_subject in upstream_of(plan, stage, subject))


def stage_tasks(
    plan,
    table: StageTable,
    stage: Stage,
    cells,
    store,
    host: dict,
    options: dict | None = None,
    retry_failed: bool = False,
    outcomes=None,
    records=None,
) -> list:
    """Every doit task dict of ``stage`` for the selected ``cells``, run with the builders of ``table``
    (``retry_failed``: declared
    expected failures run again too, instead of replaying their recorded failure; ``outcomes``:
    the run's memo of cell outcomes, handed to a matrix-wide stage's content, etforge.engine.actions;
    ``records``: the run's parsed records, etforge.cache.records RunRecords, for the up-to-date checks)."""
    if stage.subject == "pipeline":
        return [_matrix_task(plan, table, stage, cells, store, host, options or {}, outcomes)]
    tasks = []
    for subject in subjects(plan, stage, cells):
        spec = spec_of(plan, stage, subject, host)
        replay = None if retry_failed else replay_of(plan, stage, subject, host)
        basename, sub = spec.name.split(":", 1)
        tasks.append(
            {
                "basename": basename,
                "name": sub,
                "doc": stage.task_doc.format(**doc_fields(plan, stage, subject)),
                "actions": [(run_stage, [plan, table, stage.name, subject, store, host])],
                "uptodate": [(is_up_to_date, [spec, store], {"replay": replay, "records": records})],
                "task_dep": list(dict.fromkeys(_deps(plan, stage, subject))),
                "verbosity": 2,  # builders send their own output to the task's log file
                "meta": {"etforge": {"needs": sorted(needs_of(stage, subject))}},  # cluster routing
            }
        )
    return tasks


def _matrix_task(plan, table: StageTable, stage: Stage, cells, store, host: dict, options: dict, outcomes=None) -> dict:
    task = {
        "basename": stage.name,
        "doc": stage.task_doc.format(**doc_fields(plan, stage, None)),
        "task_dep": matrix_task_deps(plan, stage, cells),
        "verbosity": 2,
    }
    if stage.matrix.cached:
        task["actions"] = [(run_matrix_stage, [plan, table, stage.name, cells, store, host], {"outcomes": outcomes})]
        task["uptodate"] = [(matrix_up_to_date, [plan, stage.name, cells, store, host], {"outcomes": outcomes})]
    else:  # it re-checks its gates every time
        task["actions"] = [(run_uncached, [plan, table, stage.name, cells, host], {"outcomes": outcomes})]
        task["uptodate"] = [False]
        # doit task parameters: `etforge release --allow-failures` (doit hands them to the action)
        task["params"] = [
            {
                "name": name,
                "long": name.replace("_", "-"),
                "type": bool,
                "default": bool(options.get(name, False)),
                "help": text,
            }
            for name, text in stage.matrix.options
        ]
    return task
