"""What dodo.py needs: find the pipeline file, resolve it, select cells, make the tasks, configure doit."""

from __future__ import annotations

import os
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from tasks.config.digest_cache import digest_cache_for
from tasks.config.machine import host_fingerprint
from tasks.config.model import Plan
from tasks.config.resolve import resolve
from tasks.config.selection import pipeline_path, select, shard
from tasks.core.console import say
from tasks.core.errors import PipelineError
from tasks.engine import doit_db
from tasks.engine.taskdicts import stage_tasks
from tasks.store.layout import ArtifactLayout, layout_of
from tasks.store.local import Store, open_store
from tasks.store.remote import RemoteError
from tasks.store.specs import run_specs
from tasks.store.stages import STAGES, Stage


@dataclass(frozen=True)
class Selection:
    plan: Plan
    cells: tuple  # the cells the command line selected
    store: Store
    host: dict  # tasks.config.machine.host_fingerprint(): benchmark results are only valid on it
    specs: dict  # task name -> TaskSpec of every task of the selection (tasks/store/specs.py run_specs)
    cells_by_task: dict  # task name -> the Cell it belongs to (cell tasks only)

    @property
    def layout(self) -> ArtifactLayout:
        return layout_of(self.plan)


def load_selection(get_var, initial_workdir: str | None = None) -> Selection:
    """Resolve the pipeline and the command-line sub-matrix, or exit with a one-line error.

    Exit code 3 is doit's own code for "error before task execution starts".
    """
    host = host_fingerprint()
    try:
        path = pipeline_path(get_var, initial_workdir)
        digests = digest_cache_for(path)
        plan = resolve(path, digests)
        cells = select(
            plan,
            model=get_var("model", None),
            backend=get_var("backend", None),
            quantization=get_var("quant", None) or get_var("quantization", None),
        )
        if get_var("shard", None):
            cells = shard(plan, cells, get_var("shard", None))
        ensure_writable(plan)
        specs, cells_by_task = run_specs(plan, cells, host)  # every key, so the digest memo holds their code
        for stage in STAGES:
            plan.code.of(stage.code)  # matrix-wide keys are computed later, after the memo is saved
        digests.save()  # only once everything checked out: a bad input writes nothing
    except PipelineError as exc:
        sys.stderr.write(f"etforge: error: {exc}\n")
        raise SystemExit(3) from None
    if not cells:
        sys.stderr.write("etforge: error: the command-line selection matches no cell of the matrix\n")
        raise SystemExit(3)
    try:
        store = open_store(plan)
    except RemoteError as exc:  # e.g. gs:// without gcsfs installed
        sys.stderr.write(f"etforge: error: {exc}\n")
        raise SystemExit(3) from None
    return Selection(plan=plan, cells=cells, store=store, host=host, specs=specs, cells_by_task=cells_by_task)


def ensure_writable(plan: Plan) -> None:
    """Fail now, naming the path, rather than halfway through a build."""
    check_links(plan)
    directory = layout_of(plan).artifacts_dir
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=directory, prefix=".write-test-"):
            pass
    except OSError as exc:
        raise PipelineError(f"cannot write to {exc.filename or directory}: {exc.strerror or exc}") from None


def check_links(plan: Plan) -> None:
    """Refuse to write through a symlink that dangles, or a directory symlink that leaves the project
    (unless the pipeline opts in).

    Checked: ``artifacts`` and ``artifacts/<pipeline>`` themselves and every entry directly in
    them, in ``artifacts/cache`` and in ``artifacts/.etforge`` (the directories etforge creates
    files in: a dangling link there made every task fail with ``FileExistsError``). A file
    symlink that resolves needs no check: atomic writes replace a link rather than write through it.
    """
    root = plan.root.resolve()
    layout = layout_of(plan)
    candidates = [layout.artifacts_dir, layout.out_dir]
    for directory in (layout.artifacts_dir, layout.out_dir, layout.cache_dir, layout.etforge_dir):
        try:
            candidates += [Path(e.path) for e in os.scandir(directory) if e.is_symlink()]
        except OSError:
            pass  # not there yet (or not a directory: ensure_writable says so)
    for link in dict.fromkeys(candidates):
        if not link.is_symlink():
            continue
        target = os.readlink(link)
        if not link.exists():
            raise PipelineError(
                f"{link} is a symlink to {target}, which does not exist: create that directory or remove the link"
            )
        if not link.is_dir():
            continue
        try:
            link.resolve().relative_to(root)
        except ValueError:
            if not plan.artifacts_allow_outside:
                raise PipelineError(
                    f"{link} is a symlink to {target}, outside the project directory {root}: "
                    "etforge does not write through it (set `artifacts: {allow_outside: true}` "
                    f"in {plan.display} to follow it)"
                ) from None


def stage_options(stage: Stage, get_var) -> dict:
    """The stage's command-line flags (``doit release allow_failures=1``) as booleans."""
    return {name: get_var(name, "0") == "1" for name in stage.options}


def task_creator(selection: Selection, stage: Stage, get_var):
    """A doit task creator (``task_<stage>`` in dodo.py) yielding the stage's task dicts."""

    def create():
        yield from stage_tasks(
            selection.plan, stage, selection.cells, selection.store, selection.host, stage_options(stage, get_var)
        )

    create.__doc__ = stage.doc
    create.__name__ = f"task_{stage.name}"
    return create


def doit_config(selection: Selection, reporter) -> dict:
    """DOIT_CONFIG: ``reporter`` is the display (tasks/publish/progress.py), chosen by dodo.py."""
    database = doit_db.database_path(selection.layout.artifacts_dir)
    try:
        warning = doit_db.prepare(database)  # before doit opens it
    except doit_db.DatabaseUnwritable as exc:
        sys.stderr.write(f"etforge: error: {exc}\n")
        raise SystemExit(3) from None
    if warning:
        say(warning)
    return {
        "default_tasks": [s.name for s in STAGES if s.default],
        "continue": True,  # one failing cell never stops the others
        "dep_file": str(database),
        "backend": doit_db.BACKEND,
        "reporter": reporter,
        "verbosity": 2,
    }
