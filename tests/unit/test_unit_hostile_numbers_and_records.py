"""Issue 30, items 6, 7 and 13: numbers, records and arguments from elsewhere never break a run.

- a duration (``ci-matrix --durations``, a store entry's ``build_s``, a record's ``elapsed_s``) is a
  number from 0 to a week, or it is refused (a file given by hand: one line) or unused (an
  entry: a miss; a record: no duration), so no sum of them overflows;
- a manifest no reader could hold (nested too deep, an integer beyond a float) is a miss;
- a state record or a key's kept inputs, damaged in any way, is no record: one warning naming
  the file, and the task runs again; never a RecursionError, AttributeError or TypeError;
- an empty argument, or any name given to ``explain``, is one line;
- a non-UTF-8 ``ETFORGE_CACHE_KEY`` signs with its bytes.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os

import pytest

from etforge.app.cli import main
from etforge.cache.entries import MAX_SECONDS, CorruptEntry, parse_manifest
from etforge.cache.records import read_state
from etforge.cache.store import Store
from unit.support import make_unit_project
from unit.test_unit_engine_run import Etforge

EXPORT = "export:a/xnnpack/fp32"
DEEP = "[" * 100_000 + "]" * 100_000


@pytest.fixture
def etforge(unit_project, monkeypatch, capfd) -> Etforge:
    return Etforge(unit_project, monkeypatch, capfd)


def etforge_lines(capfd, *args) -> tuple:
    """(exit code, stdout, stderr) of ``etforge ARGS`` in this process (commands that run no task)."""
    capfd.readouterr()
    code = main(list(args))
    out, err = capfd.readouterr()
    return code, out, err


def state_file(etforge: Etforge, task: str):
    return etforge.project.out / ".state" / (task.replace(":", "__").replace("/", "__") + ".json")


# ---------------------------------------------------------------- durations


@pytest.mark.parametrize(
    "text",
    [
        '{"capture:a": Infinity}',
        '{"capture:a": NaN}',
        '{"capture:a": 1e308, "capture:b": 1e308}',  # each finite, their sum is not
        '{"capture:a": -1}',
        '{"capture:a": 1' + "0" * 400 + "}",  # an int no float holds
        '{"capture:a": "12"}',
        '{"capture:a": [12]}',
        DEEP,
        '{"capture:a": ' + DEEP + "}",
    ],
    ids=["infinity", "nan", "huge", "negative", "huge-int", "string", "array", "deep", "deep-value"],
)
def test_durations_that_are_no_seconds_are_one_line_naming_the_file(etforge, capfd, tmp_path, text):
    path = tmp_path / "durations.json"
    path.write_text(text)
    code, out, err = etforge_lines(capfd, "ci-matrix", "--durations", str(path))
    assert code == 3 and out == ""
    assert err.startswith(f"etforge: error: {path}: --durations: ") and err.count("\n") == 1, err


def test_recorded_seconds_out_of_range_are_no_durations(etforge, capfd):
    assert etforge("export", "--models", "a").code == 0
    for task in ("capture:a", EXPORT):  # (the state records a CI job restores from the previous run)
        path = state_file(etforge, task)
        path.write_text(path.read_text().replace('"elapsed_s":', '"elapsed_s":1e308,"was":'))
    code, out, err = etforge_lines(capfd, "ci-matrix", "--models", "a")
    assert code == 0, err
    assert all(row["est_s"] < MAX_SECONDS for row in json.loads(out)["include"])


# ---------------------------------------------------------------- store entries


def _edit_manifests(manifests, **fields) -> None:
    for path in manifests:
        manifest = json.loads(path.read_text())
        manifest.update(fields)
        path.write_text(json.dumps(manifest))


def test_remote_entries_whose_build_seconds_are_out_of_range_are_misses_and_break_no_plan(
    etforge, capfd, tmp_path, monkeypatch
):
    remote = tmp_path / "remote"
    remote.mkdir()
    monkeypatch.setenv("ETFORGE_CACHE_REMOTE", f"file://{remote}")
    first = etforge("export", "--models", "a")
    assert first.code == 0, first.out + first.err
    manifests = sorted(remote.glob("*/*/manifest.json"))
    assert len(manifests) == len(first.started)
    _edit_manifests(manifests, build_s=1e308)  # one machine's entries, seen by every other
    fresh = Etforge(make_unit_project(tmp_path / "fresh"), monkeypatch, capfd)
    code, out, err = etforge_lines(capfd, "ci-matrix", "--models", "a")
    assert code == 0, err
    assert all(row["est_s"] < MAX_SECONDS for row in json.loads(out)["include"])  # estimated, not 1e308
    run = fresh("export", "--models", "a")
    assert run.code == 0, run.out + run.err
    assert sorted(task for task, _ in run.calls) == sorted(first.started)  # each a miss: built here
    assert run.err.count('"build_s" is not a number of seconds from 0 to 604800') == len(manifests), run.err
    assert "Traceback" not in run.out + run.err


@pytest.mark.parametrize("build_s", [1e308, -1.0, "3", None, 10**400])
def test_a_local_entry_whose_build_seconds_are_out_of_range_is_a_miss(tmp_path, build_s):
    blob = tmp_path / "program.pte"
    blob.write_bytes(b"program")
    key = "ab" * 32
    Store(tmp_path / "cache").put(key, {"program.pte": blob}, {"status": "ok"}, build_s=3.0)
    _edit_manifests([tmp_path / "cache" / key[:2] / key / "manifest.json"], build_s=build_s)
    store = Store(tmp_path / "cache")  # (a later run: nothing verified yet)
    assert store.build_seconds(key) is None
    assert store.get(key) is None


def _nested(depth: int):
    value: list = []
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.parametrize(
    "manifest",
    [
        {"files": {}, "info": {"deep": _nested(200)}},
        {"files": {}, "info": {"n": 10**400}},
        {"files": {"program.pte": {"sha256": "0" * 64, "size": 1 << 63}}},
    ],
    ids=["nested-deep", "huge-int", "huge-size"],
)
def test_a_manifest_no_reader_could_hold_is_corrupt(manifest):
    with pytest.raises(CorruptEntry):
        parse_manifest(json.dumps(manifest).encode())


# ---------------------------------------------------------------- state records


def _with(**fields):
    return lambda record: json.dumps({**record, **fields})


def _inputs(**fields):
    """The record's inputs edited, under another key (so that explain compares them)."""
    return lambda record: json.dumps({**record, "key": "f" * 64, "inputs": {**record["inputs"], **fields}})


DAMAGES = {
    "nested 100,000 deep": lambda record: DEEP,
    "not an object": lambda record: "[]",
    "no status": lambda record: json.dumps({k: v for k, v in record.items() if k != "status"}),
    "a number for the status": _with(status=5),
    "a number for the key": _with(key=5),
    "outputs that are no objects": _with(outputs={"program.pte": 5}),
    "an entry that is no object": _with(entry={"manifest.json": "x"}),
    "a number for the log": _with(status="failed", log=5),
    "upstream inputs that are a list": _inputs(upstream=[1]),
    "an upstream input that is a string": _inputs(upstream={"capture": "x"}),
    "a toolchain that is a list": _inputs(facts={"toolchain": ["torch"]}),
    "an upstream key that is a number": _inputs(upstream={"capture": {"task": "capture:a", "key": 5}}),
}


@pytest.mark.parametrize("damage", sorted(DAMAGES))
def test_a_damaged_record_is_no_record_and_its_task_runs_again(etforge, capfd, damage):
    assert etforge("export", "--models", "a").code == 0
    path = state_file(etforge, EXPORT)
    path.write_text(DAMAGES[damage](json.loads(path.read_text())))
    code, out, explain_err = etforge_lines(capfd, "explain", EXPORT)
    assert code == 0 and out == f"{EXPORT}: never run here (no record of a run under any key)\n", explain_err
    code, _, list_err = etforge_lines(capfd, "list", "--status")
    assert code == 0, list_err
    run = etforge("export", "--models", "a")
    assert run.code == 0, run.out + run.err
    assert EXPORT in run.started
    warnings = [line for line in (explain_err + list_err + run.err).splitlines() if line]
    assert len(warnings) == 1 and warnings[0].startswith(f"etforge: warning: {path}: damaged ("), warnings
    assert read_state(path)["status"] == "ok"  # whole again


def test_damaged_inputs_kept_by_key_are_no_inputs(etforge, capfd):
    assert etforge("export", "--models", "a").code == 0
    path = state_file(etforge, EXPORT)
    record = json.loads(path.read_text())
    del record["inputs"]  # (an older record: explain reads the inputs kept by key)
    path.write_text(json.dumps(record | {"key": "f" * 64}))
    kept = path.parent / "keys" / f"{'f' * 64}.json"
    kept.write_text(json.dumps({"upstream": [1], "facts": {}}))
    code, out, err = etforge_lines(capfd, "explain", EXPORT)
    assert code == 0, err
    assert out.startswith(f"{EXPORT}: its key changed (ffffffffffff…→") and out.count("\n") == 1, out
    assert err == f'etforge: warning: {kept}: damaged ("upstream" is not an object); read as if it were not there\n'


def test_damaged_inputs_of_the_current_key_are_written_again(etforge):
    assert etforge("export", "--models", "a").code == 0
    path = state_file(etforge, EXPORT)
    key = json.loads(path.read_text())["key"]
    kept = path.parent / "keys" / f"{key}.json"
    kept.write_text("[" * 1000)
    path.unlink()  # the task runs again, and keeps its key's inputs again
    assert etforge("export", "--models", "a").code == 0
    assert json.loads(kept.read_text())["upstream"]["capture"]["task"] == "capture:a"


# ---------------------------------------------------------------- arguments


@pytest.mark.parametrize(
    "argv",
    [["explain", ""], ["export", ""], [""], ["ci-matrix", "--durations", ""], ["list", "--status", ""]],
    ids=["explain", "export", "alone", "option-value", "list"],
)
def test_an_empty_argument_is_one_line(etforge, capfd, argv):
    code, out, err = etforge_lines(capfd, *argv)
    assert code == 3 and out == ""
    number = argv.index("") + 1
    assert err == f"etforge: error: argument {number} is empty: leave it out or give it a value\n"


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["x" * 5000], "no task named 'xxxx"),
        (["sizegate", "--backends", "portable"], "stage 'sizegate' has no task"),  # (fp16 is xnnpack's only)
    ],
    ids=["long", "stage-without-tasks"],
)
def test_explain_names_any_argument_in_one_short_line(etforge, capfd, args, said):
    code, out, err = etforge_lines(capfd, "explain", *args)
    assert code == 3 and out == ""
    assert err.startswith(f"etforge: error: explain: {said}") and err.count("\n") == 1 and len(err) < 200, err


# ---------------------------------------------------------------- ETFORGE_CACHE_KEY


def test_a_cache_key_that_is_not_utf8_signs_with_its_bytes(etforge, tmp_path, monkeypatch):
    remote = tmp_path / "remote"
    remote.mkdir()
    monkeypatch.setenv("ETFORGE_CACHE_REMOTE", f"file://{remote}")
    monkeypatch.setenv("ETFORGE_CACHE_KEY", os.fsdecode(b"secret\xff"))  # (os.environ: a surrogate escape)
    run = etforge("capture", "--models", "a")
    assert run.code == 0, run.out + run.err
    assert "Traceback" not in run.out + run.err
    (manifest,) = remote.glob("*/*/manifest.json")
    expected = hmac.new(b"secret\xff", manifest.read_bytes(), hashlib.sha256).hexdigest()
    assert (manifest.parent / "manifest.json.hmac").read_text() == expected
