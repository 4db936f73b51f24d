"""``etforge -P dask``: the task graph on a local two-worker Dask cluster (127.0.0.1 only), fake builders.

The cluster is started once for the module, as a user would start one (a scheduler and two
Nanny workers, w1 and w2; w2 offers ``macos``). Its workers are fresh interpreters: the fake
stage table travels with each task's action, and they import the fake builders it names from
the test process's path. The data plane is a ``file://`` remote cache:
a fresh checkout restores everything the workers built from it.
"""

from __future__ import annotations

import json
import re

import pytest

from etforge.engine import runlock
from unit.support import PIPELINE, make_unit_project
from unit.test_unit_engine_run import ALL_TASKS, PROVISIONAL, Etforge

distributed = pytest.importorskip("distributed")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    from distributed import Nanny, Scheduler, SpecCluster

    local = str(tmp_path_factory.mktemp("dask"))

    def worker(name: str, resources: dict) -> dict:
        options = {
            "nthreads": 1,
            "host": "127.0.0.1",
            "memory_limit": 0,
            "resources": resources,
            "env": {"ETFORGE_WORKER_NAME": name},
            "local_directory": local,
            "name": name,
        }
        return {"cls": Nanny, "options": options}

    spec = SpecCluster(
        scheduler={"cls": Scheduler, "options": {"host": "127.0.0.1", "port": 0, "dashboard": False}},
        workers={"w1": worker("w1", {}), "w2": worker("w2", {"macos": 1})},
        silence_logs=50,
    )
    yield spec.scheduler_address
    spec.close()


@pytest.fixture
def remote(tmp_path, monkeypatch):
    (tmp_path / "remote").mkdir()
    url = f"file://{tmp_path / 'remote'}"
    monkeypatch.setenv("ETFORGE_CACHE_REMOTE", url)
    return url


@pytest.fixture
def etforge(tmp_path, monkeypatch, capfd):
    return Etforge(make_unit_project(tmp_path / "proj"), monkeypatch, capfd)


def stats(path) -> dict:
    return {t["task"]: t for t in json.loads(path.read_text())["tasks"]}


def test_the_cluster_builds_the_matrix_a_second_run_is_a_no_op_and_a_fresh_checkout_restores_it(
    etforge, cluster, remote, tmp_path, monkeypatch, capfd
):
    monkeypatch.setenv("ETFORGE_CLUSTER_STATS", str(tmp_path / "stats.json"))
    run = etforge("-n", "2", "-P", "dask", "--scheduler", cluster, "export", "validate")
    assert run.code == 0, run.out + run.err
    assert run.started == ALL_TASKS
    assert sorted(task for task, _ in run.calls) == sorted(ALL_TASKS)  # each built once, on a worker
    assert etforge.statuses() == PROVISIONAL
    ran = stats(tmp_path / "stats.json")
    assert set(ran) == ALL_TASKS and {t["worker"] for t in ran.values()} == {"w1", "w2"}
    # A no-op run never contacts the cluster (this address answers nothing).
    again = etforge("-n", "2", "-P", "dask", "--scheduler", "tcp://127.0.0.1:1", "export", "validate")
    assert again.code == 0, again.out + again.err
    assert again.started == set() and again.calls == []
    # The workers uploaded what they built: a fresh checkout restores every task from the remote.
    fresh = Etforge(make_unit_project(tmp_path / "fresh"), monkeypatch, capfd)
    restored = fresh("export", "validate")
    assert restored.code == 0, restored.out + restored.err
    assert restored.calls == []
    assert all(fresh.record(task)["cached"] for task in ALL_TASKS)
    assert fresh.statuses() == PROVISIONAL


def test_a_worker_killed_mid_task_fails_that_task_with_the_reason_and_the_run_finishes(etforge, cluster, remote):
    etforge.control(fail={"export:b/portable/fp32": "kill"})
    run = etforge("-n", "2", "-P", "dask", "--scheduler", cluster, "export", "validate")
    assert run.code == 1, run.out + run.err
    record = etforge.record("export:b/portable/fp32")
    assert record["status"] == "failed"
    assert re.fullmatch(r"its worker w[12] died while running it \(Dask: KilledWorker\)", record["reason"])
    assert etforge.record("validate:b/portable/fp32")["status"] == "blocked"
    assert etforge.statuses() == {**PROVISIONAL, "b/portable/fp32": "failed"}
    assert "1 failing: b/portable/fp32" in run.err


METAL = PIPELINE.replace("  portable: {}\n", "  metal: {}\n")


def test_a_task_runs_on_a_worker_that_offers_its_labels_or_fails_naming_them(
    cluster,
    remote,
    tmp_path,
    monkeypatch,
    capfd,
):
    etforge = Etforge(make_unit_project(tmp_path / "proj", METAL), monkeypatch, capfd)
    monkeypatch.setenv("ETFORGE_WORKER_LABELS", "linux,macos")  # the driver plans the metal cells
    monkeypatch.setenv("ETFORGE_CLUSTER_STATS", str(tmp_path / "stats.json"))
    run = etforge("-n", "2", "-P", "dask", "--scheduler", cluster, "export")
    assert run.code == 0, run.out + run.err
    ran = stats(tmp_path / "stats.json")
    assert {ran[t]["worker"] for t in ("export:a/metal/fp32", "export:b/metal/fp32")} == {"w2"}
    # A label no worker of the cluster offers: failed at once, named (Dask would wait forever).
    gpu = METAL.replace("    python: models.a:build\n", "    python: models.a:build\n    labels: [gpu]\n")
    etforge = Etforge(make_unit_project(tmp_path / "gpu", gpu), monkeypatch, capfd)
    monkeypatch.setenv("ETFORGE_WORKER_LABELS", "linux,macos,gpu")
    run = etforge("-n", "2", "-P", "dask", "--scheduler", cluster, "export")
    assert run.code == 1
    reason = etforge.record("export:a/xnnpack/fp32")["reason"]
    assert reason.startswith("no worker of the cluster offers gpu (workers: w1[-], w2[macos])"), reason


def test_an_unreachable_cluster_is_one_line_and_leaves_the_pipeline_unlocked(etforge):
    run = etforge("-P", "dask", "--scheduler", "tcp://127.0.0.1:1", "export")
    assert run.code == 2, run.out + run.err  # doit's "error": nothing ran
    errors = [line for line in run.err.splitlines() if line.startswith("etforge: error")]
    assert errors == [
        "etforge: error: cannot reach the cluster at tcp://127.0.0.1:1: Connection refused (to run capture:a)"
    ]
    lock = runlock.acquire(etforge.project.out.parent / ".etforge" / "run.lock", print)
    runlock.release(lock)
    assert etforge("export").code == 0  # nothing half-done is in the way


def test_a_runner_etforge_does_not_have_is_one_line(etforge):
    run = etforge("-n", "2", "-P", "ray", "export")
    assert run.code == 3
    assert run.err.strip() == "etforge: error: -P ray: no such runner; use process or dask"
    assert run.calls == []


def test_without_a_scheduler_the_runner_starts_a_local_cluster_of_n_workers(etforge, tmp_path, monkeypatch):

    monkeypatch.setenv("ETFORGE_CLUSTER_STATS", str(tmp_path / "stats.json"))
    run = etforge("-n", "2", "-P", "dask", "export")
    assert run.code == 0, run.out + run.err
    ran = stats(tmp_path / "stats.json")
    assert {t for t in ran if t.startswith("export:")} == {t for t in ALL_TASKS if t.startswith("export:")}
    assert {t["worker"] for t in ran.values()} == {"0", "1"}  # LocalCluster's names


def test_a_lost_scheduler_fails_the_running_and_remaining_tasks_and_the_run_ends(etforge, remote, tmp_path):
    import os
    import signal
    import subprocess
    import sys
    import threading
    import time

    bin_dir = os.path.dirname(sys.executable)
    file = tmp_path / "scheduler.json"
    scheduler = subprocess.Popen(
        [f"{bin_dir}/dask", "scheduler", "--host", "127.0.0.1", "--port", "0", "--no-dashboard"]
        + ["--scheduler-file", str(file)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    workers = []
    try:
        while not file.exists():
            time.sleep(0.1)
        address = json.loads(file.read_text())["address"]
        for name in ("s1", "s2"):
            workers.append(
                subprocess.Popen(
                    [f"{bin_dir}/dask", "worker", address, "--name", name, "--nthreads", "1", "--host", "127.0.0.1"]
                    + ["--no-dashboard", "--memory-limit", "0"],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                    env={**os.environ, "PYTHONPATH": os.pathsep.join([os.environ.get("PYTHONPATH", ""), *sys.path])},
                )
            )
        with distributed.Client(address, timeout=30) as client:
            client.wait_for_workers(2, timeout=60)
        etforge.control(fail={"capture:a": "sleep", "capture:b": "sleep"})
        threading.Timer(5.0, scheduler.send_signal, [signal.SIGKILL]).start()
        start = time.monotonic()
        run = etforge("-n", "2", "-P", "dask", "--scheduler", address, "export")
        assert time.monotonic() - start < 30  # the captures would sleep 30 s
        assert run.code == 1, run.out + run.err
        reason = etforge.record("capture:a")["reason"]
        assert reason.startswith(f"lost the connection to the cluster scheduler {address} while running it"), reason
        assert etforge.record("export:a/xnnpack/fp32")["status"] in ("failed", "blocked")
    finally:
        for process in (scheduler, *workers):
            process.kill()
            process.wait()
