"""Forked worker processes, the placement of ``-P process`` and of a sequential run (etforge.engine.runners).

doit's own process runner shares one job queue and one result queue between all workers and
blocks on ``result_q.get()``; a worker killed by the OOM killer or aborted by native code
(``terminate called ...``) never answers, and if it dies holding a queue's lock every other
worker wedges too. :class:`ProcessPlacement` gives each worker its own pipe instead, so the main
process knows which task each worker holds, and waits on the pipes *and* the process sentinels:
a worker that dies fails the task it was running (reason with the signal or exit code, written
to the task's state record), a fresh worker replaces it on the next job, and the run goes on.
Workers ask the kernel to kill them when the main process dies (``PR_SET_PDEATHSIG``).

``runner`` below is the run's DispatchRunner: its reporter, tasks, dispatcher, ``num_process``,
``execute_task``, ``teardown`` and ``lost``.
"""

from __future__ import annotations

import os
import pickle
import resource
import signal
import sys
from multiprocessing import get_context
from multiprocessing.connection import wait

from doit.exceptions import TaskError
from doit.runner import JobTask, JobTaskPickle
from doit.task import DelayedLoaded

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
# Workers are forks of the main process (which has not imported torch): they share its
# tasks without pickling them, as doit's own process runner does on Linux, on macOS too (where
# the default would be spawn, which cannot pickle the runner classes etforge.engine.runners makes).
FORK = get_context("fork")


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
    def __init__(self, runner):
        self.conn, child_conn = FORK.Pipe(duplex=True)
        self.process = FORK.Process(
            target=worker_main, args=(runner, child_conn, os.getpid(), runner.reporter.__class__)
        )
        self.process.start()
        child_conn.close()  # only the worker writes to its end: its death closes the pipe
        self.node = None  # the ExecNode it is running


class ProcessPlacement:
    """Forked worker processes, one pipe each (see the module docstring): a worker that dies fails
    the task it held, and a fresh one replaces it on the next job."""

    def __init__(self, runner):
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


def worker_main(runner, conn, parent_pid: int, reporter_cls) -> None:
    """A worker process: run the tasks sent down the pipe until told to stop."""
    die_with_parent(parent_pid)
    runner.reporter = _PipeReporter(conn, reporter_cls)
    try:
        while True:
            job = conn.recv()
            if job is None:
                runner.teardown()
                return
            if job.type is JobTaskPickle.type:
                task = runner.tasks[job.name]
                task.update_from_pickle(job.task_dict)
            else:
                task = pickle.loads(job.task_pickle)
            result = {"name": task.name}
            try:
                failure = runner.execute_task(task)
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
