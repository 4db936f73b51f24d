"""``etforge diff`` against baselines that are hostile, noisy or replaced, in-process (no torch).

Hostile: a provenance.json (in a release directory or a .tar.gz) or a .bench.json that is a
FIFO, malformed, nested 200,000 deep, holds odd types, 5,000-digit integers or non-finite
numbers is one line ``etforge: error: ...`` naming the file and what is wrong, exit 2: never a
traceback, never a hang (the FIFO tests run the command in a thread with a timeout, so a
regression fails rather than hangs the suite). Noisy: two clean builds of one revision on one
host diff clean, and a real slowdown is still a regression. Replaced: the report's "changes
since" section reads a baseline again once its files were replaced at the same path, even by
ones of the same size and mtime.
"""

from __future__ import annotations

import copy
import io
import json
import os
import shutil
import tarfile
import threading
import time

import pytest

from etforge.app.cli import main
from etforge.config import defaults
from etforge.config.digest_cache import RACY_NS
from etforge.publish import diff, diff_baseline, diff_pointer, diff_section
from unit.support import PIPELINE, make_unit_project
from unit.test_unit_engine_run import Etforge

THRESHOLDS = "thresholds:\n  fp16: {sqnr_db: 30}\n"


@pytest.fixture
def project(tmp_path):
    return make_unit_project(tmp_path / "proj", PIPELINE + THRESHOLDS)


@pytest.fixture
def etforge(project, monkeypatch, capfd):
    return Etforge(project, monkeypatch, capfd)


def diff_cli(capfd, *args: str, timeout: float = 60.0) -> tuple:
    """(exit status, stdout, stderr) of ``etforge diff ARGS`` in this process, in a thread: a read
    that blocks (a FIFO) fails the test after ``timeout`` seconds instead of hanging the suite."""
    capfd.readouterr()
    done: dict = {}

    def run():
        try:
            done["code"] = main(["diff", *args])
        except SystemExit as exc:
            done["code"] = exc.code
        except BaseException as exc:  # reported below: a traceback is a failure
            done["raised"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout)
    assert not thread.is_alive(), f"etforge diff {' '.join(args)} still runs after {timeout} s: it blocked"
    assert "raised" not in done, f"etforge diff raised {done.get('raised')!r}"
    out, err = capfd.readouterr()
    return done["code"], out, err


# ---------------------------------------------------------------- a hand-made release to break


def _provenance() -> dict:
    figure = {"value": 60.0, "unit": " dB", "better": "higher", "tolerance": "sqnr_db", "relative": False}
    metrics = {"format": 2, "program": {"bytes": 100}, "checks": {"numerics": {"figures": {"sqnr_db": figure}}}}
    cell = {"model": "a", "backend": "xnnpack", "quantization": "fp32", "status": "ok", "sha256": "1" * 64}
    cell.update(thresholds={"sqnr_db": 60}, metrics=metrics)
    return {
        "format": "etforge-provenance/3",
        "release": "t-0.0.1",
        "pipeline": {"name": "t"},
        "toolchain": {"torch": "2.0"},
        "cells": [cell],
        "failures": [],
        "not_shipped": [{"cell": "a/portable/fp16", "status": "rejected"}],
    }


BENCH = {"a/xnnpack/fp32": {"latency_p50_ms": 1.0, "latency_stdev_ms": 0.01, "host_id": "h"}}


def _release(project, text: str | bytes | None = None, bench: str | None = None):
    """A release directory ``rel/t-0.0.1`` (and its .bench.json) holding ``text`` as provenance.json."""
    directory = project.root / "rel" / "t-0.0.1"
    if directory.parent.exists():
        shutil.rmtree(directory.parent)
    directory.mkdir(parents=True)
    data = json.dumps(_provenance()) if text is None else text
    (directory / "provenance.json").write_bytes(data.encode() if isinstance(data, str) else data)
    (directory.parent / "t-0.0.1.bench.json").write_text(json.dumps(BENCH) if bench is None else bench)
    return directory


def _edited(edit) -> str:
    data = _provenance()
    edit(data)
    return json.dumps(data)


def _cell(data: dict) -> dict:
    return data["cells"][0]


DEEP = "[" * 200_000 + "]" * 200_000
HOSTILE_PROVENANCE = {
    "cells is a number": (_edited(lambda d: d.update(cells=5)), "cells: expected a list, got a number"),
    "failures is a number": (_edited(lambda d: d.update(failures=5)), "failures: expected a list, got a number"),
    "metrics is a list": (
        _edited(lambda d: _cell(d).update(metrics=[1, 2])),
        "cells[0].metrics: expected an object, got a list",
    ),
    "lists for figures": (
        _edited(lambda d: _cell(d)["metrics"]["program"].update(bytes=[100])),
        "cells[0].metrics.program.bytes: expected a number, got a list",
    ),
    "checks is a list": (
        _edited(lambda d: _cell(d)["metrics"].update(checks=[{"figures": {}}])),
        "cells[0].metrics.checks: expected an object, got a list",
    ),
    "an integer sha256": (_edited(lambda d: _cell(d).update(sha256=12345)), "cells[0].sha256: expected a string"),
    "a dict status": (_edited(lambda d: _cell(d).update(status={"ok": 1})), "cells[0].status: expected a string"),
    "a cell without a model": (_edited(lambda d: _cell(d).pop("model")), "cells[0].model: a string is required"),
    "a string metrics format": (
        _edited(lambda d: _cell(d)["metrics"].update(format="2")),
        "cells[0].metrics.format: expected a number, got a string",
    ),
    "older metrics with a number of outputs": (
        _edited(lambda d: _cell(d).update(metrics={"numerics": {"outputs": 5}})),
        "cells[0].metrics.numerics.outputs: expected a list",
    ),
    "a list toolchain": (_edited(lambda d: d.update(toolchain=["torch"])), "toolchain: expected an object"),
    "a string pipeline": (_edited(lambda d: d.update(pipeline="t")), "pipeline: expected an object, got a string"),
    "a listed cell without a name": (
        _edited(lambda d: d.update(not_shipped=[{"status": "rejected"}])),
        "not_shipped[0].cell: a string is required",
    ),
    "a 5,000-digit format": (
        _edited(lambda d: d.update(format="etforge-provenance/" + "9" * 5000)),
        "has no etforge format",
    ),
    "a 5,000-digit integer": (
        json.dumps(_provenance()).replace('"bytes": 100', '"bytes": ' + "9" * 5000),
        "holds an integer of 5,000 digits",
    ),
    "a 400-digit integer (beyond a float)": (
        json.dumps(_provenance()).replace('"bytes": 100', '"bytes": ' + "9" * 400),
        "holds an integer of 400 digits",
    ),
    "200,000 levels of nesting": (
        '{"format": "etforge-provenance/3", "cells": ' + DEEP + "}",
        "nests deeper than 64 levels",
    ),
    "deep nesting where a number belongs": (
        _edited(lambda d: _cell(d).update(thresholds={"sqnr_db": json.loads("[" * 500 + "]" * 500)})),
        "provenance.json: nests deeper than 64 levels",  # refused as it is parsed, before its shape
    ),
    "a NaN figure": (
        json.dumps(_provenance()).replace('"value": 60.0', '"value": NaN'),
        "checks.numerics.figures.sqnr_db.value: expected a number, got NaN",
    ),
    "an infinite size": (
        json.dumps(_provenance()).replace('"bytes": 100', '"bytes": 1e999'),
        "cells[0].metrics.program.bytes: expected a number, got a number out of range",
    ),
    "not JSON": ('{"format": ', "is not JSON"),
    "not UTF-8": (b'{"format": "\xff"}', "is not UTF-8 text"),
    "not an object": ("[1, 2]", "not a JSON object"),
}


def _one_error_line(code, err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, (code, err)
    assert lines[0].startswith("etforge: error: baseline "), lines[0]
    return lines[0]


def test_the_hand_made_release_these_tests_break_is_one_diff_compares_with(project, monkeypatch, capfd):
    monkeypatch.chdir(project.root)
    code, out, err = diff_cli(capfd, "--baseline", str(_release(project)))
    assert code in (0, 1) and "changes since " in out and "error" not in err, (code, out, err)


@pytest.mark.parametrize("case", sorted(HOSTILE_PROVENANCE))
def test_a_hostile_provenance_is_one_line_naming_the_file_and_exit_2(case, project, monkeypatch, capfd):
    monkeypatch.chdir(project.root)
    text, says = HOSTILE_PROVENANCE[case]
    release = _release(project, text)
    line = _one_error_line(*diff_cli(capfd, "--baseline", str(release))[::2])
    assert says in line and "provenance.json" in line, line


@pytest.mark.parametrize(
    "bench, says",
    [
        ("[1]", "expected an object, got a list"),
        (json.dumps({"a/xnnpack/fp32": {"llm": [1]}}), '["a/xnnpack/fp32"].llm: expected an object, got a list'),
        ('{"a/xnnpack/fp32": {"latency_p50_ms": Infinity}}', "latency_p50_ms: expected a number, got a number out"),
        (json.dumps({"a/xnnpack/fp32": {"host_id": {"x": 1}}}), "host_id: expected a string, got an object"),
        ("[" * 100_000, "nests deeper than 64 levels"),
    ],
    ids=["a list", "a list for llm", "an infinite p50", "an object host_id", "100,000 levels"],
)
def test_a_hostile_bench_json_is_one_line_naming_it_and_exit_2(bench, says, project, monkeypatch, capfd):
    monkeypatch.chdir(project.root)
    release = _release(project, bench=bench)
    line = _one_error_line(*diff_cli(capfd, "--baseline", str(release))[::2])
    assert says in line and "t-0.0.1.bench.json" in line, line


def _archive(path, members: dict) -> None:
    """A .tar.gz of ``members`` (name -> bytes, or None for a FIFO member)."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            if data is None:
                info.type = tarfile.FIFOTYPE
                tar.addfile(info)
            else:
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    path.write_bytes(raw.getvalue())


@pytest.mark.parametrize("case", ["cells is a number", "200,000 levels of nesting", "a 5,000-digit integer"])
def test_an_archive_whose_provenance_is_hostile_is_one_line_and_exit_2(case, project, monkeypatch, capfd):
    monkeypatch.chdir(project.root)
    text, says = HOSTILE_PROVENANCE[case]
    _archive(project.root / "t-0.0.1.tar.gz", {"t-0.0.1/provenance.json": text.encode()})
    line = _one_error_line(*diff_cli(capfd, "--baseline", "t-0.0.1.tar.gz")[::2])
    assert says in line and "t-0.0.1/provenance.json in t-0.0.1.tar.gz" in line, line
    _archive(project.root / "fifo.tar.gz", {"t-0.0.1/provenance.json": None})  # a FIFO member: no provenance
    line = _one_error_line(*diff_cli(capfd, "--baseline", "fifo.tar.gz")[::2])
    assert "the archive has no provenance.json" in line, line


def _release_fifo(fifo) -> None:
    """Let a reader blocked on ``fifo`` go (a writer opens and closes it), so that a failed test
    leaves no thread behind."""
    try:
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
    except OSError:
        pass  # no reader waits on it


@pytest.mark.parametrize("which", ["provenance.json", "the archive", "bench.json"])
def test_a_fifo_baseline_is_refused_without_blocking(which, project, monkeypatch, capfd):
    monkeypatch.chdir(project.root)
    release = _release(project)
    fifo = {
        "provenance.json": release / "provenance.json",
        "the archive": project.root / "t-0.0.1.tar.gz",
        "bench.json": release.parent / "t-0.0.1.bench.json",
    }[which]
    fifo.unlink(missing_ok=True)
    os.mkfifo(fifo)
    given = str(fifo) if which == "the archive" else str(release)
    try:
        line = _one_error_line(*diff_cli(capfd, "--baseline", given, timeout=30)[::2])
    finally:
        _release_fifo(fifo)
    assert f"{fifo.name}: is a FIFO, not a regular file" in line, line


def test_a_provenance_larger_than_read_is_refused_unread(project, monkeypatch, capfd):
    monkeypatch.chdir(project.root)
    release = _release(project)
    with open(release / "provenance.json", "r+b") as f:
        f.truncate(65 << 20)  # sparse: nothing written, and nothing of it is read
    line = _one_error_line(*diff_cli(capfd, "--baseline", str(release))[::2])
    assert "provenance.json: is larger than 67,108,864 bytes" in line, line


def test_a_baseline_name_too_long_for_a_path_is_a_missing_baseline(project, monkeypatch, capfd):
    monkeypatch.chdir(project.root)
    line = _one_error_line(*diff_cli(capfd, "--baseline", "x" * 5000)[::2])
    assert "is missing" in line, line


# ---------------------------------------------------------------- noise is not a regression


def _latency_kinds(before: dict, after: dict, **tolerances) -> dict:
    cell = {"status": "ok", "metrics": {}}
    tol = {**defaults.DIFF_TOLERANCES, **tolerances}
    current = {"cells": {"m/x/fp32": cell}, "timings": {"m/x/fp32": after}}
    return {c.what: c.kind for c in diff.compare({"m/x/fp32": cell}, {"m/x/fp32": before}, current, tol)}


def _bench(p50: float, p90: float, stdev: float, **more) -> dict:
    return {"latency_p50_ms": p50, "latency_p90_ms": p90, "latency_stdev_ms": stdev, "host_id": "h", **more}


# Two clean builds of one revision on one host, (p50, p90, stdev) before and after: the red team's
# linreg (its p50s, with the spread linreg records), pairs measured on one 2-core host (same
# program, same revision), and a larger program 18 % slower, inside the spread it measured.
CLEAN_REBUILDS = {
    "linreg, the red team's": ((0.024, 0.031, 0.006), (0.046, 0.058, 0.011)),
    "linreg, xnnpack": ((0.0056, 0.0072, 0.0011), (0.0083, 0.009, 0.0011)),
    "a small CNN, portable": ((0.0521, 0.0539, 0.0016), (0.1091, 0.1145, 0.5932)),
    "a small CNN, xnnpack": ((0.0114, 0.0125, 0.0008), (0.0607, 0.0616, 0.0139)),
    "mobilenet, within its spread": ((1.1986, 1.37, 0.096), (1.41, 1.6, 0.11)),
}


@pytest.mark.parametrize("case", sorted(CLEAN_REBUILDS))
def test_a_clean_rebuild_is_not_a_latency_regression(case):
    before, after = CLEAN_REBUILDS[case]
    kinds = _latency_kinds(_bench(*before), _bench(*after))
    assert set(kinds.values()) == {"changed"}, kinds


def test_a_real_slowdown_well_outside_the_spread_is_still_a_regression_and_a_speedup_an_improvement():
    assert _latency_kinds(_bench(2.0, 2.2, 0.05), _bench(3.0, 3.3, 0.05)) == {"p50": "regression", "p90": "regression"}
    assert _latency_kinds(_bench(3.0, 3.3, 0.05), _bench(2.0, 2.2, 0.05))["p50"] == "improvement"
    # the timer floor hides no real slowdown of a fast program
    assert _latency_kinds(_bench(0.024, 0.03, 0.006), _bench(0.5, 0.6, 0.01))["p50"] == "regression"
    # latency_pct still decides above the floor: 25 % lets +20 % pass
    assert _latency_kinds(_bench(2.0, 2.2, 0.0), _bench(2.4, 2.64, 0.0))["p50"] == "regression"
    assert _latency_kinds(_bench(2.0, 2.2, 0.0), _bench(2.4, 2.64, 0.0), latency_pct=25)["p50"] == "changed"


def test_the_spread_of_both_runs_widens_the_timing_tolerance_and_noise_sigma_scales_it():
    quiet, noisy = _bench(2.0, 2.2, 0.0), _bench(2.5, 2.7, 0.2)  # +0.5 ms; 10 % is 0.2 ms
    assert _latency_kinds(quiet, noisy)["p50"] == "changed"  # + 2 x 0.2 ms: the current run's own spread
    assert _latency_kinds(quiet, noisy, noise_sigma=1)["p50"] == "regression"
    assert _latency_kinds(quiet, _bench(2.5, 2.7, 0.0))["p50"] == "regression"


def test_tokens_per_second_of_tiny_steps_are_noise_and_of_real_ones_are_judged():
    fast = _latency_kinds(
        _bench(1.0, 1.1, 0.0, llm={"decode_tok_s": 12000.0}), _bench(1.0, 1.1, 0.0, llm={"decode_tok_s": 9000.0})
    )
    assert fast == {"decode tok/s": "changed"}  # 0.083 -> 0.111 ms a token: under the timer floor
    slow = _latency_kinds(
        _bench(1.0, 1.1, 0.0, llm={"decode_tok_s": 100.0}), _bench(1.0, 1.1, 0.0, llm={"decode_tok_s": 80.0})
    )
    assert slow == {"decode tok/s": "regression"}


def _set_baseline_timings(kept, figures: dict) -> None:
    bench = kept / "t-0.0.1.bench.json"
    data = json.loads(bench.read_text())
    for timing in data.values():
        timing.update(figures)
    bench.write_text(json.dumps(data))


def test_diff_exits_0_on_timing_noise_and_1_on_a_real_slowdown_through_the_command(etforge, project, capfd):
    """Through release, the .bench.json beside it and the command: the current run's p50 is the
    fake benchmark's 1.25 ms."""
    assert etforge("release").code == 0
    kept = shutil.copytree(project.root / "artifacts" / "release", project.root / "baseline")
    _set_baseline_timings(kept, {"latency_p50_ms": 1.0, "latency_stdev_ms": 0.15})  # +25 %, inside 2 x 0.15 ms
    code, out, err = diff_cli(capfd, "--baseline", "baseline/t-0.0.1")
    assert code == 0 and "0 regression(s)" in out, out + err
    _set_baseline_timings(kept, {"latency_p50_ms": 0.5, "latency_stdev_ms": 0.01})  # 2.5 x, far outside
    code, out, err = diff_cli(capfd, "--baseline", "baseline/t-0.0.1")
    assert code == 1, out + err
    p50 = [line for line in out.splitlines() if " p50 " in line]
    assert p50 and all("regression" in line for line in p50), out


# ---------------------------------------------------------------- a replaced baseline is read again


def _replace_keeping_size_and_mtime(directory, old: str, new: str) -> None:
    """Replace release ``directory`` by a copy whose provenance.json has ``new`` for ``old`` (as
    long), with the same size and mtime (as ``tar x`` gives): another inode and ctime only."""
    provenance = directory / "provenance.json"
    before = provenance.stat()
    other = directory.with_name(directory.name + ".new")
    shutil.copytree(directory, other)
    text = provenance.read_text()
    assert len(old) == len(new) and old in text
    (other / "provenance.json").write_text(text.replace(old, new))
    os.utime(other / "provenance.json", ns=(before.st_atime_ns, before.st_mtime_ns))
    shutil.rmtree(directory)
    os.rename(other, directory)
    after = provenance.stat()
    assert (after.st_size, after.st_mtime_ns) == (before.st_size, before.st_mtime_ns)


def _section(project) -> str:
    report = (project.out / "report.html").read_text()
    assert "Changes since " in report
    return report.split('<h2 id="changes">', 1)[1].split("</h2>", 1)[1].split("</p>", 1)[0]


def test_the_reports_section_reads_a_baseline_replaced_with_the_same_size_and_mtime_again(etforge, project, capfd):
    assert etforge("release").code == 0
    kept = shutil.copytree(project.root / "artifacts" / "release", project.root / "baseline")
    time.sleep(RACY_NS / 1e9)  # old enough to vouch for its bytes: kept, not read again, while unchanged
    assert diff_cli(capfd, "--baseline", "baseline/t-0.0.1")[0] == 0
    assert etforge("report").code == 0
    assert "0 regression(s)" in _section(project) and "0 other change(s)" in _section(project)

    _replace_keeping_size_and_mtime(kept / "t-0.0.1", '"sqnr_db": 30', '"sqnr_db": 29')
    assert etforge("report").code == 0
    assert "2 other change(s)" in _section(project)  # the fp16 cells' threshold, as a fresh diff finds
    code, out, _ = diff_cli(capfd, "--baseline", "baseline/t-0.0.1")
    assert code == 0 and "2 other change(s)" in out


def test_a_kept_baseline_is_used_unread_while_unchanged_and_read_again_when_too_recent(project, monkeypatch):
    plan = project.plan()
    release = _release(project)
    fresh = diff_baseline.load(plan, str(release))
    assert not fresh.seen.trusted  # written just now: its signature cannot vouch for its bytes
    diff_section.remember(plan, fresh)
    reads: list = []
    real_read = diff_baseline.read

    def counted(*args):
        reads.append(args)
        return real_read(*args)

    monkeypatch.setattr(diff_baseline, "read", counted)
    assert diff_section.remembered(plan).cells == fresh.cells and len(reads) == 1  # read again

    time.sleep(RACY_NS / 1e9)
    diff_section.remember(plan, diff_baseline.load(plan, str(release)))
    reads.clear()
    assert diff_section.remembered(plan).cells == fresh.cells and reads == []  # the kept copy
    assert {f.name for f in diff_pointer.remembered_files(plan)} == {"provenance.json", "t-0.0.1.bench.json"}

    (release.parent / "t-0.0.1.bench.json").write_text(json.dumps({}))  # the timings replaced alone
    assert diff_section.remembered(plan).timings == {} and len(reads) == 1
    shutil.rmtree(release)
    assert diff_section.remembered(plan) is None  # gone: the section leaves the report


def test_a_damaged_or_blocking_pointer_drops_the_section_without_hanging(project):
    plan = project.plan()
    pointer = diff_pointer.path(plan)
    pointer.parent.mkdir(parents=True, exist_ok=True)
    for text in ("[1]", '{"given": 1}', "[" * 100_000, json.dumps({"given": "x", "source": "/x", "label": "x"})):
        pointer.write_text(text)
        assert diff_section.remembered(plan) is None and diff_pointer.remembered_source(plan) is None
    pointer.unlink()
    os.mkfifo(pointer)
    try:
        assert diff_section.remembered(plan) is None and diff_pointer.remembered_files(plan) == ()
    finally:
        _release_fifo(pointer)


def test_a_baseline_read_back_through_the_pointer_is_checked_as_a_release_is(project):
    plan = project.plan()
    diff_section.remember(plan, diff_baseline.load(plan, str(_release(project))))
    kept = json.loads(diff_pointer.path(plan).read_text())
    broken = copy.deepcopy(kept)
    broken["cells"]["a/xnnpack/fp32"]["metrics"]["checks"] = [1]
    diff_pointer.path(plan).write_text(json.dumps(broken))
    assert diff_section.remembered(plan) is None
