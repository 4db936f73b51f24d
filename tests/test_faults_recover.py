"""Faults: real SIGKILLs of real runs, concurrent runs, unwritable outputs, sharding, a damaged cache."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import (
    DATABASE_DAMAGE,
    LINREG_PIPELINE,
    Project,
    assert_nothing_half_done,
    copy_project,
    damage_database,
    in_project,
    make_project,
    start_doit,
    state,
    wait_for_line,
)

from etforge.cache.entries import read_entry


def forget(project: Project, task: str) -> None:
    """As if ``task`` had never run: its state record, store entry and working-tree outputs gone."""
    record = state(project, task)
    shutil.rmtree(project.root / "artifacts" / "cache" / record["key"][:2] / record["key"])
    for meta in record["outputs"].values():
        in_project(project, meta["path"]).unlink()
    (project.out / ".state" / (task.replace(":", "__").replace("/", "__") + ".json")).unlink()


def test_a_run_killed_mid_lowering_leaves_nothing_a_later_run_accepts_and_the_next_run_finishes(built_small, tmp_path):
    """The built project with the cnn's capture and XNNPACK export forgotten: the run captures
    (its worker is warm when the lowering starts, as in a first build), then is killed inside
    that lowering. (Other kill points, from a first build: the next test, in `make test-all`.)"""
    project = copy_project(built_small, tmp_path / "proj")
    for task in ("capture:cnn", "export:cnn/xnnpack/fp32"):
        forget(project, task)
    proc = start_doit(project)
    wait_for_line(proc, "start            export:cnn/xnnpack/fp32")
    time.sleep(0.3)  # land inside the lowering, not at its first line
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    proc.stdout.close()
    assert_nothing_half_done(project)
    run = project.doit()
    assert run.returncode == 0, run.stdout + run.stderr
    assert "export:cnn/xnnpack/fp32" in run.started and "4 provisional" in run.stdout
    assert_nothing_half_done(project)
    assert project.doit().started == set()


# Repeats of the mid-lowering kill above (which runs by default) at other moments of a first build:
# mid-capture, mid-lowering, between tasks and mid-verdict, in `make test-all`.
@pytest.mark.slow
@pytest.mark.parametrize(
    "kill_at",
    [
        "start            capture:cnn",
        "start            export:cnn/xnnpack/fp32",
        "ok               export:linreg/xnnpack/fp32",
        "start            validate:cnn/portable/fp32",
    ],
)
def test_a_killed_run_leaves_nothing_a_later_run_accepts_and_the_next_run_finishes(tmp_path, kill_at):
    project = make_project(tmp_path / "proj")
    proc = start_doit(project)
    wait_for_line(proc, kill_at)
    time.sleep(0.3)  # land inside the task's work, not at its first line
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert_nothing_half_done(project)
    run = project.doit()
    assert run.returncode == 0, run.stdout + run.stderr
    assert "4 provisional" in run.stdout
    assert_nothing_half_done(project)
    assert project.doit().started == set()


def test_unwritable_artifacts_directory_fails_with_one_line_naming_the_path(tmp_path):
    project = make_project(tmp_path / "proj")
    (project.root / "artifacts").write_text("not a directory")  # root ignores chmod, not this
    run = project.doit()
    assert run.returncode == 3
    assert run.stderr.strip().splitlines() == [
        f"etforge: error: cannot write to {project.root / 'artifacts'}: File exists"
    ]
    assert "Traceback" not in run.stdout + run.stderr


def test_shards_split_the_matrix_without_overlap(tmp_path):
    project = make_project(tmp_path / "proj")
    shards = []
    for k in (1, 2, 3):
        listed = project.doit("list", "--all", "--shard", f"{k}/3").stdout
        shards.append({line.split()[0] for line in listed.splitlines() if line.startswith("export:")})
    everything = {
        line.split()[0] for line in project.doit("list", "--all").stdout.splitlines() if line.startswith("export:")
    }
    assert set().union(*shards) == everything
    assert sum(len(s) for s in shards) == len(everything)
    bad = project.doit("list", "--shard", "4/3")
    assert bad.returncode == 3 and "expected k/n with 1 <= k <= n" in bad.stderr


# ---------------------------------------------------------------- the run lifecycle
# Tiny pipelines (linreg on the portable backend, plus a factory that fails in a
# chosen way): each run below is a few seconds, mostly importing torch.

TINY_PIPELINE = """\
name: t
version: 0.0.1
models:
%s
backends:
  portable: {}
quantization: [fp32]
targets: false
"""
FACTORIES = {
    "boom": (
        "import pathlib, time\n\n\ndef build():\n"
        "    gate, deadline = pathlib.Path(__file__).with_name('gate'), time.monotonic() + 300\n"
        "    while not gate.exists() and time.monotonic() < deadline:  # until the test opens it\n"
        "        time.sleep(0.05)\n"
        "    raise RuntimeError('boom: this factory always fails')\n"
    ),
    "suicide": (
        "import os, signal\n\n\ndef build():\n    os.kill(os.getpid(), signal.SIGKILL)  # what the OOM killer does\n"
    ),
    "gated": (
        "import pathlib, time\n\nfrom models.linreg import build as build_linreg\n\n\ndef build():\n"
        "    gate, deadline = pathlib.Path(__file__).with_name('gate'), time.monotonic() + 300\n"
        "    while not gate.exists() and time.monotonic() < deadline:  # until the test opens it\n"
        "        time.sleep(0.05)\n"
        "    return build_linreg()\n"
    ),
    "big": "import torch\n\n\ndef build():\n    return torch.nn.Linear(4, 16384)  # 256 KB of weights\n",
    "exits": "import sys\n\n\ndef build():\n    sys.exit(0)  # a factory that thinks it is a script\n",
    "hard_exits": "import os\n\n\ndef build():\n    os._exit(0)\n",
    # a model module that parses the command line at import: doit's arguments are not its own
    "argparse_at_import": (
        "import argparse\n\nARGS = argparse.ArgumentParser().parse_args()\n\n\n"
        "def build():\n    raise AssertionError('never reached')\n"
    ),
}


def tiny_project(path, *factories: str, linreg: bool = True):
    models = ("linreg", *factories) if linreg else factories
    project = make_project(
        path,
        TINY_PIPELINE
        % "\n".join(
            f"  {name}:\n    python: models.{name}:build\n    inputs: [{{name: x, shape: [1, 4]}}]" for name in models
        ),
    )
    for name in factories:
        (project.root / "models" / f"{name}.py").write_text(FACTORIES[name])
    return project


def lock_holder(project) -> str:
    try:
        return (project.root / "artifacts" / ".etforge" / "run.lock").read_text().strip()
    except FileNotFoundError:
        return ""


def wait_for_lock(project, pid: int, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while lock_holder(project) != f"held by pid {pid}":
        assert time.monotonic() < deadline, f"pid {pid} never took the run lock"
        time.sleep(0.05)


def summary_rows(project) -> dict:
    return {r["cell"]: r for r in json.loads((project.out / "summary.json").read_text())}


def test_a_second_concurrent_run_waits_for_the_first(tmp_path):
    project = tiny_project(tmp_path / "proj", "gated", linreg=False)
    first = start_doit(project)
    wait_for_lock(project, first.pid)  # its capture:gated now waits for the gate
    second = start_doit(project)
    said = wait_for_line(second, f"another doit run (pid {first.pid}) is using")
    (project.root / "models" / "gate").touch()
    out_second, _ = second.communicate(timeout=600)
    out_first, _ = first.communicate(timeout=600)
    out_second = said + out_second
    assert first.returncode == 0 and second.returncode == 0, out_first + out_second
    assert f"another doit run (pid {first.pid}) is using" in out_second and "waiting" in out_second
    assert "0 task(s) run" in out_second  # the first run built everything
    assert_nothing_half_done(project)


# The second spelling of the reporter option in `make test-all`.
@pytest.mark.parametrize(
    "args", [("-r", "json"), pytest.param(("--reporter=json", "validate"), marks=pytest.mark.slow)]
)
def test_any_reporter_takes_the_lock_and_a_failed_cell_fails_the_run(tmp_path, args):
    project = tiny_project(tmp_path / "proj", "boom", linreg=False)
    first = start_doit(project, *args)
    wait_for_lock(project, first.pid)  # its capture:boom now waits for the gate
    second = start_doit(project, "-r", "json", "validate")
    wait_for_line(
        second,
        f"etforge: another doit run (pid {first.pid}) is using {project.root / 'artifacts'}; waiting for it to finish",
    )
    (project.root / "models" / "gate").touch()
    out_first, _ = first.communicate(timeout=600)
    out_second, _ = second.communicate(timeout=600)
    assert first.returncode == 1, out_first
    assert second.returncode == 1, out_second  # the failed cell runs again, and fails again
    report = json.loads(out_first[out_first.index("{") : out_first.rindex("}") + 1])  # stdout stays JSON
    # A failed task returns success to doit (so that its dependents run and say they are
    # blocked): the exit status comes from the state records.
    assert {t["name"]: t["result"] for t in report["tasks"]}["capture:boom"] == "success"
    assert out_first.endswith("etforge: 1 failing: boom/portable/fp32\n")
    row = summary_rows(project)["boom/portable/fp32"]  # written whatever the reporter
    assert row["status"] == "failed" and "boom: this factory always fails" in row["note"]
    assert lock_holder(project) == ""  # released cleanly: the next run has nothing to take over


def test_a_worker_killed_mid_task_fails_its_cell_and_the_run_goes_on(tmp_path):
    project = tiny_project(tmp_path / "proj", "suicide")
    began = time.monotonic()
    run = project.doit("-n", "2", "-P", "process")
    assert time.monotonic() - began < 120  # no hang: doit used to wait forever on the dead worker
    assert run.returncode == 1, run.stdout + run.stderr
    log = project.out / "logs" / "capture__suicide.log"
    assert (
        "etforge: capture:suicide: worker process " in run.stderr
        and f"was killed by SIGKILL (the OOM killer, or kill -9) while running it (log: {log})" in run.stderr
    )
    assert "Traceback" not in run.stdout + run.stderr
    record = json.loads((project.out / ".state" / "capture__suicide.json").read_text())
    assert record["status"] == "failed" and "SIGKILL" in record["reason"] and record["log"] == str(log)
    rows = summary_rows(project)
    assert rows["suicide/portable/fp32"]["status"] == "failed"
    assert "SIGKILL" in rows["suicide/portable/fp32"]["note"] and str(log) in rows["suicide/portable/fp32"]["note"]
    assert rows["linreg/portable/fp32"]["status"] == "provisional"  # a replacement worker finished the rest
    export = json.loads((project.out / ".state" / "export__suicide__portable__fp32.json").read_text())
    assert export["status"] == "blocked"  # its dependents ran and said why they could not


def child_pids(pid: int) -> list:
    children = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            children.append(int(stat.parent.name))
    return children


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_killing_only_the_main_process_kills_its_workers_and_frees_the_lock(tmp_path):
    project = tiny_project(tmp_path / "proj")
    proc = start_doit(project, "-n", "2", "-P", "process")
    wait_for_line(proc, "start            capture:linreg")
    workers = child_pids(proc.pid)
    assert workers, "no worker process found"
    os.kill(proc.pid, signal.SIGKILL)  # the main process only, not its group
    proc.wait()
    deadline = time.monotonic() + 10
    while any(alive(w) for w in workers):
        assert time.monotonic() < deadline, "workers outlived the main process"
        time.sleep(0.05)
    proc.stdout.close()
    assert lock_holder(project) == f"held by pid {proc.pid}"
    leftovers = [
        project.root / "artifacts" / "cache" / "tmp" / "build-x1y2z3" / "model.pt2",  # what a kill
        project.root / "artifacts" / "release" / ".release-x1y2z3" / "SHA256SUMS",  # leaves behind
        project.out / ".state" / ".export__linreg__portable__fp32.json.x1y2z3_9.tmp",
    ]
    for path in leftovers:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("half")
    began = time.monotonic()
    run = project.doit()
    assert run.returncode == 0, run.stdout + run.stderr
    assert (
        f"etforge: took over the run lock of {project.root / 'artifacts'} from pid {proc.pid}, which ended without "
        "releasing it (killed); cleaning up after it"
    ) in run.stderr
    assert "waiting" not in run.stderr
    assert "1 provisional" in run.stdout
    assert time.monotonic() - began < 300
    assert not any(path.exists() for path in leftovers) and not leftovers[0].parent.exists()
    assert_nothing_half_done(project)


# The tests below work on copies of the session's built linreg (tests/conftest.py built_linreg: one
# XNNPACK cell, CELL below), shared with the store tests further down instead of a build of their own.


def database(project: Project) -> Path:
    return project.root / "artifacts" / ".doit.sqlite3"


@pytest.mark.parametrize("damage", ["truncate", "garbage", "row", "directory", "schema", "delete"])
def test_a_damaged_doit_database_costs_one_warning_and_no_rebuild(built_linreg, tmp_path, damage):
    project = copy_project(built_linreg, tmp_path / "proj")
    db = database(project)
    damage_database(db, damage, task=f"export:{CELL}")
    run = project.doit()
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.started == set()  # etforge's own records say everything is up to date
    if damage == "delete":
        assert run.stderr == ""
    else:
        why = DATABASE_DAMAGE[damage].replace("export:linreg/portable/fp32", f"export:{CELL}")  # the row damaged
        assert run.stderr.splitlines() == [
            f"etforge: warning: doit's database {db} was unreadable ({why}); moved it to "
            ".doit.sqlite3.corrupt and starting afresh (etforge's state records keep every task up to date)"
        ]
    again = project.doit()
    assert again.returncode == 0 and again.stderr == "" and again.started == set()


def doit_with_file_limit(project: Project, kilobytes: int, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "ETFORGE_PIPELINE": str(project.pipeline)}
    command = " ".join([sys.executable, "-m", "etforge", *args])
    return subprocess.run(
        ["bash", "-c", f"ulimit -f {kilobytes}; exec {command}"],
        cwd=project.root,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.mark.parametrize("link", ["artifacts", "artifacts/t"])
def test_a_symlink_out_of_the_project_is_refused_unless_the_pipeline_opts_in(tmp_path, link):
    project = make_project(tmp_path / "proj")
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (project.root / link).parent.mkdir(parents=True, exist_ok=True)
    (project.root / link).symlink_to(outside)
    run = project.doit("list")
    assert run.returncode == 3
    assert run.stderr.splitlines() == [
        f"etforge: error: {project.root / link} is a symlink to {outside}, outside the project directory "
        f"{project.root}: etforge does not write through it (set `artifacts: {{allow_outside: true}}` in "
        "pipeline.yaml to follow it)"
    ]
    assert list(outside.iterdir()) == []  # nothing written through it

    project.write_pipeline(project.pipeline.read_text() + "artifacts: {allow_outside: true}\n")
    run = project.doit("list")
    assert run.returncode == 0, run.stderr
    written = outside / ".etforge" if link == "artifacts" else project.root / "artifacts" / ".etforge"
    assert (written / "digests.json").is_file()


def test_a_symlink_inside_the_project_is_followed(tmp_path):
    project = make_project(tmp_path / "proj")
    (project.root / "build").mkdir()
    (project.root / "artifacts").symlink_to(project.root / "build")
    run = project.doit("list")
    assert run.returncode == 0, run.stderr
    assert (project.root / "build" / ".etforge" / "digests.json").is_file()


@pytest.mark.parametrize(
    "link",
    ["artifacts", "artifacts/t", "artifacts/t/linreg", "artifacts/cache/00", "artifacts/.etforge/pending-uploads"],
)
def test_a_dangling_artifacts_symlink_gets_its_own_message(tmp_path, link):
    project = make_project(tmp_path / "proj")
    (project.root / link).parent.mkdir(parents=True, exist_ok=True)
    (project.root / link).symlink_to(tmp_path / "gone")
    run = project.doit("list")
    assert run.returncode == 3
    assert run.stderr.splitlines() == [  # it used to say "File exists"
        f"etforge: error: {project.root / link} is a symlink to {tmp_path / 'gone'}, which does not exist: "
        "create that directory or remove the link"
    ]


@pytest.mark.slow  # the final writes' and native code's limits below cover it in the default run
def test_a_build_under_a_file_size_limit_fails_cleanly_and_the_next_run_finishes(tmp_path):
    project = tiny_project(tmp_path / "proj")
    db = database(project)
    tiny = doit_with_file_limit(project, 4)  # not even doit's database fits
    assert tiny.returncode == 3
    assert tiny.stderr.splitlines() == [f"etforge: error: cannot create {db}: disk I/O error"]
    assert not db.exists()
    limited = doit_with_file_limit(project, 16)  # the database fits, ExecuTorch's schema files do not
    output = limited.stdout + limited.stderr
    assert limited.returncode == 1, output
    assert "Traceback" not in output
    assert "FAILED           export:linreg/portable/fp32" in limited.stdout and "File too large" in limited.stdout
    # models.cmake (it carries the selective-build function) is over 16 KiB too: the manifest fails the same way
    assert limited.stderr.splitlines() == ["etforge: 2 failing: linreg/portable/fp32, manifest"]
    run = project.doit()  # room again
    assert run.returncode == 0, run.stdout + run.stderr
    assert "1 provisional" in run.stdout


# --- a damaged store heals in the run that finds it --------------------------------------

CELL = "linreg/xnnpack/fp32"
STRICTER = "thresholds: {fp32: {sqnr_db: 55}}\n"  # a new validation key; exports stay as they are


def flip_one_byte(path, keep_mtime: bool) -> None:
    before = path.stat()
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    if keep_mtime:  # same size, same mtime: only reading the bytes can tell
        os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert path.stat().st_size == before.st_size


def test_a_deleted_cache_and_a_changed_threshold_heal_in_one_run(built_linreg, tmp_path):
    project = copy_project(built_linreg, tmp_path / "proj")
    shutil.rmtree(project.root / "artifacts" / "cache")
    project.write_pipeline(LINREG_PIPELINE + STRICTER)
    run = project.doit()
    assert run.returncode == 0, run.stdout + run.stderr
    # The graph comes back by running capture again; the program from the working tree,
    # whose bytes the export's record names; then validation runs on it.
    assert {"capture:linreg", f"export:{CELL}", f"validate:{CELL}"} <= run.started
    assert "missing from the cache" not in run.stdout + run.stderr
    validate = state(project, f"validate:{CELL}")
    assert validate["status"] == "ok" and validate["cached"] is False
    pte = project.out / "linreg" / "linreg_xnnpack_fp32.pte"
    assert validate["info"]["program_sha256"] == hashlib.sha256(pte.read_bytes()).hexdigest()
    assert_nothing_half_done(project)
    assert project.doit().started == set()


def test_the_final_writes_under_a_file_size_limit_fail_with_one_line_and_keep_the_database(built_linreg, tmp_path):
    project = copy_project(built_linreg, tmp_path / "proj")
    db = database(project)
    before = db.read_bytes()
    limited = doit_with_file_limit(project, 4, "-a", "-s", "report")  # re-run report alone, then write the DB
    assert limited.returncode == 1, limited.stdout + limited.stderr
    assert (
        f"etforge: error: cannot write {db}: disk I/O error; the previous database is intact and the "
        "next run finishes the job"
    ) in limited.stderr.splitlines()
    assert "Traceback" not in limited.stdout + limited.stderr
    assert db.read_bytes() == before
    run = project.doit()
    assert run.returncode == 0 and run.stderr == "", run.stdout + run.stderr
    assert project.doit().started == set()


@pytest.mark.parametrize("delay", [0.0, 0.01, 0.05])
def test_a_kill_during_the_final_writes_leaves_a_state_the_next_run_accepts(built_linreg, tmp_path, delay):
    project = copy_project(built_linreg, tmp_path / "proj")
    proc = start_doit(project, "-a", "-s", "report")
    wait_for_line(proc, "ok               report")  # the last task: what follows is closing the DB and summary.json
    time.sleep(delay)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    proc.stdout.close()
    run = project.doit()
    assert run.returncode == 0, run.stdout + run.stderr
    assert "Traceback" not in run.stdout + run.stderr and "warning" not in run.stderr
    json.loads((project.out / "summary.json").read_text())
    assert_nothing_half_done(project)


@pytest.mark.parametrize(
    "flips, keep_mtime, workers",
    [
        # the same-mtime case below is the harder one: this one runs in `make test-all`
        pytest.param(((f"export:{CELL}", "program.pte"),), False, (), marks=pytest.mark.slow),
        # Two entries flipped in one run, each named when it heals: the program (validation and
        # benchmark both read it at once: one of them rebuilds it) and the capture's reference
        # (in the store only: validation runs the capture again).
        (((f"export:{CELL}", "program.pte"), ("capture:linreg", "reference.npz")), True, ("-n", "2", "-P", "process")),
    ],
    ids=["program", "program-and-reference-same-mtime-2-workers"],
)
def test_a_flipped_byte_in_a_cached_blob_is_rebuilt_in_the_same_run(built_linreg, tmp_path, flips, keep_mtime, workers):
    project = copy_project(built_linreg, tmp_path / "proj")
    entries = []
    for task, blob in flips:
        key = state(project, task)["key"]
        entries.append(project.root / "artifacts" / "cache" / key[:2] / key)
        flip_one_byte(entries[-1] / blob, keep_mtime)
    # A new validation key (and with two workers a new benchmark key): those tasks read the entries.
    readers = ("validate", "benchmark") if workers else ("validate",)
    project.write_pipeline(LINREG_PIPELINE + STRICTER + ("benchmark: {warmup: 2}\n" if workers else ""))
    run = project.doit(*workers)
    assert run.returncode == 0, run.stdout + run.stderr
    for entry in entries:
        read_entry(entry)  # whole again
    for task, _ in flips:
        healed = f"etforge: {task}: its cache entry is missing or corrupt; running it again"
        assert run.stderr.count(healed) == (1 if keep_mtime else 0), run.stderr
        if keep_mtime:
            assert task not in run.started  # up to date by its record; healed by the task that read it
    for kind in readers:
        record = state(project, f"{kind}:{CELL}")
        assert record["status"] == "ok" and record["cached"] is False, record
        pte = project.out / "linreg" / "linreg_xnnpack_fp32.pte"
        assert record["info"]["program_sha256"] == hashlib.sha256(pte.read_bytes()).hexdigest()
    assert_nothing_half_done(project)
    assert project.doit().started == set()


# ---------------------------------------------------------------- red team, round two


def test_a_module_replaced_with_its_old_size_and_mtime_is_not_served_stale(built_small, tmp_path):
    project = copy_project(built_small, tmp_path / "proj")
    assert project.doit().started == set()  # the copy's digests are memoised under its own paths
    blocks = project.root / "models" / "blocks.py"
    pte = project.out / "cnn" / "cnn_xnnpack_fp32.pte"
    stale = pte.read_bytes()
    edited = tmp_path / "blocks.py"
    edited.write_text(blocks.read_text().replace("padding=1", "padding=2"))
    os.utime(edited, ns=(blocks.stat().st_atime_ns, blocks.stat().st_mtime_ns))
    subprocess.run(["cp", "-p", str(edited), str(blocks)], check=True)
    assert blocks.stat().st_size == edited.stat().st_size and blocks.stat().st_mtime_ns == edited.stat().st_mtime_ns
    run = project.doit()
    assert run.returncode == 0, run.stdout + run.stderr
    assert {"capture:cnn", "export:cnn/xnnpack/fp32", "export:cnn/portable/fp32"} <= run.started
    assert not any(name.startswith(("capture:linreg", "export:linreg")) for name in run.started)
    assert pte.read_bytes() != stale  # padding=2 is another program
    assert project.doit().started == set()


EXIT_REASONS = {
    "exits": "SystemExit: the code called sys.exit(0)",
    "argparse_at_import": "SystemExit: the code called sys.exit(2)",
    "hard_exits": "exited with code 0 (the task's code called os._exit) while running it",
}


@pytest.mark.parametrize(
    "factories, args",
    [
        # sys.exit and os._exit in one sequential run: each fails its own cell (os._exit ends the
        # run's one worker, a new one builds the rest)
        (("exits", "hard_exits"), ()),
        # the same exit with two workers: sys-exit-and-os-exit covers the hard exit in a worker
        pytest.param(("exits",), ("-n", "2", "-P", "process"), marks=pytest.mark.slow),
        # the JSON reporter and another exit code repeat the in-process path: `make test-all`
        pytest.param(("exits",), ("-r", "json"), marks=pytest.mark.slow),
        # doit's and etforge's arguments are not the model's: parse_args() exits with 2
        pytest.param(("argparse_at_import",), ("--backends", "portable"), marks=pytest.mark.slow),
    ],
    ids=["sys-exit-and-os-exit", "sys-exit-2-workers", "sys-exit-json", "argparse"],
)
def test_a_model_that_exits_fails_its_own_cells_and_the_others_build(tmp_path, factories, args):
    project = tiny_project(tmp_path / "proj", *factories)
    run = project.doit(*args)
    assert run.returncode == 1, run.stdout + run.stderr  # never green: the run used to exit 0
    assert "Traceback" not in run.stderr
    if "json" in args:
        json.loads(run.stdout)  # stdout stays the reporter's JSON
    rows = summary_rows(project)
    for factory in factories:
        assert rows[f"{factory}/portable/fp32"]["status"] == "failed"
        assert EXIT_REASONS[factory] in rows[f"{factory}/portable/fp32"]["note"]
    assert rows["linreg/portable/fp32"]["status"] == "provisional"  # built all the same
    failing = ", ".join(f"{factory}/portable/fp32" for factory in factories)
    assert run.stderr.splitlines()[-1] == f"etforge: {len(factories)} failing: {failing}"


def test_a_file_size_limit_that_aborts_native_code_fails_the_cell_with_the_reason(tmp_path):
    project = tiny_project(tmp_path / "proj", "big")
    limited = doit_with_file_limit(project, 40)  # saving big's graph: torch's stream writer aborts
    output = limited.stdout + limited.stderr
    assert limited.returncode == 1, output
    assert "Traceback" not in output
    rows = summary_rows(project)  # the run finished: summary.json is there
    assert rows["big/portable/fp32"]["status"] == "failed"
    assert "a file-size limit of 40960 bytes is set" in rows["big/portable/fp32"]["note"]
    assert rows["linreg/portable/fp32"]["status"] == "provisional"  # small enough: built all the same
    assert limited.stderr.splitlines()[-1] == "etforge: 1 failing: big/portable/fp32"
    run = project.doit()  # room again
    assert run.returncode == 0, run.stdout + run.stderr


def test_threads_are_refused_with_one_line_before_anything_runs(tmp_path):
    project = tiny_project(tmp_path / "proj")
    run = project.doit("-n", "2", "-P", "thread")
    assert run.returncode == 3
    assert run.stderr.splitlines() == [
        "etforge: error: -P thread is not supported (torch.export is not thread-safe and each task's log is a "
        "process-wide redirect); use -P process"
    ]
    assert not (project.out / ".state").exists()
