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

import pytest

from conftest import LINREG_PIPELINE, REPO, copy_project, make_project, state
from tasks.cache import read_entry


def start_doit(project, *args):
    env = {**os.environ, "ETFORGE_PIPELINE": str(project.pipeline)}
    return subprocess.Popen([sys.executable, "-m", "doit", "-f", str(REPO / "dodo.py"), *args],
                            cwd=project.root, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)


def wait_for_line(proc, needle: str, timeout: float = 300) -> str:
    deadline = time.monotonic() + timeout
    seen = []
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        seen.append(line)
        if needle in line:
            return "".join(seen)
    raise AssertionError(f"never saw {needle!r}:\n{''.join(seen)}")


def assert_nothing_half_done(project) -> None:
    """Every state record that claims success matches its outputs, and every store entry verifies."""
    cache = project.root / "artifacts" / "cache"
    for entry in cache.glob("??/*"):
        read_entry(entry)  # raises on a missing manifest or a blob that does not match
    for record_file in (project.out / ".state").glob("*.json"):
        record = json.loads(record_file.read_text())
        if record["status"] != "ok":
            continue
        for meta in record["outputs"].values():
            path = project.root / os.path.relpath(meta["path"], project.root)
            assert path.stat().st_size == meta["size"], path


@pytest.mark.parametrize("kill_at", ["start   capture:cnn", "start   export:cnn/xnnpack/fp32",
                                     "ok      export:linreg/xnnpack/fp32", "start   validate:cnn/portable/fp32"])
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
    assert "4 ok" in run.stdout
    assert_nothing_half_done(project)
    assert project.doit().started == set()


def test_a_second_concurrent_run_waits_for_the_first(tmp_path):
    project = make_project(tmp_path / "proj")
    first = start_doit(project)
    wait_for_line(first, "start   capture:linreg")
    second = start_doit(project)
    out_second, _ = second.communicate(timeout=600)
    out_first, _ = first.communicate(timeout=600)
    assert first.returncode == 0 and second.returncode == 0, out_first + out_second
    assert "another doit run is using" in out_second and "waiting" in out_second
    assert "0 task(s) run" in out_second  # the first run built everything
    assert_nothing_half_done(project)


def test_unwritable_artifacts_directory_fails_with_one_line_naming_the_path(tmp_path):
    project = make_project(tmp_path / "proj")
    (project.root / "artifacts").write_text("not a directory")  # root ignores chmod, not this
    run = project.doit()
    assert run.returncode == 3
    assert run.stderr.strip().splitlines() == [
        f"etforge: error: cannot write to {project.root / 'artifacts'}: File exists"]
    assert "Traceback" not in run.stdout + run.stderr


def test_shards_split_the_matrix_without_overlap(tmp_path):
    project = make_project(tmp_path / "proj")
    shards = []
    for k in (1, 2, 3):
        listed = project.doit("list", "--all", f"shard={k}/3").stdout
        shards.append({line.split()[0] for line in listed.splitlines() if line.startswith("export:")})
    everything = {line.split()[0] for line in project.doit("list", "--all").stdout.splitlines()
                  if line.startswith("export:")}
    assert set().union(*shards) == everything
    assert sum(len(s) for s in shards) == len(everything)
    bad = project.doit("list", "shard=4/3")
    assert bad.returncode == 3 and "expected k/n with 1 <= k <= n" in bad.stderr


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


@pytest.mark.parametrize("task, blob, keep_mtime, workers", [
    (f"export:{CELL}", "program.pte", False, ()),
    # Validation and benchmark both read the bad entry at once: one of them rebuilds it.
    (f"export:{CELL}", "program.pte", True, ("-n", "2", "-P", "process")),
    ("capture:linreg", "reference.npz", True, ()),  # in the store only: capture runs again
], ids=["program", "program-same-mtime-2-workers", "reference-same-mtime"])
def test_a_flipped_byte_in_a_cached_blob_is_rebuilt_in_the_same_run(built_linreg, tmp_path, task, blob,
                                                                     keep_mtime, workers):
    project = copy_project(built_linreg, tmp_path / "proj")
    key = state(project, task)["key"]
    entry = project.root / "artifacts" / "cache" / key[:2] / key
    flip_one_byte(entry / blob, keep_mtime)
    # A new validation key (and with two workers a new benchmark key): those tasks read the entry.
    readers = ("validate", "benchmark") if workers else ("validate",)
    project.write_pipeline(LINREG_PIPELINE + STRICTER + ("benchmark: {warmup: 2}\n" if workers else ""))
    run = project.doit(*workers)
    assert run.returncode == 0, run.stdout + run.stderr
    read_entry(entry)  # whole again
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
