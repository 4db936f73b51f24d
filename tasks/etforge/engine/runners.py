"""etforge's doit runners: the run lifecycle around every run, and workers whose death is a failure.

etforge's ``run`` command (etforge.engine.run_command) picks these runners instead of
doit's, bound to the run's :class:`~etforge.engine.lifecycle.RunLifecycle`.

Every runner: ``run_all`` takes the run lock and cleans up after killed runs
(``RunLifecycle.begin``); ``finish`` closes doit's database without a
traceback, lets the reporter display, then ``RunLifecycle.end`` decides the
exit status from the state records and writes summary.json.

One dispatch loop (:class:`DispatchRunner`, on doit's public Runner interface) hands
ready tasks to a placement: :class:`ProcessPlacement` (forked workers, ``-P process``,
and a sequential run) or the cluster's (etforge.engine.cluster, ``-P dask``).

Worker death (``-n N -P process``): doit's MRunner shares one job queue and
one result queue between all workers and blocks on ``result_q.get()``; a
worker killed by the OOM killer or aborted by native code (``terminate called
...``) never answers, and if it dies holding a queue's lock every other worker
wedges too. :class:`ProcessPlacement` gives each worker its own pipe instead, so
the main process knows which task each worker holds, and waits on the pipes
*and* the process sentinels: a worker that dies fails the task it was running
(reason with the signal or exit code, written to the task's state record),
a fresh worker replaces it on the next job, and the run goes on. Workers ask
the kernel to kill them when the main process dies (``PR_SET_PDEATHSIG``).

A sequential run (no ``-n``) is the same runner with one worker: a model's code
that calls ``os._exit``, aborts in native code or dies of a file-size limit then
fails its own task instead of ending the run (with exit status 0, as ``os._exit(0)``
did in-process). ``-P thread`` is refused: two ``torch.export`` calls in one
process at once fail, and a task's log is a process-wide ``dup2`` of stdout/stderr.
"""

from __future__ import annotations

import os
import pickle
import resource
import signal
import sys
from multiprocessing import get_context
from multiprocessing.connection import wait
from typing import Protocol

from doit.exceptions import TaskError, TaskFailed
from doit.runner import ERROR, FAILURE, SUCCESS, JobTask, JobTaskPickle, Runner
from doit.task import DelayedLoaded

from etforge.core.console import say
from etforge.engine import runlock
from etforge.engine.lifecycle import RunLifecycle

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
# Workers are forks of the main process (which has not imported torch): they share its
# tasks without pickling them, as doit's own process runner does on Linux, on macOS too (where
# the default would be spawn, which cannot pickle the runner classes made below).
FORK = get_context("fork")


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


def die_with_parent(parent_pid: int) -> None:
    """Have the kernel SIGKILL this process when its parent dies (Linux; a no-op elsewhere)."""
    if sys.platform.startswith("linux"):
        try:
            import ctypes  # (here: only a worker needs it, and importing it costs a no-op run ~5 ms)

            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
        except (OSError, AttributeError):
            pass
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os._exit(1)


def describe_exit(exitcode: int | None) -> str:
    if exitcode is not None and exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        hint = {
            "SIGKILL": " (the OOM killer, or kill -9)",
            "SIGABRT": " (aborted by native code, e.g. `terminate called ...`)",
            "SIGSEGV": " (a crash in native code)",
            "SIGXFSZ": " (the file-size limit)",
        }.get(name, "")
        if name in ("SIGABRT", "SIGXFSZ") and _file_size_limit() is not None:
            # torch's file writer aborts when a write fails with EFBIG
            hint = f" (a file-size limit of {_file_size_limit()} bytes is set: `ulimit -f`)"
        return f"was killed by {name}{hint}"
    if exitcode == 0:
        return "exited with code 0 (the task's code called os._exit)"
    return f"exited with code {exitcode}"


def _file_size_limit() -> int | None:
    soft, _ = resource.getrlimit(resource.RLIMIT_FSIZE)
    return None if soft == resource.RLIM_INFINITY else soft


class _PipeReporter:
    """A worker's reporter: forwards each call to the main process (doit's MReporter, over a pipe)."""

    def __init__(self, conn, reporter_cls):
        self.conn = conn
        self.reporter_cls = reporter_cls

    def __getattr__(self, method_name):
        if not hasattr(self.reporter_cls, method_name):
            raise AttributeError(method_name)

        def forward(task):
            self.conn.send({"name": task.name, "reporter": method_name})

        return forward

    def complete_run(self):
        pass


class _Worker:
    def __init__(self, runner: DispatchRunner):
        self.conn, child_conn = FORK.Pipe(duplex=True)
        self.process = FORK.Process(
            target=runner.worker_main, args=(child_conn, os.getpid(), runner.reporter.__class__)
        )
        self.process.start()
        child_conn.close()  # only the worker writes to its end: its death closes the pipe
        self.node = None  # the ExecNode it is running


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

    def worker_main(self, conn, parent_pid: int, reporter_cls) -> None:
        """A worker process: run the tasks sent down the pipe until told to stop."""
        die_with_parent(parent_pid)
        self.reporter = _PipeReporter(conn, reporter_cls)
        try:
            while True:
                job = conn.recv()
                if job is None:
                    self.teardown()
                    return
                if job.type is JobTaskPickle.type:
                    task = self.tasks[job.name]
                    task.update_from_pickle(job.task_dict)
                else:
                    task = pickle.loads(job.task_pickle)
                result = {"name": task.name}
                try:
                    failure = self.execute_task(task)
                except SystemExit as exc:  # the task's code exited: its failure, not the run's
                    failure = TaskError(f"{task.name}: its code called sys.exit({exc.code!r})")
                if failure:
                    result["failure"] = failure
                result["task"] = task.pickle_safe_dict()
                result["out"] = [action.out for action in task.actions]
                result["err"] = [action.err for action in task.actions]
                conn.send(result)
        except (SystemExit, KeyboardInterrupt, Exception) as exc:
            try:  # as doit's worker does: the main process re-raises it
                conn.send({"exit": exc.__class__, "exception": str(exc)})
            except OSError:
                pass


class ProcessPlacement:
    """Forked worker processes, one pipe each (see the module docstring): a worker that dies fails
    the task it held, and a fresh one replaces it on the next job."""

    def __init__(self, runner: DispatchRunner):
        self.runner = runner
        self.workers: list = []

    def has_room(self) -> bool:
        return sum(1 for w in self.workers if w.node is not None) < self.runner.num_process

    def busy(self) -> bool:
        return any(w.node is not None for w in self.workers)

    def start(self, node) -> None:
        task = node.task
        job = JobTask(task) if task.loader is DelayedLoaded else JobTaskPickle(task)
        while True:
            worker = next((w for w in self.workers if w.node is None), None)
            if worker is not None and not worker.process.is_alive():  # died while idle
                self.workers.remove(worker)
                worker.conn.close()
                continue
            if worker is None:
                worker = _Worker(self.runner)
                self.workers.append(worker)
            try:
                worker.conn.send(job)
            except OSError:  # died just now: try another
                self.workers.remove(worker)
                worker.conn.close()
                continue
            worker.node = node
            return

    def finished(self) -> list:
        busy = [w for w in self.workers if w.node is not None]
        ready = wait([w.conn for w in busy] + [w.process.sentinel for w in busy])
        out: list = []
        for worker in busy:
            if worker.conn in ready or worker.process.sentinel in ready:
                out += self._read(worker)
        return out

    def _read(self, worker: _Worker) -> list:
        out: list = []
        while worker.node is not None:
            try:
                if not worker.conn.poll():
                    break
                message = worker.conn.recv()
            except (EOFError, OSError, pickle.UnpicklingError):
                break  # the worker is gone (or died mid-message): handled below
            if "exit" in message:
                raise message["exit"](message["exception"])
            node = self.runner.dispatcher.nodes[message["name"]]
            if "reporter" in message:
                getattr(self.runner.reporter, message["reporter"])(node.task)
                continue
            task = node.task
            task.update_from_pickle(message["task"])
            for action, out_text, err_text in zip(task.actions, message["out"], message["err"]):
                action.out, action.err = out_text, err_text
            out.append((node, message.get("failure")))
            worker.node = None
        if worker.node is not None and not worker.process.is_alive():
            worker.process.join()
            node, worker.node = worker.node, None
            self.workers.remove(worker)
            worker.conn.close()
            reason = f"worker process {worker.process.pid} {describe_exit(worker.process.exitcode)} while running it"
            out.append(self.runner.lost(node, reason))
        return out

    def close(self) -> None:
        for worker in self.workers:
            if worker.node is not None:  # interrupted: nothing it runs is wanted
                worker.process.terminate()
        for worker in self.workers:
            try:
                worker.conn.send(None)  # run teardown, then exit
            except OSError:
                pass
        for worker in self.workers:
            self._drain_reports(worker)
            worker.process.join()

    def _drain_reports(self, worker: _Worker) -> None:
        """Teardown reports sent by a worker on its way out."""
        try:
            while worker.conn.poll(5):
                message = worker.conn.recv()
                if "reporter" in message:
                    getattr(self.runner.reporter, message["reporter"])(self.runner.tasks[message["name"]])
        except (EOFError, OSError, pickle.UnpicklingError):
            pass
        worker.conn.close()


class OneWorkerRunner(DispatchRunner):
    """A sequential run: doit's Runner arguments, one worker process."""

    def __init__(self, dep_manager, reporter, continue_=False, always_execute=False, stream=None):
        super().__init__(
            dep_manager, reporter, continue_=continue_, always_execute=always_execute, stream=stream, num_process=1
        )
