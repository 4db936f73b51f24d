"""etforge's doit runners: the run lifecycle around every run, and workers whose death is a failure.

etforge's ``run`` command (etforge.engine.run_command) picks these runners instead of
doit's, bound to the run's :class:`~etforge.engine.lifecycle.RunLifecycle`.

Every runner: ``run_all`` takes the run lock and cleans up after killed runs
(``RunLifecycle.begin``); ``finish`` closes doit's database without a
traceback, lets the reporter display, then ``RunLifecycle.end`` decides the
exit status from the state records and writes summary.json.

Worker death (``-n N -P process``): doit's MRunner shares one job queue and
one result queue between all workers and blocks on ``result_q.get()``; a
worker killed by the OOM killer or aborted by native code (``terminate called
...``) never answers, and if it dies holding a queue's lock every other worker
wedges too. :class:`WorkerRunner` gives each worker its own pipe instead, so
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

from doit.exceptions import TaskError, TaskFailed
from doit.runner import ERROR, FAILURE, SUCCESS, JobTask, JobTaskPickle, MRunner
from doit.task import DelayedLoaded

from etforge.core.console import say
from etforge.engine import runlock
from etforge.engine.lifecycle import RunLifecycle

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
# Workers are forks of the main process (which has not imported torch): they share its
# tasks without pickling them, as doit's MRunner does on Linux, on macOS too (where
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
    base = WorkerRunner if workers else OneWorkerRunner
    return type(f"Etforge{base.__name__}", (LifecycleMixin, base), {"lifecycle": lifecycle})


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


class LifecycleMixin:
    """Lock and cleanup before the first task, the exit status after the last."""

    lifecycle: RunLifecycle  # bound by runner_classes()

    def run_all(self, task_dispatcher):
        self.ran, self.touched = set(), set()  # names: executed / considered in this run
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
    def __init__(self, runner: WorkerRunner):
        self.conn, child_conn = FORK.Pipe(duplex=True)
        self.process = FORK.Process(
            target=runner.worker_main, args=(child_conn, os.getpid(), runner.reporter.__class__)
        )
        self.process.start()
        child_conn.close()  # only the worker writes to its end: its death closes the pipe
        self.node = None  # the ExecNode it is running


HOLD = "hold on"  # what doit's dispatcher yields when every ready task waits for a running one


class WorkerRunner(MRunner):
    """doit's MRunner with one pipe per worker and a wait that sees worker deaths."""

    def run_tasks(self, task_dispatcher):
        self._run_tasks_init(task_dispatcher)
        workers: list = []
        completed: list = []  # nodes finished since the dispatcher was last told
        exhausted = False
        try:
            while True:
                if not exhausted and not self._stop_running:
                    exhausted = self._hand_out(workers, completed)
                busy = [w for w in workers if w.node is not None]
                if not busy:
                    break  # done, stopped, or (a cycle doit already refuses) nothing can run
                ready = wait([w.conn for w in busy] + [w.process.sentinel for w in busy])
                for worker in busy:
                    if worker.conn in ready or worker.process.sentinel in ready:
                        self._read(worker, workers, completed)
        except BaseException:
            for worker in workers:
                worker.process.terminate()
            raise
        for worker in workers:
            try:
                worker.conn.send(None)  # run teardown, then exit
            except OSError:
                pass
        for worker in workers:
            self._drain_reports(worker)
            worker.process.join()

    def _next_node(self, completed_node):
        """The next task to run (doit's get_next_job without queues), HOLD, or None when done."""
        node = completed_node
        while True:
            try:
                node = self.task_dispatcher.generator.send(node)
            except StopIteration:
                return None
            if node == HOLD:
                return HOLD
            if self.select_task(node, self.tasks):
                return node
            # up to date, ignored or blocked: processed already, tell the dispatcher

    def _hand_out(self, workers: list, completed: list) -> bool:
        """Tell the dispatcher what finished and give every free slot a task; True once all are handed out."""
        while True:
            if sum(1 for w in workers if w.node is not None) >= self.num_process:
                return False  # (each finished task freed a slot, so `completed` is empty here)
            node = self._next_node(completed.pop() if completed else None)
            if node is None:
                return True
            if node == HOLD:
                if completed:
                    continue
                return False
            if self._done_here(node, completed):
                continue
            self._start(node, workers)

    def _done_here(self, node, completed: list) -> bool:
        """A group task (``export``: every export:* task) runs nothing: done here, as doit's
        sequential runner does, rather than handed to a worker (a no-op run forked one for it)."""
        if node.task.actions or node.task.teardown:
            return False
        self.process_task_result(node, self.execute_task(node.task))
        completed.append(node)
        return True

    def _start(self, node, workers: list) -> None:
        task = node.task
        if task.loader is DelayedLoaded:
            job = JobTask(task)
        else:
            job = JobTaskPickle(task)
        while True:
            worker = next((w for w in workers if w.node is None), None)
            if worker is not None and not worker.process.is_alive():  # died while idle
                workers.remove(worker)
                worker.conn.close()
                continue
            if worker is None:
                worker = _Worker(self)
                workers.append(worker)
            try:
                worker.conn.send(job)
            except OSError:  # died just now: try another
                workers.remove(worker)
                worker.conn.close()
                continue
            worker.node = node
            return

    def _read(self, worker: _Worker, workers: list, completed: list) -> None:
        while worker.node is not None:
            try:
                if not worker.conn.poll():
                    break
                message = worker.conn.recv()
            except (EOFError, OSError, pickle.UnpicklingError):
                break  # the worker is gone (or died mid-message): handled below
            if "exit" in message:
                raise message["exit"](message["exception"])
            node = self.task_dispatcher.nodes[message["name"]]
            if "reporter" in message:
                getattr(self.reporter, message["reporter"])(node.task)
                continue
            self._process_result(node, node.task, message)
            worker.node = None
            completed.append(node)
        if worker.node is not None and not worker.process.is_alive():
            worker.process.join()
            node, worker.node = worker.node, None
            workers.remove(worker)
            worker.conn.close()
            self._worker_died(worker.process, node)
            completed.append(node)

    def _worker_died(self, process, node) -> None:
        task = node.task
        reason = f"worker process {process.pid} {describe_exit(process.exitcode)} while running it"
        if self.lifecycle.record_worker_death(task.name, reason):
            # The state record says failed (so the run exits 1); like any failed task it
            # returns success to doit, so that its dependents run and say they are blocked.
            self.process_task_result(node, None)
        else:
            self.process_task_result(node, TaskFailed(f"{task.name}: {reason}"))

    def _drain_reports(self, worker: _Worker) -> None:
        """Teardown reports sent by a worker on its way out."""
        try:
            while worker.conn.poll(5):
                message = worker.conn.recv()
                if "reporter" in message:
                    getattr(self.reporter, message["reporter"])(self.tasks[message["name"]])
        except (EOFError, OSError, pickle.UnpicklingError):
            pass
        worker.conn.close()

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


class OneWorkerRunner(WorkerRunner):
    """A sequential run: doit's Runner arguments, one worker process."""

    def __init__(self, dep_manager, reporter, continue_=False, always_execute=False, stream=None):
        super().__init__(
            dep_manager, reporter, continue_=continue_, always_execute=always_execute, stream=stream, num_process=1
        )
