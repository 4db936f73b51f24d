"""A release is replaced as a whole: its directory, archive and timings, whatever signal arrives
when (etforge.core.swap). A child process swaps a new release in over an old one whose directory
is big enough to take a while to remove, and is signalled the moment its journal exists."""

from __future__ import annotations

import json
import os
import signal
import time
from multiprocessing import get_context
from pathlib import Path

import pytest

from etforge.app.cli import main
from etforge.core import swap
from unit.test_unit_engine_run import Etforge

NAMES = {"tree": "t-0.0.1", "archive": "t-0.0.1.tar.gz", "bench": "t-0.0.1.bench.json"}


def _release(parent: Path, which: str, files: int = 1) -> None:
    """What one release leaves in ``parent`` (each file says which release it is)."""
    tree = parent / NAMES["tree"]
    tree.mkdir(parents=True)
    (tree / "provenance.json").write_text(which)
    for i in range(files - 1):  # (a directory that takes a moment to remove)
        (tree / f"f{i}").write_text(which)
    (parent / NAMES["archive"]).write_text(which)
    (parent / NAMES["bench"]).write_text(which)


def _staged(parent: Path, which: str) -> Path:
    staging = swap.new_staging(parent, ".release-")
    (staging / "tree").mkdir()
    (staging / "tree" / "provenance.json").write_text(which)
    (staging / "archive").write_text(which)
    (staging / "bench").write_text(which)
    return staging


def _which(parent: Path) -> set:
    """Which releases the three paths come from (one name: a whole release)."""
    return {
        (parent / NAMES["tree"] / "provenance.json").read_text(),
        (parent / NAMES["archive"]).read_text(),
        (parent / NAMES["bench"]).read_text(),
    }


def _swap_in_child(parent: Path, staging: Path, how: signal.Signals) -> int | None:
    """Run swap_in in a forked child; send it ``how`` as soon as its journal is written."""
    child = get_context("fork").Process(target=swap.swap_in, args=(staging, NAMES))
    child.start()
    deadline = time.monotonic() + 30
    while not (staging / swap.JOURNAL).exists() and child.is_alive() and time.monotonic() < deadline:
        time.sleep(0.0005)
    os.kill(child.pid, how)
    child.join()
    return child.exitcode


def test_a_swap_killed_midway_is_completed_by_finish(tmp_path):
    _release(tmp_path, "old", files=5000)
    staging = _staged(tmp_path, "new")
    assert _swap_in_child(tmp_path, staging, signal.SIGKILL) == -signal.SIGKILL
    assert staging.exists()  # killed before the swap ended: the journal is still there
    swap.finish(staging)
    assert _which(tmp_path) == {"new"} and not staging.exists()


def test_ctrl_c_waits_until_the_swap_is_done(tmp_path):
    _release(tmp_path, "old", files=5000)
    staging = _staged(tmp_path, "new")
    _swap_in_child(tmp_path, staging, signal.SIGINT)  # (its KeyboardInterrupt comes once the swap is done)
    assert _which(tmp_path) == {"new"} and not staging.exists()


def test_a_staging_that_never_committed_is_dropped_and_the_old_release_stays(tmp_path):
    _release(tmp_path, "old")
    staging = _staged(tmp_path, "new")  # (a kill before the journal was written)
    swap.finish(staging)
    assert _which(tmp_path) == {"old"} and not staging.exists()


@pytest.mark.parametrize(
    "journal",
    [
        {"moves": {"tree": "../outside"}, "removals": []},
        {"moves": {}, "removals": ["/etc"]},
        ["t"],
        {"moves": {"../x": "t-0.0.1"}, "removals": []},
    ],
)
def test_a_damaged_journal_writes_and_removes_nothing(tmp_path, journal):
    _release(tmp_path / "release", "old")
    (tmp_path / "outside").mkdir()
    staging = _staged(tmp_path / "release", "new")
    (staging / swap.JOURNAL).write_text(json.dumps(journal))
    swap.finish(staging)
    assert _which(tmp_path / "release") == {"old"} and (tmp_path / "outside").is_dir() and not staging.exists()


def test_the_next_run_completes_a_release_killed_midway(unit_project, monkeypatch, capfd):
    etforge = Etforge(unit_project, monkeypatch, capfd)
    first = etforge("release")
    assert first.code == 0, first.err
    release = unit_project.root / "artifacts" / "release"
    for i in range(5000):
        (release / NAMES["tree"] / f"f{i}").write_text("old")
    staging = _staged(release, "new")
    assert _swap_in_child(release, staging, signal.SIGKILL) == -signal.SIGKILL
    assert staging.exists()
    run = etforge("export")  # any run: it completes the swap under the run lock before anything reads
    assert run.code == 0, run.out + run.err
    assert _which(release) == {"new"} and not staging.exists()


def test_diff_refuses_a_release_whose_swap_was_interrupted(unit_project, monkeypatch, capfd):
    """Before the next run completes it, a release killed mid-swap may be a new directory beside an
    old archive: diff names that, exit 2, and compares with neither."""
    etforge = Etforge(unit_project, monkeypatch, capfd)
    assert etforge("release").code == 0
    release = unit_project.root / "artifacts" / "release"
    for i in range(5000):
        (release / NAMES["tree"] / f"f{i}").write_text("old")
    staging = _staged(release, "new")
    assert _swap_in_child(release, staging, signal.SIGKILL) == -signal.SIGKILL
    for baseline in (release / NAMES["tree"], release / NAMES["archive"]):
        capfd.readouterr()
        code = main(["diff", "--baseline", str(baseline)])
        err = capfd.readouterr().err
        assert code == 2 and "its replacement was interrupted" in err and err.count("\n") == 1, err
