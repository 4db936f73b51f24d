"""What cache keys cover (etforge.pipeline.keys, specs), on plans resolved in-process.

Each test resolves a small project twice, before and after one edit a user makes, and
compares the keys of every task of the matrix: exactly the tasks whose output the edit
can change get a new key (so exactly those run again), and no other.
"""

from __future__ import annotations

import shutil
from dataclasses import replace
from importlib import metadata

import pytest

from etforge.cache.records import read_state
from etforge.cache.store import Store
from etforge.config.model import ModelKind
from etforge.engine.actions import run_stage
from etforge.pipeline.specs import spec_of
from etforge.pipeline.stages import DEFAULT_TABLE, KINDS, STAGE, STAGES, code_of, kind_of
from unit import fake_builders
from unit.support import HOST, PIPELINE, UnitProject, changed_keys, make_unit_project, task_keys

THRESHOLDS = "thresholds:\n  fp32: {sqnr_db: 60}\n  fp16: {sqnr_db: 30}\n"


def tasks_of(keys: dict, *, model: str | None = None, backend: str | None = None, scheme: str | None = None) -> set:
    """The task names of ``keys`` that belong to the given model / backend / scheme."""
    out = set()
    for name in keys:
        stage, _, subject = name.partition(":")
        if not subject:
            continue
        parts = subject.split("/")
        if model and parts[0] != model:
            continue
        if backend and (len(parts) < 3 or parts[1] != backend or stage == "quantize"):
            continue
        if scheme and (len(parts) < 2 or (parts[1] if stage == "quantize" else parts[-1]) != scheme):
            continue
        out.add(name)
    return out


def test_the_plan_has_the_tasks_these_tests_compare(unit_project):
    keys = task_keys(unit_project.plan())
    assert {n.split(":")[0] for n in keys} == {"capture", "quantize", "export", "sizegate", "validate", "benchmark"}
    assert len(tasks_of(keys, model="a")) == len(tasks_of(keys, model="b")) == 12
    assert all(len(k) == 64 for k in keys.values())
    assert len(set(keys.values())) == len(keys)  # no two tasks share a key


# ---------------------------------------------------------------- thresholds


def test_a_changed_threshold_changes_only_the_validate_keys_of_that_scheme(unit_project):
    unit_project.write_pipeline(PIPELINE + THRESHOLDS)
    before = task_keys(unit_project.plan())
    unit_project.edit_pipeline("fp16: {sqnr_db: 30}", "fp16: {sqnr_db: 31}")
    changed = changed_keys(before, task_keys(unit_project.plan()))
    assert changed == {"validate:a/xnnpack/fp16", "validate:b/xnnpack/fp16"}


def test_a_models_own_threshold_changes_only_the_validate_keys_of_its_cells(unit_project):
    before = task_keys(unit_project.plan())
    unit_project.edit_pipeline(
        "    python: models.b:build\n", "    python: models.b:build\n    thresholds: {fp32: {sqnr_db: 50}}\n"
    )
    changed = changed_keys(before, task_keys(unit_project.plan()))
    assert changed == {"validate:b/xnnpack/fp32", "validate:b/portable/fp32"}


def test_an_expected_failure_entry_changes_no_key(unit_project):
    before = task_keys(unit_project.plan())
    unit_project.write_pipeline(
        PIPELINE + 'matrix:\n  expected_failures: [{model: a, reason: "known", link: "https://example.com/1"}]\n'
    )
    assert changed_keys(before, task_keys(unit_project.plan())) == set()


# ---------------------------------------------------------------- names


def test_renaming_a_model_keeps_its_graphs_and_lowers_it_again(unit_project):
    before = task_keys(unit_project.plan())
    unit_project.edit_pipeline("  b:\n", "  renamed:\n")
    after = task_keys(unit_project.plan())
    # Its capture and quantized graph are the same content: a cache hit under the new name.
    assert after["capture:renamed"] == before["capture:b"]
    assert after["quantize:renamed/fp16/float16"] == before["quantize:b/fp16/float16"]
    # Its programs embed the model's name in their metadata: lowered again.
    for cell in ("xnnpack/fp32", "xnnpack/fp16", "portable/fp32"):
        assert after[f"export:renamed/{cell}"] != before[f"export:b/{cell}"]
        assert after[f"validate:renamed/{cell}"] != before[f"validate:b/{cell}"]
    # The other model is untouched.
    assert {n: after[n] for n in tasks_of(after, model="a")} == {n: before[n] for n in tasks_of(before, model="a")}


def test_keys_do_not_depend_on_where_the_project_lives(unit_project, tmp_path):
    before = task_keys(unit_project.plan())
    moved = UnitProject(tmp_path / "elsewhere" / "checkout")
    shutil.copytree(unit_project.root, moved.root)
    assert task_keys(moved.plan()) == before  # a shared cache serves every checkout


# ---------------------------------------------------------------- model code


def test_an_edited_model_module_changes_its_model_and_everything_downstream_only(unit_project):
    before = task_keys(unit_project.plan())
    unit_project.write("models/a.py", "def build():\n    return 'a, edited'\n")
    changed = changed_keys(before, task_keys(unit_project.plan()))
    assert changed == tasks_of(before, model="a")
    assert "capture:a" in changed and "benchmark:a/xnnpack/fp16" in changed


def test_an_edited_helper_changes_exactly_the_models_that_import_it(unit_project):
    # a imports the helper inside a function: still a dependency (a static walk of imports).
    unit_project.write("models/helper.py", "SCALE = 2\n")
    unit_project.write("models/a.py", "def build():\n    from models import helper\n\n    return helper.SCALE\n")
    before = task_keys(unit_project.plan())
    unit_project.write("models/helper.py", "SCALE = 3\n")
    assert changed_keys(before, task_keys(unit_project.plan())) == tasks_of(before, model="a")


# ---------------------------------------------------------------- builders chosen once, by model kind

LLM_PIPELINE = """\
name: t
version: 0.0.1
models:
  a:
    python: models.a:build
    inputs: [{name: x, shape: [1, 4]}]
  llm:
    transformers:
      task: text-generation
      config: {model_type: llama, vocab_size: 512, hidden_size: 64, intermediate_size: 128, num_hidden_layers: 2,
               num_attention_heads: 4, num_key_value_heads: 2, max_position_embeddings: 64,
               tie_word_embeddings: false, bos_token_id: 1, eos_token_id: 2, pad_token_id: 0}
      llm: {max_context_len: 32, prompt_len: 4, decode_steps: 2}
backends:
  xnnpack: {}
quantization: [fp32]
"""


def test_each_kind_builds_its_parts_and_their_code_joins_the_key(unit_project):
    plan = unit_project.plan()
    for stage in STAGES:
        if stage.subject == "pipeline":
            continue
        module, llm = (
            DEFAULT_TABLE.builder_for(stage, ModelKind.MODULE),
            DEFAULT_TABLE.builder_for(stage, ModelKind.LLM),
        )
        module_code = plan.code.etforge.files(code_of(stage, ModelKind.MODULE))
        llm_code = plan.code.etforge.files(code_of(stage, ModelKind.LLM))
        if stage.part is None:  # one builder for every kind (the size gate)
            assert module == llm == stage.builder and module_code == llm_code
            continue
        assert (module, llm) == (
            getattr(KINDS[ModelKind.MODULE], stage.part),
            getattr(KINDS[ModelKind.LLM], stage.part),
        )
        assert module != llm
        # An LLM task's key covers the LLM builder's code, a module's does not need it.
        assert "builders/llm/stages.py" in llm_code
        assert module_code != llm_code


@pytest.fixture
def llm_project(tmp_path) -> UnitProject:
    try:
        metadata.version("transformers")  # resolve reads its metadata and source, never imports it
    except metadata.PackageNotFoundError:
        pytest.skip("transformers is not installed")
    return make_unit_project(tmp_path / "llm", LLM_PIPELINE, models=("a",))


def test_an_llm_models_tasks_run_the_llm_builder(llm_project, monkeypatch):
    plan = llm_project.plan()
    assert {m.name: m.kind for m in plan.models.values()} == {"a": ModelKind.MODULE, "llm": ModelKind.LLM}
    store = Store(llm_project.root / "artifacts" / "cache")
    for cell in plan.cells:
        # reads export, which reads capture: rebuilt here, by the builders of the table handed in
        assert run_stage(plan, fake_builders.TABLE, "validate", cell, store, HOST)
    assert fake_builders.calls(llm_project.root) == [
        ("capture:a", "capture"),
        ("export:a/xnnpack/fp32", "export"),
        ("validate:a/xnnpack/fp32", "validate"),
        ("capture:llm", "llm_capture"),
        ("export:llm/xnnpack/fp32", "llm_export"),
        ("validate:llm/xnnpack/fp32", "llm_validate"),
    ]
    for cell in plan.cells:
        assert read_state(spec_of(plan, "validate", cell, HOST).state_file)["status"] == "ok"
        assert kind_of(cell) == cell.model.kind


def test_an_llm_models_keys_differ_from_the_same_tasks_of_a_module(llm_project):
    plan = llm_project.plan()
    llm = next(c for c in plan.cells if c.model.kind == ModelKind.LLM)
    for stage in ("capture", "export", "validate", "benchmark"):
        code = plan.code.etforge.of(code_of(STAGE[stage], ModelKind.LLM))
        assert code != plan.code.etforge.of(code_of(STAGE[stage], ModelKind.MODULE))
    # Its capture's key is made with the LLM code: treating it as a module gives another key.
    as_module = replace(llm.model, kind=ModelKind.MODULE)
    assert spec_of(plan, "capture", llm).key != spec_of(replace(plan, memo={}), "capture", as_module).key


# ---------------------------------------------------------------- a project's own recipe

RECIPE = """\
name: mycpu
kind: backend
description: XNNPACK through the project's own partitioner factory.
partitioner: my_backends.cpu:partitioners
runtime:
  delegates: [XnnpackBackend]
  host_runnable: true
manifest:
  description: "Our CPU"
  platforms: [linux]
  rank: 5
"""
FACTORY = """\
def partitioners(options):
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

    from my_backends import tuning

    return [XnnpackPartitioner(**tuning.OPTIONS)]
"""


@pytest.fixture
def recipe_project(tmp_path) -> UnitProject:
    project = make_unit_project(
        tmp_path / "proj", PIPELINE.replace("  portable: {}\n", "  portable: {}\n  mycpu: {}\n"), models=("a", "b")
    )
    project.write("recipes/backends/mycpu.yaml", RECIPE)
    project.write("my_backends/__init__.py", "")
    project.write("my_backends/cpu.py", FACTORY)
    project.write("my_backends/tuning.py", "OPTIONS = {}\n")
    return project


@pytest.mark.parametrize("edited", ["my_backends/cpu.py", "my_backends/tuning.py"])
def test_a_project_recipes_partitioner_code_joins_the_export_key(recipe_project, edited):
    plan = recipe_project.plan()
    assert recipe_project.cell(plan, "a/mycpu/fp32").backend.primary.partitioner == "my_backends.cpu:partitioners"
    before = task_keys(plan)
    path = recipe_project.root / edited
    recipe_project.write(edited, path.read_text() + "# tuned\n")
    changed = changed_keys(before, task_keys(recipe_project.plan()))
    # The programs of that backend, and what judges or times them; no capture, no other backend.
    assert changed == tasks_of(before, backend="mycpu")
    assert {n.split(":")[0] for n in changed} == {"export", "validate", "benchmark"}


@pytest.mark.parametrize("name", ["torch", "executorch", "coremltools", "PyYAML", "ethos_u_vela", "no-such-dist"])
def test_installed_version_is_what_importlib_metadata_says(name):
    # keys read versions from the METADATA file's Version field (fast): the same string, or None
    from etforge.config.tools import installed_version

    try:
        expected = metadata.version(name)
    except metadata.PackageNotFoundError:
        expected = None
    assert installed_version(name) == expected
