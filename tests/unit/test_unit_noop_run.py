"""What an unchanged pipeline costs: a no-op run decides each cell's outcome once and validates nothing.

The manifests' and the report's up-to-date checks, the exit status and the summary table all read
the cells' outcomes; the run's memo (etforge.publish.outcome_memo) decides each cell once, and
again only when a record it read changed. Schema validation is remembered by content
(etforge.config.validation_memo): a no-op run neither validates nor imports jsonschema, and a
bad file is still one file:line: key error, every time.
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import time
from collections import Counter

import pytest

import unit.test_unit_engine_run as engine_run
from etforge.cache.content_keys import FileSet
from etforge.cache.records import RunRecords
from etforge.config import recipes, schema, validation_memo
from etforge.config.machine import host_fingerprint
from etforge.config.resolve import resolve
from etforge.core.errors import PipelineError
from etforge.core.paths import RECIPE_DIR
from etforge.pipeline.specs import spec_of
from etforge.pipeline.stages import STAGE
from etforge.publish import outcome, outcome_memo
from etforge.publish.outcome_memo import RunOutcomes
from unit.support import PIPELINE

RACY_S = 0.15  # records older than this are trusted by their stat signature (outcome_memo.RACY_NS)


@pytest.fixture
def etforge(unit_project, monkeypatch, capfd) -> engine_run.Etforge:
    return engine_run.Etforge(unit_project, monkeypatch, capfd)


def count_decisions(monkeypatch) -> Counter:
    """Cell name -> how many times its outcome was decided (through the memo or around it)."""
    decided: Counter = Counter()
    decide = outcome.cell_outcome

    def counting(plan, cell, *args, **kwargs):
        decided[cell.name] += 1
        return decide(plan, cell, *args, **kwargs)

    monkeypatch.setattr(outcome_memo, "cell_outcome", counting)
    monkeypatch.setattr(outcome, "cell_outcome", counting)
    return decided


def test_a_no_op_run_decides_each_cell_once(etforge, monkeypatch):
    first = etforge()  # every default stage: the manifests and the report read every outcome
    assert first.code == 0, first.out + first.err
    assert {"manifest", "report"} <= first.started
    time.sleep(RACY_S)
    decided = count_decisions(monkeypatch)
    second = etforge()
    assert second.code == 0, second.out + second.err
    assert second.started == set(), second.out
    assert set(decided) == set(engine_run.CELLS)
    assert max(decided.values()) == 1, decided  # not once per reader (manifest, report, exit status, table)


def test_a_kept_outcome_is_decided_again_when_a_record_it_read_changes(etforge):
    assert etforge("export", "validate").code == 0
    time.sleep(RACY_S)
    plan = resolve(etforge.project.pipeline)
    cell = etforge.project.cell(plan, "a/xnnpack/fp32")
    run = RunOutcomes(plan, host_fingerprint())
    assert run.of(cell).status == "provisional"
    assert run.of(cell).status == "provisional" and run.decided == 1
    state = spec_of(plan, "validate", cell).state_file
    record = json.loads(state.read_text())
    record.update(status="failed", reason="measured 3 dB")
    tmp = state.with_name(state.name + ".new")
    tmp.write_text(json.dumps(record))
    os.replace(tmp, state)  # as records are written: a new inode, a fresh mtime
    assert run.of(cell).status == "failed"
    assert run.decided == 2


def count_content_builds(monkeypatch) -> Counter:
    """Stage name -> how many times its content (the manifests', the report's) was built."""
    built: Counter = Counter()
    for name in ("manifest", "report"):
        module, function = STAGE[name].matrix.content.split(":")
        real = getattr(importlib.import_module(module), function)

        def counting(*args, _real=real, _name=name, **kwargs):
            built[_name] += 1
            return _real(*args, **kwargs)

        monkeypatch.setattr(importlib.import_module(module), function, counting)
    return built


def test_a_no_op_run_builds_no_manifest_or_report_content(etforge, monkeypatch):
    assert etforge().code == 0
    time.sleep(RACY_S)
    assert etforge().started == set()  # keeps both content keys: every file they read is old enough
    built = count_content_builds(monkeypatch)
    third = etforge()
    assert third.code == 0, third.out + third.err
    assert third.started == set() and built == Counter(), (third.started, built)


def test_a_changed_benchmark_record_renders_the_report_again(etforge, monkeypatch):
    """A record the report reads changes while its task stays up to date: the kept key is not used."""
    assert etforge().code == 0
    time.sleep(RACY_S)
    assert etforge().started == set()
    state = etforge.project.out / ".state" / "benchmark__a__xnnpack__fp32.json"
    record = json.loads(state.read_text())
    record["info"]["latency_p50_ms"] = record["info"]["latency_p50_ms"] * 3
    tmp = state.with_name(state.name + ".new")
    tmp.write_text(json.dumps(record))
    os.replace(tmp, state)
    time.sleep(RACY_S)
    built = count_content_builds(monkeypatch)
    run = etforge()
    assert run.code == 0, run.out + run.err
    assert "report" in run.started and built["report"] >= 1, (run.started, built)
    assert "benchmark:a/xnnpack/fp32" not in run.started


def test_a_file_set_signature_sees_a_new_file_and_distrusts_a_fresh_one(tmp_path):
    (tmp_path / "out" / "logs").mkdir(parents=True)
    (tmp_path / "out" / "a.json").write_text("{}")
    files = FileSet(trees=(tmp_path / "out",), skip=(tmp_path / "out" / "logs",), files=(tmp_path / "b",))
    time.sleep(RACY_S)
    first, trusted = files.signature()
    assert trusted and files.signature() == (first, True)
    (tmp_path / "out" / "logs" / "x.log").write_text("written, never read")
    assert files.signature()[0] == first
    (tmp_path / "b").write_text("the baseline")
    second, trusted = files.signature()
    assert second != first and not trusted  # just written: its signature cannot vouch for its bytes
    (tmp_path / "out" / "sub").mkdir()
    (tmp_path / "out" / "sub" / "c.pte").write_bytes(b"x")
    assert files.signature()[0] != second


def test_a_no_op_plan_parses_no_recipe_and_an_edited_one_is_parsed_again(unit_project, monkeypatch):
    resolve(unit_project.pipeline)  # keeps every recipe it parsed, by the sha256 of its bytes
    parsed: list = []
    real = validation_memo.parse_yaml
    monkeypatch.setattr(validation_memo, "parse_yaml", lambda raw, name: parsed.append(name) or real(raw, name))
    recipes._load_file.cache_clear()  # a new run: nothing kept in this process
    resolve(unit_project.pipeline)
    assert parsed == []
    own = unit_project.root / "recipes" / "backends" / "portable.yaml"
    own.parent.mkdir(parents=True)
    text = (RECIPE_DIR / "backends" / "portable.yaml").read_text()
    own.write_text(text.replace("description: No delegate;", "description: Edited here; no delegate;"))
    recipes._load_file.cache_clear()
    plan = resolve(unit_project.pipeline)
    assert parsed == ["recipes/backends/portable.yaml"]
    assert plan.recipe_path.load("backend", "portable").description.startswith("Edited here")
    recipes._load_file.cache_clear()
    plan = resolve(unit_project.pipeline)
    assert parsed == ["recipes/backends/portable.yaml"]  # the edit is kept too
    kept = plan.recipe_path.load("backend", "portable")
    assert kept.description.startswith("Edited here")
    assert kept.data == real(own.read_bytes(), "portable.yaml").data


def test_a_no_op_plan_validates_nothing_and_a_bad_file_is_still_one_line(unit_project, monkeypatch):
    resolve(unit_project.pipeline)  # remembers that this pipeline and its recipes passed

    def refuse(*args):
        raise AssertionError("validated again")

    monkeypatch.setattr(schema, "_validate", refuse)
    monkeypatch.setattr("etforge.config.recipes._option_problems", refuse)
    resolve(unit_project.pipeline)
    monkeypatch.undo()
    unit_project.write_pipeline(
        PIPELINE.replace("quantization: [fp32, fp16]", "quantization: [fp32, fp16]\nmodles: {}")
    )
    for _ in range(2):  # a failure is never remembered
        with pytest.raises(PipelineError) as error:
            resolve(unit_project.pipeline)
        assert str(error.value) == f"{unit_project.pipeline}:14: modles: unknown key 'modles'; did you mean 'models'?"


def test_a_no_op_plan_imports_neither_jsonschema_nor_pyyaml(unit_project):
    resolve(unit_project.pipeline)
    code = (
        "import sys; from etforge.config.resolve import resolve; "
        f"resolve({str(unit_project.pipeline)!r}); print(sorted({{'jsonschema', 'yaml'}} & set(sys.modules)))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]", done.stderr
    unit_project.write_pipeline(PIPELINE.replace("quantization: [fp32, fp16]", "quantization: [fp16, fp32]"))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "['jsonschema', 'yaml']", done.stderr  # an edited file: parsed, validated


def test_a_run_parses_a_record_once_while_its_file_is_unchanged(tmp_path):
    path = tmp_path / "export__a.json"
    records = RunRecords()
    assert records.state(path) == (None, None)  # not there yet
    path.write_text(json.dumps({"status": "ok", "key": "k1"}))
    assert records.state(path)[1] == {"status": "ok", "key": "k1"}  # written since: read
    time.sleep(RACY_S)
    kept = records.state(path)[1]
    assert records.state(path)[1] is kept  # parsed once
    tmp = path.with_name(path.name + ".new")
    tmp.write_text(json.dumps({"status": "failed", "key": "k1"}))
    os.replace(tmp, path)
    assert records.state(path)[1] == {"status": "failed", "key": "k1"}
