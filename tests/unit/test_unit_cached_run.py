"""One cached task (etforge.engine.cached_run): build and store, restore, refuse, fail, in-process.

A real Store in tmp_path and fake build callables; every check reads what a user would
see: the task's state record, its working-tree files, the store, and whether the next
run considers the task up to date.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

import pytest

from etforge.cache.records import read_state
from etforge.cache.store import Store
from etforge.checks.numerics import Numerics
from etforge.engine.cached_run import is_up_to_date, run_cached
from etforge.pipeline.results import Blocked, BuildResult, Rejected, Skip, TaskStatus
from etforge.pipeline.specs import TaskSpec
from etforge.pipeline.stage_results import ExportResult, Verdict

PROGRAM = b"a lowered program"


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def key(text: str) -> str:
    return sha256(text.encode())


def make_spec(root: Path, name="export:m/xnnpack/fp32", key_text="inputs v1", *, store_only=False, **kw) -> TaskSpec:
    stem = name.replace(":", "__").replace("/", "__")
    outputs = {
        "program.pte": root / "out" / f"{stem}.pte",
        "export.json": None if store_only else root / "out" / f"{stem}.export.json",
    }
    return TaskSpec(
        name=name,
        key=key(key_text),
        outputs=outputs,
        state_file=root / "out" / ".state" / f"{stem}.json",
        log_file=root / "out" / "logs" / f"{stem}.log",
        **kw,
    )


class Build:
    """A fake builder: writes program.pte and export.json, returns an ExportResult; counts its calls."""

    def __init__(self, data: bytes = PROGRAM, status=TaskStatus.OK, raises: BaseException | None = None, result=None):
        self.data, self.status, self.raises, self.result = data, status, raises, result
        self.calls = 0

    def __call__(self, workdir: Path, upstream=None) -> BuildResult:
        self.calls += 1
        os.write(1, b"the builder's own output\n")  # stdout of the task (native code too): its log
        if self.raises is not None:
            raise self.raises
        (workdir / "program.pte").write_bytes(self.data)
        (workdir / "export.json").write_text('{"fake": true}')
        result = self.result or ExportResult(size_bytes=len(self.data), sha256=sha256(self.data))
        reason = "" if self.status == TaskStatus.OK else "delegation coverage 0.1 < 0.5"
        return BuildResult(
            files={"program.pte": workdir / "program.pte", "export.json": workdir / "export.json"},
            result=result,
            status=self.status,
            reason=reason,
        )


def never(workdir, upstream=None):
    raise AssertionError("the builder ran, but the result should have been restored")


@pytest.fixture
def store(tmp_path) -> Store:
    return Store(tmp_path / "artifacts" / "cache")


@pytest.fixture
def spec(tmp_path) -> TaskSpec:
    return make_spec(tmp_path)


def record(spec: TaskSpec) -> dict:
    found = read_state(spec.state_file)
    assert found is not None, f"no record at {spec.state_file}"
    return found


def flip_a_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[0] ^= 0xFF
    path.write_bytes(bytes(data))


def remove_working_tree(spec: TaskSpec) -> None:
    for target in spec.outputs.values():
        if target is not None:
            target.unlink(missing_ok=True)


# ---------------------------------------------------------------- build, store, restore


def test_a_built_result_is_stored_recorded_and_materialized_with_its_sha256(spec, store):
    build = Build()
    assert run_cached(spec, store, build) is True
    assert build.calls == 1
    rec = record(spec)
    assert (rec["status"], rec["key"], rec["cached"]) == ("ok", spec.key, False)
    assert rec["info"]["sha256"] == sha256(PROGRAM)  # the builder's result, as publishing reads it
    target = spec.outputs["program.pte"]
    assert target.read_bytes() == PROGRAM
    assert rec["outputs"]["program.pte"]["sha256"] == sha256(PROGRAM)
    assert rec["outputs"]["program.pte"]["path"] == str(target)
    assert rec["outputs"]["program.pte"]["size"] == len(PROGRAM)
    blobs, info = store.get(spec.key)
    assert blobs["program.pte"].read_bytes() == PROGRAM and info["status"] == "ok"
    assert rec["entry"]["program.pte"]["sha256"] == sha256(PROGRAM)
    assert "the builder's own output" in spec.log_file.read_text()
    assert is_up_to_date(spec, store)


def test_a_stored_entry_is_restored_without_building(tmp_path, spec, store):
    run_cached(spec, store, Build())
    # Another checkout sharing this cache: no record, no working-tree files.
    elsewhere = make_spec(tmp_path / "checkout2")
    assert elsewhere.key == spec.key and not is_up_to_date(elsewhere, store)
    assert run_cached(elsewhere, store, never) is True
    rec = record(elsewhere)
    assert (rec["status"], rec["cached"]) == ("ok", True)
    assert elsewhere.outputs["program.pte"].read_bytes() == PROGRAM
    assert rec["outputs"]["program.pte"]["sha256"] == sha256(PROGRAM)
    assert rec["info"]["sha256"] == sha256(PROGRAM)
    assert is_up_to_date(elsewhere, store)


def test_a_record_made_under_another_key_is_not_up_to_date_and_builds_again(tmp_path, spec, store):
    run_cached(spec, store, Build())
    changed = make_spec(tmp_path, key_text="inputs v2")  # same task and files, an input changed
    assert not is_up_to_date(changed, store)
    build = Build(data=b"the program of the new inputs")
    run_cached(changed, store, build)
    assert build.calls == 1
    assert changed.outputs["program.pte"].read_bytes() == b"the program of the new inputs"


# ---------------------------------------------------------------- failures are never cached


def _fails_by_status():
    return Build(status=TaskStatus.FAILED)


FAILURES = {
    "status failed": (_fails_by_status, "delegation coverage 0.1 < 0.5"),
    "raises": (lambda: Build(raises=RuntimeError("lowering broke\nsecond line")), "RuntimeError: lowering broke"),
    "sys.exit": (lambda: Build(raises=SystemExit(3)), "SystemExit: the code called sys.exit(3)"),
}


@pytest.mark.parametrize("how", FAILURES)
def test_a_failure_is_recorded_and_never_cached(spec, store, how):
    make, reason = FAILURES[how]
    assert run_cached(spec, store, make()) is True  # doit goes on: dependents run and say they are blocked
    rec = record(spec)
    assert (rec["status"], rec["reason"], rec["key"]) == ("failed", reason, spec.key)
    assert rec["log"] == str(spec.log_file) and spec.log_file.is_file()
    assert not store.has(spec.key)
    assert not is_up_to_date(spec, store)
    again = make()
    run_cached(spec, store, again)
    assert again.calls == 1  # it runs again, every time
    good = Build()
    run_cached(spec, store, good)
    assert good.calls == 1 and record(spec)["status"] == "ok" and is_up_to_date(spec, store)


def test_a_raised_failure_keeps_its_traceback_in_the_log(spec, store):
    run_cached(spec, store, Build(raises=RuntimeError("lowering broke\nsecond line")))
    log = spec.log_file.read_text()
    assert "Traceback" in log and "second line" in log and "the builder's own output" in log


def test_a_failed_result_shows_its_evidence_but_stores_nothing(spec, store):
    run_cached(spec, store, Build(status=TaskStatus.FAILED))
    rec = record(spec)
    assert spec.outputs["program.pte"].read_bytes() == PROGRAM  # e.g. the .pte that missed a gate
    assert rec["outputs"]["program.pte"]["sha256"] == sha256(PROGRAM)
    assert rec["info"]["sha256"] == sha256(PROGRAM) and rec["entry"] == {}
    assert not store.has(spec.key) and not is_up_to_date(spec, store)


OUTCOMES = {
    Skip: (TaskStatus.SKIPPED, True),  # what this host lacks is in the key: done until it changes
    Rejected: (TaskStatus.REJECTED, True),
    Blocked: (TaskStatus.BLOCKED, False),  # runs again once what it needs succeeds
}


@pytest.mark.parametrize("exception", OUTCOMES, ids=lambda e: e.__name__)
def test_skip_rejected_and_blocked_are_recorded_with_their_status(spec, store, exception):
    status, done = OUTCOMES[exception]
    build = Build(raises=exception("because of a reason"))
    run_cached(spec, store, build)
    rec = record(spec)
    assert (rec["status"], rec["reason"], rec["key"]) == (status, "because of a reason", spec.key)
    assert not store.has(spec.key)
    assert not spec.outputs["program.pte"].exists()
    assert is_up_to_date(spec, store) is done


def test_blocked_inputs_record_blocked_without_building(spec, store):
    def inputs():
        raise Blocked("export:m/xnnpack/fp32 failed")

    build = Build()
    run_cached(spec, store, build, inputs=inputs)
    assert build.calls == 0
    assert (record(spec)["status"], record(spec)["reason"]) == ("blocked", "export:m/xnnpack/fp32 failed")


def test_a_build_is_handed_what_inputs_fetched(spec, store):
    seen = []

    def build(workdir, upstream):
        seen.append(upstream)
        return Build()(workdir)

    run_cached(spec, store, build, inputs=lambda: {"graph": "the upstream entry"})
    assert seen == [{"graph": "the upstream entry"}]


# ---------------------------------------------------------------- a damaged or missing store


def test_a_corrupt_store_entry_is_discarded_and_rebuilt(spec, store):
    run_cached(spec, store, Build())
    flip_a_byte(store.entry_dir(spec.key) / "program.pte")
    remove_working_tree(spec)  # nothing to heal it from
    build = Build()
    run_cached(spec, store, build)
    assert build.calls == 1
    blobs, _ = store.get(spec.key)  # verifies every blob
    assert blobs["program.pte"].read_bytes() == PROGRAM
    assert spec.outputs["program.pte"].read_bytes() == PROGRAM
    assert record(spec)["cached"] is False and is_up_to_date(spec, store)


@pytest.mark.parametrize("damage", ["store deleted", "blob flipped"])
def test_a_lost_store_entry_is_put_back_from_the_working_tree(tmp_path, store, damage):
    spec = make_spec(tmp_path, keep_entry=True)  # an export: other tasks read its entry
    run_cached(spec, store, Build())
    if damage == "store deleted":
        shutil.rmtree(tmp_path / "artifacts" / "cache")  # rm -rf artifacts/cache
        assert not is_up_to_date(spec, store)  # its entry is gone: the tasks that read it could not
    else:
        # (bit rot may keep the blob's size and mtime: caught when a task reads the entry, as here)
        flip_a_byte(store.entry_dir(spec.key) / "program.pte")
    run_cached(spec, store, never)
    blobs, info = store.get(spec.key)
    assert blobs["program.pte"].read_bytes() == PROGRAM and info["sha256"] == sha256(PROGRAM)
    assert record(spec)["cached"] is True and is_up_to_date(spec, store)


def test_an_edited_working_tree_file_is_never_put_back_into_the_store(tmp_path, spec, store):
    run_cached(spec, store, Build())
    shutil.rmtree(tmp_path / "artifacts" / "cache")
    spec.outputs["program.pte"].write_bytes(b"edited by hand")
    build = Build()
    run_cached(spec, store, build)
    assert build.calls == 1
    assert store.get(spec.key)[0]["program.pte"].read_bytes() == PROGRAM
    assert spec.outputs["program.pte"].read_bytes() == PROGRAM


def test_an_entry_whose_status_is_not_a_stored_one_is_never_restored(spec, store):
    # A forged (or damaged) entry that says "failed": restoring it would cache a failure.
    source = spec.outputs["program.pte"].parent / "forged.pte"
    source.parent.mkdir(parents=True)
    source.write_bytes(b"forged")
    store.put(spec.key, {"program.pte": source}, {"status": "failed", "reason": "forged"})
    build = Build()
    run_cached(spec, store, build)
    assert build.calls == 1 and record(spec)["status"] == "ok"
    assert store.get(spec.key)[0]["program.pte"].read_bytes() == PROGRAM


# ---------------------------------------------------------------- accept: vetting a stored verdict


def verdict_build(program_sha256: str) -> Build:
    check = Numerics(passed=True, inputs="random (seeded)")
    return Build(data=b"numerics", result=Verdict(program_sha256=program_sha256, checks=(check,)))


def test_an_accept_that_refuses_a_stored_verdict_rebuilds_it(spec, store, capfd):
    run_cached(spec, store, verdict_build("old program"))
    current = "new program"

    def accept(info):
        judged = info.get("program_sha256")
        return None if judged == current else f"it judged {judged}"

    rebuilt = verdict_build(current)
    run_cached(spec, store, rebuilt, accept=accept)
    assert rebuilt.calls == 1
    assert "not using its stored result: it judged old program; running it again" in capfd.readouterr().err
    assert record(spec)["info"]["program_sha256"] == current
    assert store.get(spec.key)[1]["program_sha256"] == current  # the refused entry was replaced
    run_cached(spec, store, never, accept=accept)  # and the new one is accepted
    assert record(spec)["cached"] is True


def test_an_accept_that_cannot_decide_builds_instead(spec, store):
    run_cached(spec, store, verdict_build("p"))

    def accept(info):
        raise Blocked("the export it judges failed")

    build = Build(raises=Blocked("export failed"))
    run_cached(spec, store, build, accept=accept)
    assert build.calls == 1 and record(spec)["status"] == "blocked"


# ---------------------------------------------------------------- up to date: a JSON read and a stat per file


def test_a_working_tree_output_whose_stat_changed_is_out_of_date(spec, store):
    run_cached(spec, store, Build())
    assert is_up_to_date(spec, store)
    target = spec.outputs["program.pte"]
    st = target.stat()
    os.utime(target, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))  # same bytes, touched
    assert not is_up_to_date(spec, store)
    run_cached(spec, store, never)  # the next run restores it from the store
    assert is_up_to_date(spec, store)
    target.unlink()
    assert not is_up_to_date(spec, store)


def test_a_task_whose_entry_others_read_is_up_to_date_only_while_the_entry_is_there(tmp_path, store):
    spec = make_spec(tmp_path, keep_entry=True)
    run_cached(spec, store, Build())
    assert is_up_to_date(spec, store)
    store.discard(spec.key)
    assert not is_up_to_date(spec, store)


def test_a_store_only_output_is_checked_in_the_store(tmp_path, store):
    spec = make_spec(tmp_path, store_only=True)
    run_cached(spec, store, Build())
    assert not (tmp_path / "out" / "export.json").exists() and record(spec)["outputs"].keys() == {"program.pte"}
    assert is_up_to_date(spec, store)
    store.discard(spec.key)
    assert not is_up_to_date(spec, store)


def test_a_verdict_is_up_to_date_only_for_the_program_it_judged(tmp_path, store):
    export = make_spec(tmp_path, keep_entry=True)
    validate = make_spec(tmp_path, "validate:m/xnnpack/fp32", "validate inputs", judges=export)
    run_cached(export, store, Build())
    run_cached(validate, store, verdict_build(sha256(PROGRAM)))
    assert is_up_to_date(validate, store)
    # The export is rebuilt under the same key with other bytes (a non-reproducible backend).
    store.discard(export.key)
    remove_working_tree(export)
    run_cached(export, store, Build(data=b"other bytes"))
    assert is_up_to_date(export, store)
    assert not is_up_to_date(validate, store)


@pytest.mark.parametrize("edit", ["not json", "unknown status", "no key"])
def test_a_damaged_record_is_never_up_to_date(spec, store, edit):
    run_cached(spec, store, Build())
    text = spec.state_file.read_text()
    if edit == "not json":
        text = text[: len(text) // 2]
    elif edit == "unknown status":
        text = text.replace('"status":"ok"', '"status":"fine"')
    else:
        text = text.replace(spec.key, "")
    spec.state_file.write_text(text)
    assert not is_up_to_date(spec, store)


def test_an_unwritable_store_fails_the_task_and_says_why(tmp_path, spec, capfd):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the store should be")
    store = Store(blocker / "cache")
    assert run_cached(spec, store, Build()) is True
    rec = record(spec)
    assert rec["status"] == "failed" and "not-a-dir" in rec["reason"]
    assert f"etforge: {spec.name}: " in capfd.readouterr().err
    assert not is_up_to_date(spec, store)
