"""``etforge -P dask``: run the task graph on a Dask distributed cluster, one cluster task per doit task.

    etforge -P dask --scheduler tcp://10.0.0.5:8786      a running cluster (`dask scheduler`, `dask worker`)
    etforge -n 2 -P dask                                 a local cluster of 2 worker processes on 127.0.0.1

The driver keeps everything doit owns: the dispatcher (order, ``task_dep``), the ``uptodate``
checks (a no-op run never contacts the cluster: it connects when the first task must run),
doit's database, the reporter and, through the dispatch loop (etforge.engine.runners), the run
lock, records, summary and exit status, exactly as with ``-n 2 -P process``. Only a task's
actions run on a worker (etforge.engine.cluster_job); the remote cache is the data plane.

Placement is the driver's, by worker labels (etforge.config.labels): a worker offers its Dask
resources (``dask worker --resources "macos=1 qnn_sdk=1 mem_gb=64"``; ``mem_gb=N`` is ``memN``),
a task needs its model's and backend's labels, and runs on a free worker that has them, one task
per worker at a time (torch.export is not thread-safe and a task's log is a process-wide
redirect: start workers with ``--nthreads 1``). A task whose capable workers are all busy waits
in the driver while other tasks go to the other workers. A task that no worker of the cluster
can take fails at once, naming the labels: Dask would leave it pending forever (measured).

A worker lost mid-task (``KilledWorker``: the scheduler is told not to re-run it elsewhere)
fails that task with the reason; its dependents say blocked and the run goes on. A lost
scheduler fails the running tasks and every later one with the reason, and the run ends.
"""

from __future__ import annotations

import os
import socket
import time
from dataclasses import dataclass

import cloudpickle
from doit.runner import ERROR

from etforge.config import labels as worker_labels
from etforge.core.console import say
from etforge.core.errors import EtforgeError
from etforge.engine.cluster_job import code_fingerprint, run_job, write_if_changed
from etforge.engine.runners import DispatchRunner

CONNECT_TIMEOUT_S = 3.0  # a TCP check first: Dask's own client waits 30 s by default
MEMORY = "mem_gb"  # the Dask resource of a memory class: mem_gb=64 offers mem64
WATCH_S = 10.0  # how often the driver checks that the workers its tasks wait for still exist


class Unreachable(EtforgeError):
    """The cluster cannot be used (one line)."""


class ClusterLost(EtforgeError):
    """The driver lost the scheduler: running tasks fail with this reason, later ones are not run."""


@dataclass
class Slot:
    name: str  # the Dask worker's name, as shown
    labels: frozenset
    busy: bool = False
    handle: object = None  # the name as Dask knows it (LocalCluster names workers 0, 1: ints)


@dataclass
class Running:
    node: object
    slot: Slot
    submitted: float


def labels_of(resources: dict) -> frozenset:
    """A Dask worker's resources as worker labels (``mem_gb=64`` -> ``mem64``)."""
    out = set()
    for name, amount in (resources or {}).items():
        if name == MEMORY:
            out.add(f"mem{int(amount)}")
        elif amount:
            out.add(name)
    return frozenset(out)


def resources_of(labels) -> dict:
    """Worker labels as Dask resources (``mem64`` -> ``mem_gb=64``)."""
    out: dict = {}
    for label in labels:
        match = worker_labels.MEMORY.match(label)
        if match:
            out[MEMORY] = max(out.get(MEMORY, 0), int(match.group(1)))
        else:
            out[label] = 1
    return out


def check_reachable(address: str, timeout: float = CONNECT_TIMEOUT_S) -> None:
    host, _, port = address.split("://", 1)[-1].rpartition(":")
    try:
        socket.create_connection((host or "127.0.0.1", int(port)), timeout=timeout).close()
    except (OSError, ValueError) as exc:
        raise Unreachable(f"cannot reach the cluster at {address}: {getattr(exc, 'strerror', None) or exc}") from None


class DaskEngine:
    """A Dask client: the scheduler given, or a local cluster of ``workers`` processes on 127.0.0.1."""

    def __init__(self, address: str | None, workers: int, offers: frozenset):
        try:
            from distributed import Client, LocalCluster
        except ImportError:
            raise Unreachable("-P dask needs Dask distributed: pip install 'etforge[cluster]'") from None
        self.cluster = None
        if address:
            check_reachable(address)
            try:
                self.client = Client(address, timeout=10)
            except OSError as exc:
                raise Unreachable(f"cannot connect to the cluster at {address}: {exc}") from None
        else:
            self.cluster = LocalCluster(
                n_workers=workers,
                threads_per_worker=1,
                processes=True,
                host="127.0.0.1",
                dashboard_address="127.0.0.1:0",  # its HTTP server (health, metrics) on loopback too
                memory_limit=0,  # the Nanny would kill a worker past RAM/n (a large export needs more)
                resources=resources_of(offers),
            )
            self.client = Client(self.cluster)
        self.address = self.client.scheduler.address if self.client.scheduler is not None else str(address)
        # A worker's death fails its task (the default re-runs it on 3 more workers: an export
        # that runs out of memory would take them down one after the other).
        self.client.run_on_scheduler(_no_reruns)

    def slots(self) -> list:
        info = self.client.scheduler_info(n_workers=-1)["workers"]
        slots = []
        for address, w in info.items():
            name = w.get("name", address)
            slots.append(Slot(str(name), labels_of(w.get("resources")), handle=name))
        return sorted(slots, key=lambda s: s.name)

    def submit(self, slot: Slot, *args):
        return self.client.submit(run_job, *args, pure=False, workers=[slot.handle], allow_other_workers=False)

    def wait_any(self, futures: list, timeout: float | None = None) -> list:
        """The futures done, waiting for the first; [] after ``timeout`` seconds."""
        from distributed import wait
        from distributed.client import FuturesCancelledError

        try:
            done, _ = wait(futures, timeout=timeout, return_when="FIRST_COMPLETED")
        except FuturesCancelledError:  # the scheduler went away (measured: within 10 ms)
            raise ClusterLost(f"lost the connection to the cluster scheduler {self.address}") from None
        except TimeoutError:
            return []
        return list(done)

    def worker_names(self) -> set:
        return {str(w.get("name", a)) for a, w in self.client.scheduler_info(n_workers=-1)["workers"].items()}

    def outcome(self, future) -> dict:
        """The job's result; a lost worker or an error on the way is an exception with the reason."""
        from distributed import KilledWorker

        try:
            return future.result()
        except KilledWorker as exc:
            last = getattr(exc, "last_worker", None)
            name = getattr(last, "name", None) or getattr(last, "address", None) or "?"
            raise ClusterLost(f"its worker {name} died while running it (Dask: KilledWorker)") from None

    def close(self) -> None:
        self.client.close()
        if self.cluster is not None:
            self.cluster.close()


def _no_reruns(dask_scheduler=None):
    dask_scheduler.allowed_failures = 0


class DaskPlacement:
    """A cluster's workers as the dispatch loop's placement (etforge.engine.runners DispatchRunner):
    one task per worker at a time, on a free worker offering its labels; a task whose capable
    workers are all busy waits here while other tasks go to the other workers."""

    def __init__(self, runner: DaskRunner):
        self.runner = runner
        self.engine: DaskEngine | None = None
        self.pool: list = []
        self.running: dict = {}  # future -> Running
        self.waiting: list = []  # ready tasks whose capable workers are all busy
        self.ended: list = []  # (node, failure) decided without running (no capable worker, lost cluster)
        self.lost: str | None = None
        self.gone: dict = {}  # worker name -> when it was first seen missing
        self.stats: dict = {"connect_s": 0.0, "tasks": []}

    def has_room(self) -> bool:
        if self.engine is None or self.lost:
            return True
        self._place_waiting()
        return not (all(s.busy for s in self.pool) or len(self.waiting) >= len(self.pool))

    def busy(self) -> bool:
        return bool(self.running or self.waiting or self.ended)

    def start(self, node) -> None:
        if self.lost:
            self.ended.append(self.runner.lost(node, f"not run: {self.lost}"))
            return
        try:
            self._connect()
        except Unreachable as exc:
            say(f"etforge: error: {exc} (to run {node.task.name})")
            self.runner.halt(ERROR)
            return
        self._place(node)

    def finished(self) -> list:
        out, self.ended = self.ended, []
        if out:
            return out
        if not self.running:  # every worker is free: what still waits never can run
            out = [self.runner.lost(n, "every worker of the cluster that could run it has left") for n in self.waiting]
            self.waiting = []
            return out
        assert self.engine is not None  # (something runs: the cluster was reached)
        try:
            done = self.engine.wait_any(list(self.running), WATCH_S)
        except ClusterLost as lost:
            self.lost = str(lost)
            for future in list(self.running):
                run = self.running.pop(future)
                out.append(self.runner.lost(run.node, f"{lost} while running it (worker {run.slot.name})"))
            return out
        if not done:
            return self._fail_orphans()
        return [self._collect(future) for future in done]

    def close(self) -> None:
        self._write_stats()
        if self.engine is not None:
            self.engine.close()

    def _connect(self) -> None:
        if self.engine is not None:
            return
        start = time.perf_counter()
        runner = self.runner
        self.engine = runner.engine_class(runner.scheduler, runner.num_process, worker_labels.declared_or_detected())
        self.pool = self.engine.slots()
        self.stats["connect_s"] = time.perf_counter() - start
        if not self.pool:
            raise Unreachable(f"the cluster at {self.engine.address} has no workers")

    def _fail_orphans(self) -> list:
        """Fail the tasks pinned to a worker that has left the cluster (a machine lost, a worker
        stopped) and did not come back within WATCH_S: Dask would keep them waiting for it."""
        assert self.engine is not None
        names = self.engine.worker_names()
        now = time.monotonic()
        out = []
        for future, run in list(self.running.items()):
            if run.slot.name in names:
                self.gone.pop(run.slot.name, None)
                continue
            since = self.gone.setdefault(run.slot.name, now)
            if now - since >= WATCH_S:
                del self.running[future]
                future.cancel()
                self.pool = [s for s in self.pool if s.name in names]
                out.append(self.runner.lost(run.node, f"its worker {run.slot.name} left the cluster"))
        return out

    def _needs(self, node) -> frozenset:
        return frozenset(((node.task.meta or {}).get("etforge") or {}).get("needs") or ())

    def _place(self, node) -> None:
        """Start ``node`` on a free worker that offers its labels, else park it until one is free
        (other tasks go on meanwhile); fail it when no worker of the cluster ever could take it."""
        if self.lost:
            self.ended.append(self.runner.lost(node, f"not run: {self.lost}"))
            return
        needs = self._needs(node)
        capable = [s for s in self.pool if not worker_labels.lacking(needs, s.labels)]
        if not capable:
            have = ", ".join(f"{s.name}[{','.join(sorted(s.labels)) or '-'}]" for s in self.pool)
            reason = f"no worker of the cluster offers {', '.join(sorted(needs))} (workers: {have})"
            self.ended.append(self.runner.lost(node, reason))
            return
        free = [s for s in capable if not s.busy]
        if not free:
            self.waiting.append(node)
            return
        self._submit(node, min(free, key=lambda s: len(s.labels)))  # keep special workers for special tasks

    def _place_waiting(self) -> None:
        waiting, self.waiting = self.waiting, []
        for node in waiting:
            self._place(node)

    def _submit(self, node, slot: Slot) -> None:
        task, runner = node.task, self.runner
        assert self.engine is not None
        runner.reporter.execute_task(task)
        if task.teardown:
            runner.teardown_list.append(task)
        spec = runner.lifecycle.specs.get(task.name)
        files = {"state_file": str(spec.state_file), "log_file": str(spec.log_file)} if spec else {}
        future = self.engine.submit(
            slot, cloudpickle.dumps(task), self._upstream_records(task), runner.stream, code_fingerprint(), files
        )
        slot.busy = True
        self.running[future] = Running(node, slot, time.time())

    def _upstream_records(self, task) -> dict:
        records = {}
        for dep in task.task_dep:
            spec = self.runner.lifecycle.specs.get(dep)
            if spec is None:
                continue
            try:
                records[str(spec.state_file)] = spec.state_file.read_text(encoding="utf-8")
            except OSError:
                pass
        return records

    def _collect(self, future) -> tuple:
        """(node, failure) of a finished cluster task, its result applied to the driver's Task."""
        assert self.engine is not None
        run = self.running.pop(future)
        run.slot.busy = False
        node, task = run.node, run.node.task
        try:
            result = self.engine.outcome(future)
        except ClusterLost as lost:
            return self.runner.lost(node, f"{lost}")
        except Exception as exc:  # noqa: BLE001  (a task that cannot unpickle there, a missing module...)
            detail = str(exc).splitlines()[0] if str(exc) else ""
            return self.runner.lost(node, f"could not run on worker {run.slot.name}: {type(exc).__name__}: {detail}")
        self.stats["tasks"].append(
            {"task": task.name, "worker": run.slot.name, "submitted": run.submitted, "seen": time.time()}
            | {k: result[k] for k in ("started", "ended")}
        )
        self._adopt(task, result)
        task.values = result["values"] or {}
        task.result = result["result"]
        for action, out, err in zip(task.actions, result["out"], result["err"]):
            action.out, action.err = out, err
        return node, result["failure"]

    def _adopt(self, task, result: dict) -> None:
        """The worker's record (and its log, when this disk has none) in this checkout."""
        spec = self.runner.lifecycle.specs.get(task.name)
        if spec is None or result.get("record") is None:
            return
        write_if_changed(str(spec.state_file), result["record"])
        if result.get("log") is not None and not spec.log_file.exists():
            write_if_changed(str(spec.log_file), result["log"])

    def _write_stats(self) -> None:
        """Per-task timings for benchmarks/ (ETFORGE_CLUSTER_STATS=<file>)."""
        path = os.environ.get("ETFORGE_CLUSTER_STATS")
        if path:
            import json

            with open(path, "w", encoding="utf-8") as f:
                json.dump(self.stats, f)


class DaskRunner(DispatchRunner):
    """The dispatch loop, with cluster tasks instead of forked workers."""

    scheduler: str | None = None  # bound by runner_class (--scheduler); None: a local cluster
    engine_class = DaskEngine

    def make_placement(self) -> DaskPlacement:
        return DaskPlacement(self)


def bound_runner(lifecycle, scheduler: str | None):
    """The ``-P dask`` runner class, bound to this run's lifecycle and scheduler address."""
    return type("EtforgeDaskRunner", (DaskRunner,), {"lifecycle": lifecycle, "scheduler": scheduler})
