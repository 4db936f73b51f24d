"""What etforge's doit loader needs: resolve the pipeline, select cells, make the tasks, configure doit.

The loader (etforge.app.loader) turns the command line into a :class:`Request`; everything
here is the same for the ``etforge`` command and for ``doit`` in a repository whose
pyproject.toml names etforge's loader.
"""

from __future__ import annotations

import os
import re
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from etforge.cache.opening import open_store
from etforge.cache.remote import RemoteError
from etforge.cache.store import Store
from etforge.config.digest_cache import digest_cache_for
from etforge.config.machine import host_fingerprint
from etforge.config.model import Plan
from etforge.config.resolve import resolve
from etforge.config.selection import named, select, shard
from etforge.core.console import say
from etforge.core.errors import PipelineError
from etforge.engine import doit_db
from etforge.engine.taskdicts import stage_tasks
from etforge.pipeline.layout import ArtifactLayout, layout_of
from etforge.pipeline.specs import run_specs
from etforge.pipeline.stages import DEFAULT_TABLE, STAGES, Stage, StageTable

REPORTER = "etforge"  # the name etforge's reporter is registered under (etforge.app.cli DOIT_PLUGINS)


@dataclass(frozen=True)
class Request:
    """What a command line asks for: the pipeline file and a sub-matrix (comma-separated names)."""

    pipeline: Path
    model: str | None = None
    backend: str | None = None
    quantization: str | None = None
    shard: str | None = None  # k/n
    cells: str | None = None  # exact cell names (a CI job's list from `etforge ci-matrix`)
    retry_failed: bool = False  # run declared expected failures again, whatever their records say


@dataclass(frozen=True)
class Selection:
    plan: Plan
    cells: tuple  # the cells the command line selected
    store: Store
    host: dict  # etforge.config.machine.host_fingerprint(): benchmark results are only valid on it
    specs: dict  # task name -> TaskSpec of every task of the selection (etforge.pipeline.specs run_specs)
    cells_by_task: dict  # task name -> the Cell it belongs to (cell tasks only)
    retry_failed: bool = False  # Request.retry_failed
    table: StageTable = DEFAULT_TABLE  # what builds each stage (tests hand in fakes)

    @property
    def layout(self) -> ArtifactLayout:
        return layout_of(self.plan)


def load_selection(request: Request, table: StageTable = DEFAULT_TABLE) -> Selection:
    """Resolve the pipeline and the command-line sub-matrix, or exit with a one-line error; the
    selection's tasks run the builders of ``table``.

    Exit code 3 is doit's own code for "error before task execution starts".
    """
    host = host_fingerprint()
    try:
        digests = digest_cache_for(request.pipeline)
        plan = resolve(request.pipeline, digests)
        cells = select(plan, model=request.model, backend=request.backend, quantization=request.quantization)
        if request.shard:
            cells = shard(plan, cells, request.shard)
        if request.cells:
            cells = named(plan, cells, request.cells)
        ensure_writable(plan)
        specs, cells_by_task = run_specs(plan, cells, host)  # every key, so the digest memo holds their code
        for stage in STAGES:  # matrix-wide keys are computed later, after the memo is saved
            plan.code.etforge.of(stage.code)
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
    return Selection(
        plan=plan,
        cells=cells,
        store=store,
        host=host,
        specs=specs,
        cells_by_task=cells_by_task,
        retry_failed=request.retry_failed,
        table=table,
    )


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


# A store prefix directory, artifacts/cache/<k[:2]>: what is in it are entries (etforge.cache.store).
STORE_PREFIX = re.compile(r"[0-9a-f]{2}")


def check_links(plan: Plan) -> None:
    """Refuse to run when a symlink anywhere under ``artifacts/`` dangles, or leads out of the
    project directory (unless the pipeline opts in), naming the first one found.

    Every kind of link counts: a dangling one where etforge makes a directory wedged every run
    (``FileExistsError``), and etforge appends to lock and bookkeeping files in place, which
    follows a link to a file. A link to a directory (in the project, or out of it when allowed)
    is followed, and what is there is checked the same way.

    Complete: etforge writes under ``artifacts/`` only, and this walks every directory there but
    the inside of a store entry (``cache/<k[:2]>/<k>/``), which etforge never writes into: it
    installs an entry by renaming a whole staged directory onto its place, discards one by
    renaming it away, and reading one refuses a link in it (etforge.cache.entries read_entry).
    The entries themselves are checked, as every directory's entries are.

    Cheap: one os.scandir per directory, whose entries know whether they are links or directories
    (no stat per file); only links are resolved. Skipping the entries' insides keeps it to a few
    hundred directories however big the store (22,000 files under artifacts/: about 8 ms).
    """
    root = plan.root.resolve()
    layout = layout_of(plan)
    start = str(layout.artifacts_dir)
    if os.path.islink(start) and _followed(start, root, plan) is None:
        return  # a link to a file: ensure_writable says so
    home = Path(os.path.realpath(start))
    cache = str(layout.cache_dir)
    todo, followed = [start], set()
    while todo:
        directory = todo.pop()
        in_store = os.path.dirname(directory) == cache and STORE_PREFIX.fullmatch(os.path.basename(directory))
        links = []
        try:
            with os.scandir(directory) as entries:
                for entry in entries:
                    if entry.is_symlink():
                        links.append(entry.path)
                    elif not in_store and entry.is_dir(follow_symlinks=False):
                        todo.append(entry.path)
        except OSError:
            continue  # not there yet, or not a directory: ensure_writable says so
        for link in links:
            target = _followed(link, root, plan)
            # (not into a directory that holds artifacts/: a loop, or the whole project)
            if target is not None and target not in followed and not home.is_relative_to(target):
                followed.add(target)
                todo.append(link)


def _followed(link: str, root: Path, plan: Plan) -> Path | None:
    """The directory ``link`` leads to (None: it leads to a file); PipelineError when it dangles, or
    leaves the project and the pipeline does not allow that."""
    target = os.readlink(link)
    resolved = Path(os.path.realpath(link))
    if not resolved.exists():
        raise PipelineError(
            f"{link} is a symlink to {target}, which does not exist: create that directory or remove the link"
        )
    if not plan.storage.allow_outside and not resolved.is_relative_to(root):
        raise PipelineError(
            f"{link} is a symlink to {target}, outside the project directory {root}: "
            "etforge does not write through it (set `artifacts: {allow_outside: true}` "
            f"in {plan.source.display} to follow it)"
        )
    return resolved if resolved.is_dir() else None


def task_creators(selection: Selection, option_defaults: dict, outcomes=None, records=None) -> dict:
    """``{"task_<stage>": creator}`` for every stage, in pipeline order (doit's task-creator namespace).

    ``option_defaults``: stage option name -> its default (``release --allow-failures``), for
    the deprecated ``allow_failures=1`` form; ``outcomes``: the run's memo of cell outcomes
    (publish's RunOutcomes, made by the loader), handed to the matrix-wide stages; ``records``: the
    run's parsed records (etforge.cache.records RunRecords) the up-to-date checks share with it."""

    def creator(stage: Stage):
        def create():
            yield from stage_tasks(
                selection.plan,
                selection.table,
                stage,
                selection.cells,
                selection.store,
                selection.host,
                option_defaults,
                retry_failed=selection.retry_failed,
                outcomes=outcomes,
                records=records,
            )

        create.__doc__ = stage.doc
        create.__name__ = f"task_{stage.name}"
        return create

    return {f"task_{stage.name}": creator(stage) for stage in STAGES}


def doit_config(selection: Selection) -> dict:
    """DOIT_CONFIG of a run: etforge's database backend and reporter (registered as doit plugins)."""
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
        "reporter": REPORTER,
        "verbosity": 2,
    }
