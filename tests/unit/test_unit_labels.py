"""Worker labels: what a cell needs beyond any Linux CPU, what this host offers, and the skip that names it."""

from __future__ import annotations

import pytest

from etforge.config import labels
from etforge.config.recipes import load_recipe
from etforge.core.errors import PipelineError
from unit.support import make_unit_project
from unit.test_unit_engine_run import Etforge

PIPELINE = """\
name: t
version: 0.0.1
models:
  a:
    python: models.a:build
    inputs: [{name: x, shape: [1, 4]}]
backends:
  xnnpack: {}
  metal: {}
quantization: [fp32]
"""


def test_recipes_derive_their_labels_from_what_they_already_say():
    assert labels.recipe_labels(load_recipe("backend", "qnn").data)["lowering"] == {"qnn_sdk"}  # QNN_SDK_ROOT
    assert labels.recipe_labels(load_recipe("backend", "metal").data)["lowering"] == {"macos"}  # platforms: [darwin]
    assert labels.recipe_labels(load_recipe("backend", "coreml").data) == {
        "lowering": frozenset(),  # lowers anywhere
        "runtime": {"macos"},  # runs on macOS only
    }
    assert labels.recipe_labels(load_recipe("backend", "xnnpack").data) == {"lowering": set(), "runtime": set()}


def test_a_memory_class_is_met_by_a_larger_one_and_an_unknown_label_is_one_line():
    assert labels.lacking({"mem64", "linux"}, {"linux", "mem128"}) == ()
    assert labels.lacking({"mem64", "qnn_sdk"}, {"linux", "mem16"}) == ("mem64", "qnn_sdk")
    known = labels.known_labels([load_recipe("backend", "qnn").data])
    assert labels.parse("linux, qnn_sdk,mem8", known) == {"linux", "qnn_sdk", "mem8"}
    with pytest.raises(labels.LabelError) as err:
        labels.parse("linux,tpu", known)
    assert str(err.value).startswith("ETFORGE_WORKER_LABELS: unknown label 'tpu'; known: ")
    assert "\n" not in str(err.value)


def test_this_host_offers_its_platform_its_sdks_and_its_memory_class(tmp_path):
    found = labels.detected({"QNN_SDK_ROOT": str(tmp_path), "FOO_SDK_ROOT": str(tmp_path / "absent")})
    assert {"linux", "qnn_sdk"} <= found and "foo_sdk" not in found
    assert any(labels.MEMORY.match(label) for label in found)
    assert labels.offered(frozenset({"linux", "macos"}), {"ETFORGE_WORKER_LABELS": "macos"}) == {"macos"}


@pytest.fixture
def etforge(tmp_path, monkeypatch, capfd):
    return Etforge(make_unit_project(tmp_path / "proj", PIPELINE, models=("a",)), monkeypatch, capfd)


def test_a_cell_needing_macos_is_skipped_here_with_the_label_named(etforge, monkeypatch):
    monkeypatch.setenv("ETFORGE_WORKER_LABELS", "linux,mem16")
    run = etforge("export", "validate")
    assert run.code == 0, run.out + run.err
    record = etforge.record("export:a/metal/fp32")
    assert record["status"] == "skipped"
    assert record["reason"].startswith(
        "cannot lower here: metal: needs worker label macos (this host offers linux, mem16"
    )
    assert not any(task.endswith("/metal/fp32") for task, _ in run.calls)  # never attempted
    assert etforge.summary()["a/metal/fp32"]["status"] == "skipped"
    assert "macos" in etforge.summary()["a/metal/fp32"]["note"]
    assert etforge.record("export:a/xnnpack/fp32")["status"] == "ok"
    # A machine that offers macos builds it.
    monkeypatch.setenv("ETFORGE_WORKER_LABELS", "macos,mem16")
    mac = etforge("export", "validate")
    assert mac.code == 0, mac.out + mac.err
    assert mac.started == {"export:a/metal/fp32", "validate:a/metal/fp32"}


def test_core_ml_programs_run_where_macos_is_offered_and_are_bundled_elsewhere(tmp_path, monkeypatch):
    project = make_unit_project(tmp_path, PIPELINE.replace("  metal: {}", "  coreml: {}"), models=("a",))
    monkeypatch.setenv("ETFORGE_WORKER_LABELS", "linux")
    assert not project.plan().backends["coreml"].host_runnable
    assert project.plan().backends["coreml"].missing is None  # lowers anywhere
    monkeypatch.setenv("ETFORGE_WORKER_LABELS", "macos")
    assert project.plan().backends["coreml"].host_runnable


def test_a_worker_label_nobody_knows_is_one_line_and_nothing_runs(etforge, monkeypatch, capfd):
    monkeypatch.setenv("ETFORGE_WORKER_LABELS", "linux,tpu")
    with pytest.raises(SystemExit) as exit_:
        etforge("export")
    assert exit_.value.code == 3
    lines = [line for line in capfd.readouterr().err.splitlines() if line.strip()]
    assert lines == [
        "etforge: error: ETFORGE_WORKER_LABELS: unknown label 'tpu'; known: gpu, linux, macos, qnn_sdk, windows, "
        "memN (N GB of RAM)"
    ]
    assert not (etforge.project.out / ".state").exists()


def test_a_model_label_this_host_lacks_skips_its_cells(etforge, monkeypatch):
    monkeypatch.setenv("ETFORGE_WORKER_LABELS", "linux,mem16")
    etforge.project.edit_pipeline("    python: models.a:build\n", "    python: models.a:build\n    labels: [mem64]\n")
    run = etforge("export")
    assert run.code == 0, run.out + run.err
    assert run.calls == []
    reason = etforge.record("export:a/xnnpack/fp32")["reason"]
    assert "needs worker label mem64 (this host offers linux, mem16" in reason


def test_a_model_label_nobody_knows_names_its_file_line_and_key(tmp_path):
    text = PIPELINE.replace("    python: models.a:build\n", "    python: models.a:build\n    labels: [mem64, tpu]\n")
    project = make_unit_project(tmp_path, text, models=("a",))
    with pytest.raises(PipelineError) as err:
        project.plan()
    assert str(err.value).endswith(
        "pipeline.yaml:6: models.a.labels[1]: unknown label 'tpu'; known: gpu, linux, macos, qnn_sdk, windows, memN"
    )
