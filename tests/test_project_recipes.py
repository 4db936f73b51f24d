"""A project adds or replaces a backend with a recipe of its own: its recipes/ is searched before
etforge's, the code the recipe names joins the keys, and the recipe schema checks its fields."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import make_project

from etforge.config.resolve import resolve
from etforge.core.errors import PipelineError
from etforge.pipeline.specs import spec_of

PIPELINE = """\
name: t
version: 0.0.1
models:
  linreg:
    python: models.linreg:build
    inputs: [{name: features, shape: [1, 4]}]
backends:
  mycpu: {}
quantization: [fp32]
"""
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

    return [XnnpackPartitioner()]
"""


def own_recipe_project(root: Path, recipe: str = RECIPE):
    project = make_project(root, PIPELINE)
    (project.root / "recipes" / "backends").mkdir(parents=True)
    (project.root / "recipes" / "backends" / "mycpu.yaml").write_text(recipe)
    (project.root / "my_backends").mkdir()
    (project.root / "my_backends" / "__init__.py").write_text("")
    (project.root / "my_backends" / "cpu.py").write_text(FACTORY)
    return project


def test_a_project_recipe_is_found_first_and_its_code_joins_the_export_key(tmp_path):
    project = own_recipe_project(tmp_path / "proj")
    plan = resolve(project.pipeline)
    (cell,) = plan.cells
    assert cell.backend.primary.partitioner == "my_backends.cpu:partitioners"
    assert cell.backend.primary.description == "Our CPU"
    assert plan.recipe_path.platform_order()["linux"][0] == "mycpu"  # rank 5: before etforge's vulkan (20)
    before = spec_of(plan, "export", cell).key
    (project.root / "my_backends" / "cpu.py").write_text(FACTORY + "# changed\n")
    after = spec_of(resolve(project.pipeline), "export", cell).key
    assert before != after  # the project's partitioner code is part of the program's key


def test_a_project_recipe_builds_and_validates_its_cell(tmp_path):
    project = own_recipe_project(tmp_path / "proj")
    run = project.doit("validate")
    assert run.returncode == 0, run.stdout + run.stderr
    assert "linreg/mycpu/fp32" in run.stdout and "provisional" in run.stdout
    assert (project.out / "linreg" / "linreg_mycpu_fp32.pte").is_file()


@pytest.mark.parametrize(
    "edit, expected",
    [
        (("rank: 5", "rank: -1"), "recipes/backends/mycpu.yaml:11: manifest.rank: expected a number >= 0, got -1"),
        (
            ("  rank: 5\n", "  rank: 5\nreproducible: maybe\nllm: {schemes: fp32}\n"),
            'recipes/backends/mycpu.yaml:13: llm.schemes: expected a list, got "fp32"',
        ),
        (
            ("partitioner: my_backends.cpu:partitioners", "partitioner: not a path"),
            "recipes/backends/mycpu.yaml:4: "
            "partitioner: expected a 'module:function' that returns the partitioners for the options, or null, "
            'got "not a path"',
        ),
    ],
    ids=["negative-rank", "llm-schemes-not-a-list", "partitioner-not-a-dotted-path"],
)
def test_a_bad_project_recipe_is_one_line_naming_its_file_line_and_key(tmp_path, edit, expected):
    project = own_recipe_project(tmp_path / "proj", RECIPE.replace(*edit))
    with pytest.raises(PipelineError) as info:
        resolve(project.pipeline)
    assert str(info.value) == expected


# The recipe's last line is 11 (`  rank: 5`): an option declared after it is on line 13 (one line)
# or 13-16 (a block), as each case spells it.
@pytest.mark.parametrize(
    "options, expected",
    [
        (
            "  fast: {type: boolean, default: notabool}\n",
            'recipes/backends/mycpu.yaml:13: options.fast.default: expected true or false, got "notabool"',
        ),
        (
            "  threads: {type: integer, minimum: 1, default: true}\n",
            "recipes/backends/mycpu.yaml:13: options.threads.default: expected an integer, got true",
        ),
        (
            "  threads: {type: integer, minimum: 1, default: 0}\n",
            "recipes/backends/mycpu.yaml:13: options.threads.default: expected a number >= 1, got 0",
        ),
        (
            "  mode:\n    enum: [fast, small]\n    default: tiny\n",
            'recipes/backends/mycpu.yaml:15: options.mode.default: expected one of fast, small, got "tiny"',
        ),
        (
            "  fast: {type: boolean}\n",
            "recipes/backends/mycpu.yaml:13: options.fast: "
            "missing required key 'default' (what the option is when a pipeline omits it)",
        ),
        (
            "  fast: {type: bool, default: true}\n",
            "recipes/backends/mycpu.yaml:13: options.fast.type: "
            "not a valid option schema: 'bool' is not valid under any of the given schemas",
        ),
    ],
    ids=[
        "bool-default-a-string",
        "int-default-a-bool",
        "int-default-below-minimum",
        "enum-default-not-a-choice",
        "no-default",
        "not-a-schema",
    ],
)
def test_a_project_recipes_option_defaults_are_checked_as_options_are(tmp_path, options, expected):
    project = own_recipe_project(tmp_path / "proj", RECIPE + "options:\n" + options)
    with pytest.raises(PipelineError) as info:
        resolve(project.pipeline)
    assert str(info.value) == expected


def test_a_project_recipes_good_defaults_reach_the_cell(tmp_path):
    project = own_recipe_project(tmp_path / "proj", RECIPE + "options:\n  fast: {type: boolean, default: false}\n")
    (cell,) = resolve(project.pipeline).cells
    assert cell.backend.primary.options == {"fast": False}
