"""Targets (etforge.config.targets): pipeline.yaml's ``targets`` over the backend recipes'
defaults, its errors (file, line, key), the target tasks' keys, and what the aarch64 runtime
says of a program it cannot run (etforge.builders.targets.needs), on plans resolved in-process."""

from __future__ import annotations

import re

import pytest

from etforge.config import target_runtime as tr
from etforge.config.recipes import RECIPE_DIR
from etforge.core.errors import PipelineError
from etforge.pipeline.stage_results import ExportResult
from unit.support import PIPELINE, changed_keys, make_unit_project, task_keys

REPO_RECIPES = RECIPE_DIR
BASE = PIPELINE.replace("targets: false  # the target stage's fake-free tests are in test_unit_targets.py\n", "")
A76, A72 = "aarch64-cortex-a76", "aarch64-cortex-a72"


def profiles(plan) -> dict:
    return {c.name: [t.profile for t in c.targets] for c in plan.cells}


@pytest.fixture
def project(tmp_path):
    return make_unit_project(tmp_path / "proj", BASE)


def test_cpu_backends_take_their_recipes_defaults(project):
    assert "targets" not in BASE
    found = profiles(project.plan())
    assert found["a/xnnpack/fp32"] == found["b/portable/fp32"] == found["a/xnnpack/fp16"] == [A76, A72]
    assert {t.label for t in project.cell(project.plan(), "a/xnnpack/fp32").targets} == {
        "aarch64 cortex-a76 (qemu-user)",
        "aarch64 cortex-a72 (qemu-user)",
    }


def test_targets_false_a_list_or_per_backend_replace_the_defaults(project):
    project.write_pipeline(BASE + "targets: false\n")
    assert set(map(tuple, profiles(project.plan()).values())) == {()}
    assert not any(n.startswith("target:") for n in task_keys(project.plan()))
    project.write_pipeline(BASE + "targets: [aarch64-cortex-a53]\n")
    assert set(map(tuple, profiles(project.plan()).values())) == {("aarch64-cortex-a53",)}
    project.write_pipeline(BASE + "targets:\n  backends: {portable: []}\n")
    found = profiles(project.plan())
    assert found["a/portable/fp32"] == [] and found["a/xnnpack/fp32"] == [A76, A72]
    project.write_pipeline(
        BASE + "targets:\n  default: [aarch64-neoverse-n1]\n  backends: {xnnpack: [aarch64-cortex-a72]}\n"
    )
    found = profiles(project.plan())
    assert found["a/portable/fp32"] == ["aarch64-neoverse-n1"] and found["a/xnnpack/fp16"] == [A72]


@pytest.mark.parametrize(
    ("section", "expected"),
    [
        (
            "targets:\n  backends:\n    xnnpack: [aarch64-cortex-a77]\n",
            "pipeline.yaml:16: targets.backends.xnnpack[0]: unknown target 'aarch64-cortex-a77'; "
            "did you mean 'aarch64-cortex-a76'? known: aarch64-cortex-a76, aarch64-cortex-a72, "
            "aarch64-cortex-a53, aarch64-neoverse-n1",
        ),
        (
            "targets: [aarch64-max]\n",
            "pipeline.yaml:14: targets[0]: target 'aarch64-max' is not offered: qemu's max core advertises SME",
        ),
        (
            "targets:\n  backends: {vulkan: [aarch64-cortex-a76]}\n",
            "pipeline.yaml:15: targets.backends.vulkan: no backend 'vulkan' in backends (declared: xnnpack, portable)",
        ),
        (
            "targets: 3\n",
            "pipeline.yaml:14: targets: expected false, a list of target profiles (e.g. [aarch64-cortex-a76]), "
            "or {default: [...], backends: {<backend>: [...]}}, got 3",
        ),
    ],
    ids=["unknown", "refused", "no-such-backend", "not-a-list"],
)
def test_a_bad_targets_section_is_one_line_naming_file_line_and_key(project, section, expected):
    project.write_pipeline(BASE + section)
    with pytest.raises(PipelineError) as raised:
        project.plan()
    message = str(raised.value)
    assert "\n" not in message
    assert re.sub(r"^.*?pipeline\.yaml", "pipeline.yaml", message).startswith(expected), message


def test_a_recipes_unknown_default_names_the_recipe_file_and_line(project):
    recipe = (REPO_RECIPES / "backends" / "xnnpack.yaml").read_text()
    assert f"targets: [{A76}, {A72}]" in recipe
    path = project.write("recipes/backends/xnnpack.yaml", recipe.replace(A72, "aarch64-cortex-a99"))
    line = 1 + recipe[: recipe.index(f"targets: [{A76}")].count("\n")
    with pytest.raises(PipelineError) as raised:
        project.plan()
    assert f"recipes/backends/xnnpack.yaml:{line}: runtime.targets[1]: unknown target 'aarch64-cortex-a99'" in str(
        raised.value
    ), (str(raised.value), path)


def test_a_changed_target_list_changes_exactly_the_target_tasks_keys(project):
    before = task_keys(project.plan())
    targets = {n for n in before if n.startswith("target:")}
    assert targets == {f"target:{m}/{b}/fp32" for m in "ab" for b in ("xnnpack", "portable")} | {
        f"target:{m}/xnnpack/fp16" for m in "ab"
    }
    project.write_pipeline(BASE + "targets:\n  backends: {xnnpack: [aarch64-cortex-a76]}\n")
    assert changed_keys(before, task_keys(project.plan())) == {n for n in targets if "/xnnpack/" in n}
    project.write_pipeline(BASE + "thresholds:\n  fp16: {sqnr_db: 31}\n")  # thresholds judge here and there
    changed = changed_keys(before, task_keys(project.plan()))
    assert changed == {f"{s}:{m}/xnnpack/fp16" for s in ("validate", "target") for m in "ab"}


def _record() -> dict:
    record = tr.runner_record()
    assert record is not None, "run `etforge setup-targets` (make setup / .ci/install-aarch64.sh) first"
    return record


def test_an_llm_program_names_the_library_its_custom_ops_are_in():
    from etforge.builders.targets.needs import missing_needs

    program = ExportResult(delegates=("XnnpackBackend",), operators={"llama::custom_sdpa.out": []})
    why = missing_needs(program, _record())
    assert why == (
        "needs llama::custom_sdpa.out, which no library of the aarch64 ExecuTorch 1.5.1 runtime registers: "
        "the wheel registers them only in executorch/extension/llm/custom_ops/libcustom_ops_aot_lib.so, "
        "which needs _C.cpython-311-aarch64-linux-gnu.so, libtorch.so, libtorch_cpu.so, libc10.so, "
        "not loadable by a C++ runtime without PyTorch"
    )


def test_openvino_says_it_has_no_aarch64_runtime_and_xnnpack_programs_pass():
    from etforge.builders.targets.needs import missing_needs

    record = _record()
    assert record["backends"]["XnnpackBackend"] is True
    assert missing_needs(ExportResult(delegates=("XnnpackBackend",)), record) is None
    why = missing_needs(ExportResult(delegates=("OpenvinoBackend",)), record)
    assert why is not None and why.startswith("OpenVINO has no aarch64 runtime here")
    why = missing_needs(ExportResult(delegates=("VulkanBackend",)), record)
    assert why is not None and "does not have" in why and "XnnpackBackend" in why
