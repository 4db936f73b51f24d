"""etforge's doit task loader: the tasks of a pipeline.yaml, and of an optional dodo.py beside it.

One implementation for both entry points: the ``etforge`` command hands it to doit's
``DoitMain`` (etforge.app.cli), and ``doit`` uses it in a repository whose pyproject.toml
names it (``[tool.doit] loader = "etforge"``, as this one does). It is the composition
root of a run: it resolves the plan (etforge.engine.entry), makes the task creators, and
wires publishing into the engine: the run lifecycle gets the exit status
(etforge.publish.exit_status) and the run command the reporter (etforge.publish.progress),
so that the engine never imports publishing.

A project's own ``dodo.py`` (``-f``) adds its task creators and DOIT_CONFIG beside
etforge's: your own doit tasks (upload a release, build docs) next to the pipeline's.
"""

from __future__ import annotations

import gc
import os
from pathlib import Path

from doit import get_var
from doit.cmd_base import NamespaceTaskLoader
from doit.loader import load_doit_config

from etforge.cache.records import RunRecords
from etforge.config.selection import pipeline_path
from etforge.core.console import say
from etforge.engine.entry import REPORTER, Request, doit_config, load_selection, task_creators
from etforge.engine.lifecycle import RunLifecycle
from etforge.engine.run_command import RunSession
from etforge.pipeline.stages import DEFAULT_TABLE, STAGES, StageTable
from etforge.publish.exit_status import ExitStatus
from etforge.publish.outcome_memo import RunOutcomes
from etforge.publish.progress import EtforgeReporter, RunView

# The selection flags, as doit command-line options (they appear in every command's --help).
# Plural names: doit's own --backend picks its database backend.
SELECTION_OPTIONS = (
    {
        "section": "etforge",
        "name": "pipeline",
        "short": "",
        "long": "pipeline",
        "type": str,
        "default": None,
        "env_var": "ETFORGE_PIPELINE",
        "help": "the pipeline file [default: pipeline.yaml in the current directory]",
    },
    {
        "section": "etforge",
        "name": "models",
        "short": "",
        "long": "models",
        "type": str,
        "default": None,
        "help": "only the cells of these models (comma-separated names)",
    },
    {
        "section": "etforge",
        "name": "backends",
        "short": "",
        "long": "backends",
        "type": str,
        "default": None,
        "help": "only the cells of these backends (comma-separated names)",
    },
    {
        "section": "etforge",
        "name": "schemes",
        "short": "",
        "long": "schemes",
        "type": str,
        "default": None,
        "help": "only the cells of these quantization schemes (comma-separated names)",
    },
    {
        "section": "etforge",
        "name": "shard",
        "short": "",
        "long": "shard",
        "type": str,
        "default": None,
        "help": "k/n: a stable k-th of n parts of the cells, the same on every machine (CI shards)",
    },
    {
        "section": "etforge",
        "name": "cells",
        "short": "",
        "long": "cells",
        "type": str,
        "default": None,
        "help": "only these cells (comma-separated model/backend/scheme names: a CI job's list from `etforge ci-matrix`)",
    },
    {
        "section": "etforge",
        "name": "retry_failed",
        "short": "",
        "long": "retry-failed",
        "type": bool,
        "default": False,
        "help": "run declared expected failures again (matrix.expected_failures), not only when their key changed",
    },
    {
        "section": "etforge",
        "name": "dodo_file",
        "short": "f",
        "long": "file",
        "type": str,
        "default": "dodo.py",
        "env_var": "DOIT_FILE",
        "help": "a doit file of the project's own tasks and DOIT_CONFIG, loaded when it exists [default: %(default)s]",
    },
)
# The var=value forms of earlier releases (`doit export model=linreg`): flag -> the names it took.
DEPRECATED_VARS = {
    "pipeline": ("pipeline",),
    "models": ("model",),
    "backends": ("backend",),
    "schemes": ("quant", "quantization"),
    "shard": ("shard",),
}


def request_from(options: dict, workdir: str | None = None) -> tuple[Request, dict]:
    """(Request, stage option defaults) from parsed flags; a var=value form of an earlier release
    is taken too, with one deprecation line (a flag wins over it)."""
    values = {}
    for flag, names in DEPRECATED_VARS.items():
        values[flag] = options.get(flag)
        for name in names:
            value = get_var(name, None)
            if value is not None:
                _deprecated(f"{name}={value}", f"--{flag.replace('_', '-')} {value}")
                values[flag] = values[flag] or value
    defaults = {}
    for stage in STAGES:
        for name, _ in stage.matrix.options:
            value = get_var(name, None)
            if value is not None:
                _deprecated(f"{name}={value}", f"{stage.name} --{name.replace('_', '-')}")
                defaults[name] = value == "1"
    request = Request(
        pipeline=pipeline_path(values["pipeline"], workdir),
        model=values["models"],
        backend=values["backends"],
        quantization=values["schemes"],
        shard=values["shard"],
        cells=options.get("cells"),
        retry_failed=bool(options.get("retry_failed")),
    )
    return request, defaults


def _deprecated(old: str, new: str) -> None:
    say(f"etforge: warning: `{old}` is deprecated and goes away in the next release; use `{new}`")


class PipelineLoader(NamespaceTaskLoader):
    """doit's TaskLoader2 for a pipeline: ``setup`` reads the flags, ``load_doit_config`` resolves
    the plan (one error line and exit status 3 on a bad input), ``load_tasks`` makes the tasks."""

    cmd_options = SELECTION_OPTIONS

    def __init__(self, table: StageTable = DEFAULT_TABLE):
        super().__init__()
        self.table = table  # what builds each stage (etforge.app.cli main hands it in)
        self.session: RunSession | None = None  # read by etforge's run command
        self._options: dict = {}

    def setup(self, opt_values):
        self._options = dict(opt_values)

    # Planning allocates a few objects per task and frees almost none: the plan, its specs and keys,
    # doit's tasks live for the whole run. The cyclic garbage collector would rescan all of them on
    # every full collection, which made planning grow faster than the matrix (4.5x the time for 4x
    # the cells, measured with benchmarks/plan_scaling.py). So it is paused while the tasks are
    # made, and what they are is then frozen out of later collections (gc.freeze).
    def load_doit_config(self):
        gc.disable()
        try:
            return self._load_doit_config()
        except BaseException:
            gc.enable()
            raise

    def load_tasks(self, cmd, pos_args):
        try:
            return super().load_tasks(cmd, pos_args)
        finally:
            gc.freeze()
            gc.enable()

    def _load_doit_config(self):
        request, option_defaults = request_from(self._options)
        selection = load_selection(request, self.table)
        # every reader of the cells' outcomes (manifests, report, exit status, table) shares one memo,
        # and it shares the records it parses with the up-to-date checks
        records = RunRecords()
        outcomes = RunOutcomes(selection.plan, selection.host, records)
        view = RunView(selection.plan, selection.specs, selection.cells_by_task, selection.host, outcomes)
        judge = ExitStatus(selection.plan, selection.host, selection.specs, selection.cells_by_task, outcomes)
        self.session = RunSession(
            lifecycle=RunLifecycle(selection.layout, selection.specs, judge=judge.decide),
            make_reporter=lambda outstream, options: EtforgeReporter(outstream, options, view),
            reporter_name=REPORTER,
        )
        self.namespace = task_creators(selection, option_defaults, outcomes, records)
        config = doit_config(selection)
        dodo = _project_dodo(selection.plan.root, self._options.get("dodo_file"))
        if dodo is not None:
            self.namespace.update({k: v for k, v in dodo.items() if k.startswith("task_")})
            config.update(load_doit_config(dodo))
        return config


def _project_dodo(root: Path, name: str | None) -> dict | None:
    """The namespace of the project's doit file, when it exists (imported like doit imports one)."""
    if not name:
        return None
    path = Path(root, name)
    if not path.is_file():
        return None
    import importlib.util

    spec = importlib.util.spec_from_file_location("dodo", path)
    if spec is None or spec.loader is None:
        return None
    module = importlib.util.module_from_spec(spec)
    cwd = os.getcwd()
    try:
        spec.loader.exec_module(module)
    finally:
        os.chdir(cwd)  # a dodo file may change directory; the pipeline's paths are absolute anyway
    return vars(module)
