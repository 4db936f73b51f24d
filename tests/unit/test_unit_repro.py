"""`etforge repro`'s one-line refusals, decided from the plan (no torch)."""

from __future__ import annotations

import dataclasses

from etforge.app.cli import main
from etforge.builders.repro.cover import refusal
from unit.support import make_unit_project

PIPELINE = """\
name: t
version: 0.0.1
models:
  a:
    python: models.a:build
    inputs: [{name: x, shape: [1, 4]}]
backends:
  xnnpack: {}
  portable: {}
quantization: [fp32, int8, 8da8w]
targets: false
"""


def test_covered_cells_pass_and_the_others_are_refused_in_one_line(tmp_path):
    project = make_unit_project(tmp_path / "proj", PIPELINE, models=("a",))
    plan = project.plan()
    for name in ("a/xnnpack/fp32", "a/portable/int8", "a/xnnpack/int8"):
        assert refusal(project.cell(plan, name)) is None, name
    assert refusal(project.cell(plan, "a/xnnpack/8da8w")) == (
        "repro covers the schemes fp32, fp16, int8, int8_dynamic, 8da4w only yet, not 8da8w"
    )
    cell = project.cell(plan, "a/xnnpack/fp32")
    member = dataclasses.replace(cell.backend.members[0], recipe="qnn", host_runnable=False)
    device = dataclasses.replace(cell, backend=dataclasses.replace(cell.backend, name="qnn", members=(member,)))
    assert refusal(device) == "repro needs a host-runnable cell; a/qnn/fp32 runs on qnn"
    int8 = project.cell(plan, "a/xnnpack/int8")
    kept = dataclasses.replace(int8.transform, options={**int8.transform.options, "keep_float": "auto"})
    assert refusal(dataclasses.replace(int8, transform=kept)) == "repro does not cover the int8 option keep_float yet"


def test_the_command_refuses_an_unknown_an_uncovered_and_an_unbuilt_cell(tmp_path, monkeypatch, capfd):
    project = make_unit_project(tmp_path / "proj", PIPELINE, models=("a",))
    monkeypatch.chdir(project.root)
    monkeypatch.setenv("ETFORGE_PIPELINE", str(project.pipeline))
    for args, line in (
        (["repro", "a/x/y"], "etforge: error: repro: no cell named 'a/x/y' in this selection"),
        (["repro", "a/xnnpack/8da8w"], "etforge: error: repro covers the schemes"),
        (["repro", "a/xnnpack/int8"], "etforge: error: a/xnnpack/int8 has not been built: run `etforge validate:"),
        (["repro"], "etforge: error: repro takes one cell"),
    ):
        capfd.readouterr()
        assert main(args) == 3
        err = capfd.readouterr().err
        assert err.startswith(line) and err.count("\n") == 1, err
