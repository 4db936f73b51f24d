"""etforge's ``run`` command: doit's, with etforge's runners and its reporter bound to the run.

Registered as doit's ``run`` command plugin (etforge.app.cli DOIT_PLUGINS, and
pyproject.toml's ``[tool.doit.plugins.COMMAND]`` for ``doit`` in this repository).
doit's own ``Run._execute`` picks its runner classes from module globals; this
subclass picks :func:`~etforge.engine.runners.runner_class` instead, bound to the
lifecycle the loader made for this run (its ``session``), and builds etforge's
reporter with the run's plan. Everything else (task selection, ``-a``, ``-s``,
``-r json``) is doit's.
"""

from __future__ import annotations

import codecs
from collections.abc import Callable
from dataclasses import dataclass

from doit.cmd_base import TaskLoader2
from doit.cmd_run import Run as DoitRun
from doit.cmd_run import opt_parallel_type
from doit.control import TaskControl
from doit.exceptions import InvalidCommand
from doit.task import Stream

from etforge.engine.lifecycle import RunLifecycle
from etforge.engine.runners import runner_class


def dask_runner(lifecycle: RunLifecycle, scheduler: str | None):
    from etforge.engine.cluster import bound_runner  # (cloudpickle; Dask itself only when it connects)

    return bound_runner(lifecycle, scheduler)


PARALLEL_TYPE = {
    **opt_parallel_type,
    "help": (
        "how -n workers run tasks: 'process' (the default: worker processes, each importing torch once; a "
        "worker that dies fails its task) ['thread' is refused: torch.export is not thread-safe]; 'dask': "
        "a Dask cluster (--scheduler, else a local one of -n workers; docs/cluster.md)"
    ),
}


@dataclass(frozen=True)
class RunSession:
    """What the run command needs of one invocation, made by the loader (its ``session``)."""

    lifecycle: RunLifecycle
    # (outstream, options) -> etforge's reporter bound to this run's plan (etforge.publish.progress)
    make_reporter: Callable
    reporter_name: str  # the name it is registered under as a doit REPORTER plugin


def session_of(loader: TaskLoader2) -> RunSession:
    session = getattr(loader, "session", None)
    if not isinstance(session, RunSession):
        raise InvalidCommand(
            "etforge's run command needs etforge's task loader (pyproject.toml: [tool.doit] loader = \"etforge\")"
        )
    return session


SCHEDULER = {
    "name": "scheduler",
    "long": "scheduler",
    "type": str,
    "default": None,
    "env_var": "ETFORGE_SCHEDULER",
    "help": "with -P dask: the Dask scheduler's address (tcp://host:8786) [default: a local cluster of -n workers]",
}


class Run(DoitRun):
    doc_purpose = "run tasks (default: every stage of the pipeline but release)"
    cmd_options = tuple(PARALLEL_TYPE if o["name"] == "par_type" else o for o in DoitRun.cmd_options) + (SCHEDULER,)

    def _execute(
        self,
        outfile,
        verbosity=None,
        always=False,
        continue_=False,
        reporter="console",
        num_process=0,
        par_type="process",
        single=False,
        auto_delayed_regex=False,
        force_verbosity=False,
        failure_verbosity=0,
        pdb=False,
        scheduler=None,
    ):
        session = session_of(self.loader)
        self.control = TaskControl(self.task_list, auto_delayed_regex=auto_delayed_regex)
        self.control.process(self.sel_tasks)
        if single:  # as doit's: run the selected tasks without their dependencies
            for task_name in self.control.selected_tasks:
                task = self.control.tasks[task_name]
                for each in [self.control.tasks[n] for n in task.task_dep] if task.has_subtask else [task]:
                    each.task_dep = []
        outstream = codecs.open(outfile, "w", encoding="utf-8") if isinstance(outfile, str) else outfile
        self.outstream = outstream
        try:
            options = {"failure_verbosity": failure_verbosity, "num_process": num_process}  # workers: the time left
            if reporter == session.reporter_name:
                reporter_obj = session.make_reporter(outstream, options)
            else:
                reporter_obj = self.reporters[reporter](outstream, options)
            runner = runner_class(session.lifecycle, num_process, par_type, scheduler, dask_runner)(
                self.dep_manager,
                reporter_obj,
                continue_,
                always,
                Stream(verbosity, force_verbosity),
                *([num_process] if num_process else []),
            )
            return runner.run_all(self.control.task_dispatcher())
        finally:
            if isinstance(outfile, str):
                outstream.close()
