"""What dodo.py needs: find the pipeline file, resolve it, select cells, configure doit."""

from __future__ import annotations

import os
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from tasks.engine import doit_db
from tasks.engine import taskdicts as doit_tasks
from tasks.store.local import Store
from tasks.core.errors import PipelineError
from tasks.config.machine import host_fingerprint
from tasks.core.console import say
from tasks.engine.lifecycle import RunLifecycle, task_specs
from tasks.store.remote import RemoteError
from tasks.config.model import Plan
from tasks.config.resolve import digest_cache_for, resolve
from tasks.config.selection import pipeline_path, select, shard
from tasks.publish.progress import make_reporter



@dataclass(frozen=True)
class Selection:
    plan: Plan
    cells: tuple
    store: Store
    host: dict  # tasks.config.machine.host_fingerprint(): benchmark results are only valid on it


def load_selection(get_var, initial_workdir: str | None = None) -> Selection:
    """Resolve the pipeline and the command-line sub-matrix, or exit with a one-line error.

    Exit code 3 is doit's own code for "error before task execution starts".
    """
    try:
        path = pipeline_path(get_var, initial_workdir)
        digests = digest_cache_for(path)
        plan = resolve(path, digests)
        cells = select(plan, model=get_var("model", None), backend=get_var("backend", None),
                       quantization=get_var("quant", None) or get_var("quantization", None))
        if get_var("shard", None):
            cells = shard(plan, cells, get_var("shard", None))
        ensure_writable(plan)
        digests.save()  # only once everything checked out: a bad input writes nothing
    except PipelineError as exc:
        sys.stderr.write(f"etforge: error: {exc}\n")
        raise SystemExit(3) from None
    if not cells:
        sys.stderr.write("etforge: error: the command-line selection matches no cell of the matrix\n")
        raise SystemExit(3)
    try:
        store = doit_tasks.plan_store(plan)
    except RemoteError as exc:  # e.g. gs:// without gcsfs installed
        sys.stderr.write(f"etforge: error: {exc}\n")
        raise SystemExit(3) from None
    return Selection(plan=plan, cells=cells, store=store, host=host_fingerprint())


def ensure_writable(plan: Plan) -> None:
    """Fail now, naming the path, rather than halfway through a build."""
    check_links(plan)
    directory = plan.artifacts_dir
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=directory, prefix=".write-test-"):
            pass
    except OSError as exc:
        raise PipelineError(f"cannot write to {exc.filename or directory}: {exc.strerror or exc}") from None


def check_links(plan: Plan) -> None:
    """Refuse to write through a directory symlink that leaves the project (unless the pipeline opts in).

    Checked: ``artifacts``, ``artifacts/<pipeline>`` and every directory directly in
    them (``cache``, ``release``, ``.etforge``, model dirs, ``.state``, ``logs``,
    ``manifests``). File symlinks need no check: atomic writes replace a link rather
    than write through it.
    """
    root = plan.root.resolve()
    candidates = [plan.artifacts_dir, plan.out_dir]
    for directory in (plan.artifacts_dir, plan.out_dir):
        try:
            candidates += [Path(e.path) for e in os.scandir(directory) if e.is_symlink() and e.is_dir()]
        except OSError:
            pass  # not there yet (or not a directory: ensure_writable says so)
    for link in candidates:
        if not link.is_symlink():
            continue
        target = os.readlink(link)
        if not link.exists():
            raise PipelineError(f"{link} is a symlink to {target}, which does not exist: "
                                "create that directory or remove the link")
        try:
            link.resolve().relative_to(root)
        except ValueError:
            if not plan.artifacts_allow_outside:
                raise PipelineError(f"{link} is a symlink to {target}, outside the project directory {root}: "
                                    "etforge does not write through it (set `artifacts: {allow_outside: true}` "
                                    f"in {plan.display} to follow it)") from None


def run_lifecycle(selection: Selection) -> RunLifecycle:
    specs, cells_by_task = task_specs(selection.plan, selection.cells, selection.host)
    return RunLifecycle(plan=selection.plan, host=selection.host, specs=specs, cells_by_task=cells_by_task)


def doit_config(selection: Selection, lifecycle: RunLifecycle) -> dict:
    plan = selection.plan
    database = doit_db.database_path(plan.artifacts_dir)
    try:
        warning = doit_db.prepare(database)  # before doit opens it
    except doit_db.DatabaseUnwritable as exc:
        sys.stderr.write(f"etforge: error: {exc}\n")
        raise SystemExit(3) from None
    if warning:
        say(warning)
    return {
        "default_tasks": ["export", "sizegate", "validate", "benchmark", "manifest", "report"],
        "continue": True,  # one failing cell never stops the others
        "dep_file": str(database),
        "backend": doit_db.BACKEND,
        "reporter": make_reporter(plan, lifecycle.specs, lifecycle.cells_by_task, selection.host),
        "verbosity": 2,
    }
