"""The etforge command end to end, in-process, with fake builders: doit's runner, worker, records, exit.

``etforge.app.cli.main`` runs on a small project (6 cells: models a and b on xnnpack fp32 and
fp16, and portable fp32) with a stage table of fake builders (``unit.fake_builders.TABLE``)
(small blobs, typed results; the fake program carries etforge's metadata, so the manifests,
the report and the release work on it). Everything else is the real engine: the loader, the
task dicts and their up-to-date checks, the forked worker process, the store, the records, summary.json, the publishing stages and the
exit status.
"""

from __future__ import annotations

import hashlib
import json
import re
import tarfile
from dataclasses import dataclass

import pytest

from etforge.app.cli import main
from unit import fake_builders
from unit.support import PIPELINE, UnitProject

START_LINE = re.compile(r"^\[\d\d:\d\d:\d\d\] start\s+(\S+)$", re.M)
CELLS = ("a/xnnpack/fp32", "a/xnnpack/fp16", "a/portable/fp32", "b/xnnpack/fp32", "b/xnnpack/fp16", "b/portable/fp32")
# The tasks of `etforge export validate`.
ALL_TASKS = (
    {"capture:a", "capture:b", "quantize:a/fp16/float16", "quantize:b/fp16/float16"}
    | {f"export:{c}" for c in CELLS}
    | {f"validate:{c}" for c in CELLS}
)
# The tasks of a plain `etforge` (every stage but release).
DEFAULT_TASKS = (
    ALL_TASKS
    | {"sizegate:a/xnnpack/fp16", "sizegate:b/xnnpack/fp16"}
    | {f"benchmark:{c}" for c in CELLS}
    | {"manifest", "report"}
)


@dataclass
class Run:
    code: int
    out: str  # the reporter's lines and the summary table
    err: str  # etforge's own lines (the run's real stderr)
    calls: list  # (task, builder) of the fake builders this run called

    @property
    def started(self) -> set:
        return set(START_LINE.findall(self.out))


class Etforge:
    """``etforge ARGS`` in ``project``'s directory, in this process; one Run per call."""

    def __init__(self, project: UnitProject, monkeypatch, capfd):
        self.project, self.capfd, self.runs = project, capfd, 0
        monkeypatch.chdir(project.root)

    def __call__(self, *args: str) -> Run:
        self.runs += 1
        out = self.project.root / f"run{self.runs}.out"
        before = len(fake_builders.calls(self.project.root))
        self.capfd.readouterr()
        already = fake_builders.heavy_modules()  # loaded by an earlier test file of this xdist worker
        code = main(["-o", str(out), *args], fake_builders.TABLE)
        err = self.capfd.readouterr().err
        calls = fake_builders.calls(self.project.root)[before:]
        assert not fake_builders.torch_seen(self.project.root, already), "a worker process imported torch"
        return Run(code=code, out=out.read_text(), err=err, calls=calls)

    def control(self, **settings) -> None:
        """What the fake builders do from now on (fakes.json; read in the worker)."""
        (self.project.root / fake_builders.CONTROL).write_text(json.dumps(settings))

    def summary(self) -> dict:
        rows = json.loads((self.project.out / "summary.json").read_text())
        return {r["cell"]: r for r in rows}

    def statuses(self) -> dict:
        return {cell: row["status"] for cell, row in self.summary().items() if cell in CELLS}

    def record(self, task: str) -> dict:
        name = task.replace(":", "__").replace("/", "__")
        return json.loads((self.project.out / ".state" / f"{name}.json").read_text())


@pytest.fixture
def etforge(unit_project, monkeypatch, capfd) -> Etforge:
    return Etforge(unit_project, monkeypatch, capfd)


PROVISIONAL = dict.fromkeys(CELLS, "provisional")


def test_a_first_run_builds_every_task_once_and_a_second_run_executes_nothing(etforge):
    first = etforge("export", "validate")
    assert first.code == 0, first.out + first.err
    assert first.started == ALL_TASKS
    assert sorted(task for task, _ in first.calls) == sorted(ALL_TASKS)  # each builder ran once
    assert etforge.statuses() == PROVISIONAL
    assert etforge.record("export:a/xnnpack/fp32")["status"] == "ok"
    program = etforge.project.out / "a" / "a_xnnpack_fp32.pte"
    assert program.read_bytes().startswith(b"program a/xnnpack/fp32")
    second = etforge("export", "validate")
    assert second.code == 0, second.out + second.err
    assert second.started == set() and second.calls == []
    assert "0 task(s) run, 16 up to date" in second.out
    assert etforge.statuses() == PROVISIONAL


def test_a_changed_threshold_reruns_exactly_the_validate_tasks_of_that_scheme(etforge):
    assert etforge("export", "validate").code == 0
    etforge.project.write_pipeline(PIPELINE + "thresholds:\n  fp16: {sqnr_db: 36}\n")
    run = etforge("export", "validate")
    assert run.code == 0, run.out + run.err
    assert run.started == {"validate:a/xnnpack/fp16", "validate:b/xnnpack/fp16"}
    assert sorted(run.calls) == [("validate:a/xnnpack/fp16", "validate"), ("validate:b/xnnpack/fp16", "validate")]


def test_a_threshold_the_cells_miss_fails_them_and_only_them(etforge):
    etforge.control(sqnr_db=70.0)  # the fakes measure 70 dB: fp32's 60 and fp16's 35 pass, then 80 does not
    assert etforge("export", "validate").code == 0
    etforge.project.write_pipeline(PIPELINE + "thresholds:\n  fp16: {sqnr_db: 80}\n")
    run = etforge("export", "validate")
    assert run.code == 1
    assert etforge.statuses() == {
        **PROVISIONAL,
        "a/xnnpack/fp16": "failed",
        "b/xnnpack/fp16": "failed",
    }
    assert "sqnr_db 70.0 < 80" in etforge.summary()["a/xnnpack/fp16"]["note"]
    assert "2 failing: a/xnnpack/fp16, b/xnnpack/fp16" in run.err


FAILURES = {
    "raise": "export:a/xnnpack/fp32: RuntimeError: fake export broke on purpose",
    "exit": "export:a/xnnpack/fp32: SystemExit: the code called sys.exit(7)",
    "status": "export:a/xnnpack/fp32: backend 'xnnpack' runs 0% of the program's compute",
}


@pytest.mark.parametrize("how", FAILURES)
def test_a_failing_builder_fails_its_cell_and_the_others_still_build(etforge, how):
    etforge.control(fail={"export:a/xnnpack/fp32": how})
    run = etforge("export", "validate")
    assert run.code == 1, run.out + run.err
    assert run.started == ALL_TASKS  # one failing cell never stops the others
    assert etforge.statuses() == {**PROVISIONAL, "a/xnnpack/fp32": "failed"}
    row = etforge.summary()["a/xnnpack/fp32"]
    assert row["note"].startswith(FAILURES[how]) and "(log: " in row["note"]
    assert etforge.record("validate:a/xnnpack/fp32")["status"] == "blocked"
    assert "1 failing: a/xnnpack/fp32" in run.err
    # Fixed: the failure runs again (it was never cached), with what it blocked, and nothing else.
    etforge.control()
    again = etforge("export", "validate")
    assert again.code == 0, again.out + again.err
    assert again.started == {"export:a/xnnpack/fp32", "validate:a/xnnpack/fp32"}
    assert etforge.statuses() == PROVISIONAL


def test_a_builder_that_kills_its_worker_fails_its_own_task_and_the_run_finishes(etforge):
    etforge.control(fail={"export:b/portable/fp32": "os_exit"})
    run = etforge("export", "validate")
    assert run.code == 1, run.out + run.err
    assert run.started == ALL_TASKS
    record = etforge.record("export:b/portable/fp32")
    assert record["status"] == "failed"
    assert re.fullmatch(
        r"worker process \d+ exited with code 0 \(the task's code called os._exit\) while running it", record["reason"]
    )
    assert "etforge: export:b/portable/fp32: worker process" in run.err
    assert etforge.statuses() == {**PROVISIONAL, "b/portable/fp32": "failed"}
    assert etforge.record("validate:b/portable/fp32")["status"] == "blocked"
    # A fresh worker took the tasks after it: every other task ran its builder.
    assert {t for t, _ in run.calls} == ALL_TASKS - {"validate:b/portable/fp32"}


@pytest.mark.parametrize("workers", [(), ("-n", "2", "-P", "process")], ids=["in-process", "two-workers"])
def test_an_edit_during_a_run_never_makes_a_stale_program_current(etforge, workers):
    """Planned at version B, models/a.py back at A while capture:a runs: A's graph must not be
    stored under B's key. Put B back, and the next run builds B's program."""
    project = etforge.project
    version_a = (project.root / "models" / "a.py").read_text()
    version_b = version_a + "# version B\n"
    assert etforge("export", "validate").code == 0
    program = project.out / "a" / "a_xnnpack_fp32.pte"
    from_a = program.read_bytes()
    project.write("models/a.py", version_b)
    etforge.control(edit={"capture:a": {"path": "models/a.py", "text": version_a}})
    run = etforge(*workers, "export", "validate")
    assert run.code == 1, run.out + run.err
    assert run.err.count("models/a.py changed while this task ran") == 1, run.err
    record = etforge.record("capture:a")
    assert record["status"] == "failed" and record["retry"] is True
    assert {c for c, s in etforge.statuses().items() if s == "failed"} == {c for c in CELLS if c.startswith("a/")}
    assert run.calls == [("capture:a", "capture")]  # (b's tasks were up to date)
    # B back: capture:a runs again (its failure was never stored), and so does what reads it.
    etforge.control()
    project.write("models/a.py", version_b)
    again = etforge("export", "validate")
    assert again.code == 0, again.out + again.err
    assert {t for t in again.started if t.endswith(":a") or ":a/" in t} == {t for t in ALL_TASKS if ":a" in t}
    assert program.read_bytes() != from_a
    assert etforge("export", "validate").started == set()


def test_an_edit_to_a_file_a_task_does_not_read_keeps_its_result(etforge):
    """models/b.py edited while capture:a runs: capture:a's result stands; b's tasks, planned before
    the edit, are thrown away."""
    project = etforge.project
    etforge.control(edit={"capture:a": {"path": "models/b.py", "text": "def build():\n    return 1\n"}})
    run = etforge("export", "validate")
    assert run.code == 1, run.out + run.err
    assert etforge.record("capture:a")["status"] == "ok"
    assert etforge.record("capture:b")["status"] == "failed"
    assert "capture:b: models/b.py changed while this task ran" in run.err
    assert {c for c, s in etforge.statuses().items() if s == "provisional"} == {c for c in CELLS if c.startswith("a/")}
    etforge.control()
    assert etforge("export", "validate").code == 0  # planned from b.py as it is now
    assert project.root.joinpath("models", "b.py").read_text().startswith("def build():\n    return 1")


def test_two_workers_build_the_same_matrix(etforge):
    run = etforge("-n", "2", "-P", "process", "export", "validate")
    assert run.code == 0, run.out + run.err
    assert run.started == ALL_TASKS and sorted(t for t, _ in run.calls) == sorted(ALL_TASKS)
    assert etforge.statuses() == PROVISIONAL
    assert etforge("export", "validate").started == set()


def test_a_damaged_cache_entry_is_rebuilt_by_the_next_run_and_nothing_downstream_runs(etforge):
    assert etforge("export", "validate").code == 0
    spec_dir = etforge.project.root / "artifacts" / "cache"
    capture_key = etforge.record("capture:a")["key"]
    blob = spec_dir / capture_key[:2] / capture_key / "model.pt2"
    blob.write_bytes(blob.read_bytes()[::-1])  # same size, other bytes (and a new mtime)
    run = etforge("export", "validate")
    assert run.code == 0, run.out + run.err
    assert run.started == {"capture:a"}  # its key did not change: the programs built from it stand
    assert run.calls == [("capture:a", "capture")]
    assert blob.read_bytes().startswith(b"graph of")


def test_a_selection_runs_only_its_cells(etforge):
    run = etforge("export", "--models", "b", "--backends", "portable")
    assert run.code == 0, run.out + run.err
    assert run.started == {"capture:b", "export:b/portable/fp32"}
    assert etforge.statuses() == {"b/portable/fp32": "not validated"}


# ---------------------------------------------------------------- the default run: manifests and report


def index(etforge) -> dict:
    return json.loads((etforge.project.out / "manifests" / "index.json").read_text())


def shipped(etforge) -> list:
    return sorted(entry["name"] for entry in index(etforge)["models"])


def stem(cell: str) -> str:
    return cell.replace("/", "_")


def test_the_manifests_ship_exactly_the_passing_cells_and_list_the_failed_one(etforge):
    etforge.control(fail={"export:a/portable/fp32": "raise"})
    run = etforge()
    assert run.code == 1, run.out + run.err
    assert run.started == DEFAULT_TASKS
    assert shipped(etforge) == sorted(stem(c) + ".pte" for c in CELLS if c != "a/portable/fp32")
    excluded = {e["cell"]: e for e in index(etforge)["excluded"]}
    assert excluded["a/portable/fp32"]["status"] == "failed"
    assert (
        excluded["a/portable/fp32"]["reason"]
        == "export:a/portable/fp32 failed, log: logs/export__a__portable__fp32.log"
    )
    for entry in index(etforge)["models"]:  # each names the bytes it ships
        program = etforge.project.out / entry["category"] / entry["name"]
        assert entry["hash"] == hashlib.sha256(program.read_bytes()).hexdigest()
        assert entry["verdict"]["status"] == "provisional"
    html = (etforge.project.out / "report.html").read_text()
    assert 'data-cell="a/portable/fp32" data-status="failed"' in html
    assert 'data-cell="b/portable/fp32" data-status="provisional"' in html
    # The report ships in a release: its notes name a log as the manifests do, never this checkout's path.
    assert "(log: logs/export__a__portable__fp32.log)" in html and str(etforge.project.root) not in html
    # Fixed: the cell's own tasks run again, and the matrix-wide ones whose content changed.
    etforge.control()
    again = etforge()
    assert again.code == 0, again.out + again.err
    cell_tasks = {f"{s}:a/portable/fp32" for s in ("export", "validate", "benchmark")}
    assert again.started == cell_tasks | {"manifest", "report"}
    assert shipped(etforge) == sorted(stem(c) + ".pte" for c in CELLS)
    assert etforge().started == set()


def test_a_verdict_without_max_abs_error_still_gets_its_manifest(etforge):
    # an older or hand-edited record, or a non-finite value from_json drops: the manifests read
    # every metric by name, so the verdict gives each a null
    etforge.control(omit=["max_abs_error"])
    run = etforge()
    assert etforge.record("manifest")["status"] == "ok", etforge.record("manifest")["reason"]
    assert run.code == 0


# ---------------------------------------------------------------- release


def archive(etforge):
    return etforge.project.root / "artifacts" / "release" / "t-0.0.1.tar.gz"


def packed(etforge) -> dict:
    with tarfile.open(archive(etforge)) as tar:
        return {m.name.split("/", 1)[1]: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}


def test_a_release_packs_the_shipped_programs_and_is_byte_reproducible(etforge):
    run = etforge("release")
    assert run.code == 0, run.out + run.err
    files = packed(etforge)
    assert sorted(n for n in files if n.endswith(".pte")) == sorted(f"models/{stem(c)}.pte" for c in CELLS)
    for cell in CELLS:
        assert (
            files[f"models/{stem(cell)}.pte"]
            == (etforge.project.out / cell.split("/")[0] / f"{stem(cell)}.pte").read_bytes()
        )
    first = archive(etforge).read_bytes()
    again = etforge("release")
    assert again.started == {"release"}  # it re-checks its gates every time
    assert archive(etforge).read_bytes() == first


def test_a_release_names_the_pipeline_it_was_planned_from_or_refuses(etforge):
    """The provenance names the bytes of pipeline.yaml the plan read; edited during the run (a
    threshold raised, then committed), the release cannot name what it used: it refuses."""
    planned = etforge.project.pipeline.read_bytes()
    assert etforge("release").code == 0
    provenance = json.loads(packed(etforge)["provenance.json"])
    assert provenance["pipeline"]["sha256"] == hashlib.sha256(planned).hexdigest()
    edited = PIPELINE + "thresholds:\n  fp16: {sqnr_db: 50}\n"
    etforge.control(edit={"validate:b/xnnpack/fp16": {"path": "pipeline.yaml", "text": edited}})
    etforge.project.write_pipeline(PIPELINE + "thresholds:\n  fp16: {sqnr_db: 40}\n")  # reruns the fp16 verdicts
    run = etforge("release")
    assert run.code == 1, run.out + run.err
    assert "release refused: pipeline.yaml changed during this run" in run.err
    assert not archive(etforge).exists()
    etforge.control()
    again = etforge("release")
    assert again.code == 0, again.out + again.err
    provenance = json.loads(packed(etforge)["provenance.json"])
    assert provenance["pipeline"]["sha256"] == hashlib.sha256(edited.encode()).hexdigest()


def test_a_release_refuses_a_failed_cell_unless_told_to_pack_around_it(etforge):
    assert etforge("release").code == 0
    etforge.project.write_pipeline(PIPELINE + "thresholds:\n  fp16: {sqnr_db: 120}\n")  # the fakes measure 99
    refused = etforge("release")
    assert refused.code == 1
    assert not archive(etforge).exists()  # nothing old may look current
    assert etforge.record("release")["status"] == "failed"
    assert "a/xnnpack/fp16" in etforge.record("release")["reason"]
    allowed = etforge("release", "--allow-failures")
    assert allowed.code == 0, allowed.out + allowed.err
    files = packed(etforge)
    assert sorted(n for n in files if n.endswith(".pte")) == sorted(
        f"models/{stem(c)}.pte" for c in CELLS if not c.endswith("fp16")
    )
    provenance = json.loads(files["provenance.json"])
    assert "a/xnnpack/fp16" in json.dumps(provenance) and "b/xnnpack/fp16" in json.dumps(provenance)


@pytest.mark.parametrize(
    ("inputs", "packs"), [("random (seeded)", False), ("npz data/val.npz", True)], ids=["provisional", "ok"]
)
def test_a_strict_release_refuses_cells_validated_on_random_inputs_only(etforge, inputs, packs):
    etforge.control(inputs=inputs)
    run = etforge("release", "--strict")
    assert (run.code == 0) is packs, run.out + run.err
    assert archive(etforge).exists() is packs
