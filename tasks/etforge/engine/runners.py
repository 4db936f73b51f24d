"""etforge's doit runners: the run lifecycle around every run, and workers whose death is a failure.

etforge's ``run`` command (etforge.engine.run_command) picks these runners instead of
doit's, bound to the run's :class:`~etforge.engine.lifecycle.RunLifecycle`.

Every runner: ``run_all`` takes the run lock and cleans up after killed runs
(``RunLifecycle.begin``); ``finish`` closes doit's database without a
traceback, lets the reporter display, then ``RunLifecycle.end`` decides the
exit status from the state records and writes summary.json.

One dispatch loop (:class:`DispatchRunner`, on doit's public Runner interface) hands
ready tasks to a placement: forked workers whose death fails only their task
(etforge.engine.workers ProcessPlacement: ``-P process``, and a sequential run) or a
cluster's workers (etforge.engine.cluster, ``-P dask``).

A sequential run (no ``-n``) is the same runner with one worker: a model's code
that calls ``os._exit``, aborts in native code or dies of a file-size limit then
fails its own task instead of ending the run (with exit status 0, as ``os._exit(0)``
did in-process). ``-P thread`` is refused: two ``torch.export`` calls in one
process at once fail, and a task's log is a process-wide ``dup2`` of stdout/stderr.
"""

from __future__ import annotations

from typing import Protocol

from doit.exceptions import TaskFailed
from doit.runner import ERROR, FAILURE, SUCCESS, Runner

from etforge.core.console import say
from etforge.engine import runlock
from etforge.engine.lifecycle import RunLifecycle

RUNNER_NAMES = ("process", "dask")  # -P: forked worker processes, or a Dask cluster (etforge.engine.cluster)


def runner_class(
    lifecycle: RunLifecycle, workers: int, parallel_type: str, scheduler: str | None = None, cluster_runner=None
):
    """The runner class for ``-n workers -P parallel_type``, bound to this run's lifecycle.

    ``cluster_runner(lifecycle, scheduler)``: the class of ``-P dask`` (etforge.engine.cluster,
    handed in by the run command: it builds on this module's runners)."""
    if workers and parallel_type == "thread":
        return ThreadsRefused
    if parallel_type not in RUNNER_NAMES + ("thread",):
        message = f"etforge: error: -P {parallel_type}: no such runner; use {' or '.join(RUNNER_NAMES)}"
        return type("UnknownRunner", (ThreadsRefused,), {"THREADS_REFUSED": message})
    if parallel_type == "dask":
        return cluster_runner(lifecycle, scheduler)
    base = DispatchRunner if workers else OneWorkerRunner
    return type(f"Etforge{base.__name__}", (base,), {"lifecycle": lifecycle})


USAGE_ERROR = 3  # doit's code for an error before any task runs


class ThreadsRefused:
    """``-P thread``: refused with one line before anything runs (see the module docstring)."""

    THREADS_REFUSED = (
        "etforge: error: -P thread is not supported (torch.export is not thread-safe and each "
        "task's log is a process-wide redirect); use -P process"
    )

    def __init__(self, *args, **kwargs):
        pass

    def run_all(self, task_dispatcher) -> int:
        say(self.THREADS_REFUSED)
        return USAGE_ERROR


HOLD = "hold on"  # what doit's dispatcher yields when every ready task waits for a running one
Finished = tuple  # (ExecNode, doit failure or None): a task that ended, its result already on its Task


class Placement(Protocol):
    """Where a dispatch loop's tasks run: forked worker processes, or a cluster's workers."""

    def has_room(self) -> bool:
        """Another task may be started now."""
        ...

    def start(self, node) -> None:
        """Run ``node``'s task (or park it, or fail it at once: finished() then says so)."""
        ...

    def busy(self) -> bool:
        """A task is running or waiting to run."""
        ...

    def finished(self) -> list:
        """The tasks that ended since the last call, each (node, failure): waits for one when
        none has (a placement may return none after a while, e.g. to look for lost workers)."""
        ...

    def close(self) -> None: ...


class DispatchRunner(Runner):
    """doit's Runner with one dispatch loop over a placement: what is ready goes where
    ``make_placement`` says, and what ends is told to doit's dispatcher. It reads only doit's
    public runner interface (select_task, execute_task, process_task_result, the dispatcher's
    generator, tasks and nodes): no runner state of doit's own."""

    lifecycle: (
        RunLifecycle  # bound by runner_class(): lock and cleanup before the first task, the exit status after the last
    )

    def __init__(self, dep_manager, reporter, continue_=False, always_execute=False, stream=None, num_process=1):
        super().__init__(dep_manager, reporter, continue_=continue_, always_execute=always_execute, stream=stream)
        self.num_process = max(1, num_process)
        self.halted = False  # the run was told to stop (e.g. the cluster is out of reach)
        self.final_result: int = SUCCESS  # (doit's Runner sets it; typed here)
        self.ran: set = set()  # names: executed in this run
        self.touched: set = set()  # names: considered in this run

    def run_all(self, task_dispatcher):
        lock = None
        try:
            try:
                lock = self.lifecycle.begin()
            except OSError as exc:
                say(f"etforge: error: cannot take the run lock: {exc}")
                return ERROR
            return super().run_all(task_dispatcher)  # (its finish() runs even when interrupted)
        except KeyboardInterrupt:
            say("etforge: interrupted; the next run finishes the job")
            return 130  # the shell's code for SIGINT, instead of doit's traceback
        finally:
            if lock is not None:
                runlock.release(lock)

    def select_task(self, node, tasks_dict):
        self.touched.add(node.task.name)
        return super().select_task(node, tasks_dict)

    def process_task_result(self, node, base_fail):
        self.ran.add(node.task.name)
        super().process_task_result(node, base_fail)

    def finish(self):
        db_ok = self.lifecycle.close_database(self.dep_manager)
        self.teardown()
        self.reporter.complete_run()  # display only
        failed = self.lifecycle.end(self.ran, self.touched)
        if (failed or not db_ok) and self.final_result == SUCCESS:
            # Failed tasks returned success to doit so that their dependents still ran
            # (and said why they could not); the run as a whole still fails.
            self.final_result = FAILURE
        return self.final_result

    def make_placement(self) -> Placement:
        from etforge.engine.workers import ProcessPlacement

        return ProcessPlacement(self)

    @property
    def stopping(self) -> bool:
        """No task is handed out any more: halted, or a task failed and the run does not continue."""
        return self.halted or (not self.continue_ and self.final_result != SUCCESS)

    def halt(self, result: int) -> None:
        self.final_result = result
        self.halted = True

    def run_tasks(self, task_dispatcher):
        self.dispatcher, self.tasks = task_dispatcher, task_dispatcher.tasks
        placement = self.make_placement()
        completed: list = []  # nodes finished since the dispatcher was last told
        exhausted = False
        try:
            while True:
                if not exhausted and not self.stopping:
                    exhausted = self._hand_out(placement, completed)
                if not placement.busy():
                    if completed and not exhausted and not self.stopping:
                        continue  # tell the dispatcher: it may release more tasks
                    break  # done, stopped, or (a cycle doit already refuses) nothing can run
                for node, failure in placement.finished():
                    self.process_task_result(node, failure)
                    completed.append(node)
        finally:
            placement.close()

    def _next_node(self, completed_node):
        """The next task to run (doit's get_next_job without queues), HOLD, or None when done."""
        node = completed_node
        while True:
            try:
                node = self.dispatcher.generator.send(node)
            except StopIteration:
                return None
            if node == HOLD:
                return HOLD
            if self.select_task(node, self.tasks):
                return node
            # up to date, ignored or blocked: processed already, tell the dispatcher

    def _hand_out(self, placement: Placement, completed: list) -> bool:
        """Tell the dispatcher what finished and start every task there is room for; True once all are handed out."""
        while placement.has_room():
            node = self._next_node(completed.pop() if completed else None)
            if node is None:
                return True
            if node == HOLD:
                if completed:
                    continue
                return False
            if self._done_here(node, completed):
                continue
            placement.start(node)
            if self.stopping:
                return True
        return False

    def _done_here(self, node, completed: list) -> bool:
        """A group task (``export``: every export:* task) runs nothing: done here, as doit's
        sequential runner does, rather than placed (a no-op run forked a worker for it)."""
        if node.task.actions or node.task.teardown:
            return False
        self.process_task_result(node, self.execute_task(node.task))
        completed.append(node)
        return True

    def lost(self, node, reason: str) -> Finished:
        """A task that could not finish where it ran (its worker died, the cluster lost it): failed in
        its record (so the run exits 1 and, returning success to doit, its dependents say blocked),
        or for doit when it has no record to write."""
        if self.lifecycle.record_worker_death(node.task.name, reason):
            return node, None
        return node, TaskFailed(f"{node.task.name}: {reason}")


class OneWorkerRunner(DispatchRunner):
    """A sequential run: doit's Runner arguments, one worker process."""

    def __init__(self, dep_manager, reporter, continue_=False, always_execute=False, stream=None):
        super().__init__(
            dep_manager, reporter, continue_=continue_, always_execute=always_execute, stream=stream, num_process=1
        )
