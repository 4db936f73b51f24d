"""Task specs from the stage table: which tasks exist for a selection, their keys and their files.

spec_of(plan, "export", cell)               one task's TaskSpec (a cell stands for its model too)
cell_specs(plan, cell, host)                every task whose record a cell's outcome reads, in order
run_specs(plan, cells, host)                every task of a selection: (name -> spec, name -> cell)
subjects(plan, stage, cells)                the subjects a stage has tasks for
cells_of_tasks(plan, task_names, cells)     the cells those tasks belong to
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from etforge.core.errors import BadValue, BuildError
from etforge.pipeline.keys import inputs_of, key_of
from etforge.pipeline.layout import layout_of
from etforge.pipeline.stages import STAGE, STAGES, Stage, holds, subject_of, task_name, upstream_of


@dataclass(frozen=True)
class TaskSpec:
    """One task of one stage for one subject: its key and where its record, outputs and log go."""

    name: str  # the doit task name, e.g. export:linreg/xnnpack/fp32
    key: str | None  # None: a matrix-wide task whose key is known only once the cells ran
    outputs: dict  # blob name -> working-tree Path, or None to keep it in the store only
    state_file: Path
    log_file: Path
    keep_entry: bool = False  # other tasks read this task's store entry: up to date only while it is there
    judges: TaskSpec | None = None  # the export whose program.pte this task's verdict is about
    # the named inputs of ``key`` (etforge.pipeline.keys.inputs_of): its record keeps them (explain)
    inputs: dict | None = field(default=None, compare=False, repr=False)

    @property
    def store_key(self) -> str:
        """The key its store entry is under (a matrix-wide task has one once its content is known)."""
        if self.key is None:
            raise BadValue(f"{self.name} has no key before its content is known")
        return self.key


def _stage(stage) -> Stage:
    return STAGE[stage] if isinstance(stage, str) else stage


def spec_of(plan, stage, subject=None, host: dict | None = None, key: str | None = None) -> TaskSpec:
    """The TaskSpec of ``stage`` (a Stage or its name) for ``subject`` (a Cell; for a model stage its
    ModelSpec or any of its cells). A matrix-wide stage's key is given (``key``) or None."""
    stage = _stage(stage)
    layout = layout_of(plan)
    if stage.subject == "pipeline":
        name = task_name(stage)
        outputs = {blob: layout.output(where, None, blob) for blob, where, *_ in stage.outputs}
        return TaskSpec(
            name=name, key=key, outputs=outputs, state_file=layout.state_file(name), log_file=layout.log_path(name)
        )
    if stage.subject == "model" and hasattr(subject, "model"):
        subject = subject.model
    name = task_name(stage, subject)
    # Memoised per plan by task name: a no-op run asks for each spec many times (the up-to-date
    # checks, then every reader of the cells' outcomes), and building one is mostly Path joins.
    memo = plan.memo.setdefault("specs", {})
    found = memo.get((name, id(stage)))
    if "host" in stage.key_inputs:  # its key is the host's too: kept with (a copy of) that host
        if found is None or found[0] != host:
            spec = _spec(plan, stage, subject, host, name, layout)
            found = memo[(name, id(stage))] = (dict(host) if host is not None else None, spec)
        return found[1]
    if found is None:
        found = memo[(name, id(stage))] = _spec(plan, stage, subject, host, name, layout)
    return found


def _spec(plan, stage: Stage, subject, host, name: str, layout) -> TaskSpec:
    outputs = {}
    for blob, where, *when in stage.outputs:
        if when and not holds(when[0], plan, subject):
            continue
        outputs[blob] = None if where is None else layout.output(where, subject, blob)
    judges = None
    if stage.judges:
        judged, judged_subject = next(
            (up, s) for rel, up, s in upstream_of(plan, stage, subject) if rel == stage.judges
        )
        judges = spec_of(plan, judged, judged_subject, host)
    return TaskSpec(
        name=name,
        key=key_of(plan, stage, subject, host),
        outputs=outputs,
        state_file=layout.state_file(name),
        log_file=layout.log_path(name),
        keep_entry=stage.keep_entry,
        judges=judges,
        inputs=inputs_of(plan, stage, subject, host),
    )


def applies(plan, stage, cell, selected: frozenset | None = None) -> bool:
    """Whether ``stage`` has a task for ``cell`` (``selected``: the names of this run's cells, None: any)."""
    return holds(_stage(stage).applies, plan, cell, selected)


def subjects(plan, stage, cells) -> list:
    """The subjects ``stage`` has a task for among ``cells``, one per task name, in plan order.

    Cells that share a quantize task must share its key: two configs under one name are a bug.
    """
    stage = _stage(stage)
    if stage.subject == "pipeline":
        return [None]
    cells = tuple(cells)
    names = frozenset(c.name for c in cells)
    unique: dict = {}
    for cell in cells:
        if not applies(plan, stage, cell, names):
            continue
        subject = subject_of(stage, cell)
        first = unique.setdefault(task_name(stage, subject), subject)
        if (
            stage.subject == "graph"
            and first is not subject
            and key_of(plan, stage, first, fresh=True) != key_of(plan, stage, subject, fresh=True)
        ):
            raise BuildError(f"{task_name(stage, subject)} names two quantizer configs ({first.name}, {cell.name})")
    return list(unique.values())


def cell_specs(plan, cell, host: dict | None = None) -> list:
    """The specs of every task whose record decides ``cell``'s outcome, in pipeline order
    (benchmarks only with ``host``)."""
    out = []
    for stage in STAGES:
        if stage.subject == "pipeline" or not applies(plan, stage, cell):
            continue
        if "host" in stage.key_inputs and host is None:
            continue
        out.append(spec_of(plan, stage, subject_of(stage, cell), host))
    return out


def run_specs(plan, cells, host: dict) -> tuple[dict, dict]:
    """(task name -> TaskSpec, task name -> Cell) of every task of ``cells`` that keeps a record
    (the cell tasks map to their cell; capture and quantize tasks belong to several)."""
    specs, cells_by_task = {}, {}
    cells = tuple(cells)
    for stage in STAGES:
        if stage.subject == "pipeline":
            specs[stage.name] = spec_of(plan, stage)  # its key depends on what the run builds
            continue
        for subject in subjects(plan, stage, cells):
            spec = spec_of(plan, stage, subject, host)
            specs[spec.name] = spec
            if stage.subject == "cell":
                cells_by_task[spec.name] = subject
    return specs, cells_by_task


def cells_of_tasks(plan, task_names, cells=None) -> tuple:
    """The cells (of ``cells``, default all) that the named tasks belong to, in plan order:
    a capture belongs to every cell of its model, a quantize task to the cells that lower its graph."""
    names = set(task_names)
    pool = plan.cells if cells is None else tuple(cells)
    out = []
    for cell in pool:
        own = {
            task_name(stage, subject_of(stage, cell))
            for stage in STAGES
            if stage.subject != "pipeline" and (stage.subject != "graph" or cell.transform is not None)
        }
        if own & names:
            out.append(cell)
    return tuple(out)
