"""Arm VGF cells validated here: each VGF delegate's own payload on Arm's ML SDK scenario runner,
over the ML emulation layer for Vulkan on Mesa's lavapipe (etforge.builders.arm.vgf_run).

One project built once (module fixture, ~40 s on 2 cores): a tiny CNN on arm_vgf fp32 and int8,
with 4 representative validation samples, through the real doit pipeline. Needs what
.ci/install-vulkan.sh installs; without it the cells are skipped, and the first test says what
is missing.
"""

from __future__ import annotations

import json
from importlib import metadata
from pathlib import Path

import numpy as np
import pytest
from conftest import make_project, state

PIPELINE = """\
name: t
version: 0.0.1
models:
  cnn:
    python: models.small_cnn:build
    kwargs: {num_classes: 3, width: 4}
    inputs: [{name: image, shape: [1, 3, 8, 8]}]
    calibration: {npz: data/calib.npz}
    validation: {npz: data/val.npz}
backends:
  arm_vgf: {}
quantization: [fp32, int8]
"""
FP, INT = "cnn/arm_vgf/fp32", "cnn/arm_vgf/int8"
SAMPLES = 4


def _runner_name() -> str:
    """What the verdict says ran it: the recipe's name and its runtime tools' versions."""
    tools = ("ai-ml-emulation-layer-for-vulkan", "ai-ml-sdk-scenario-runner", "ai-ml-sdk-vgf-library")
    versions = ", ".join(f"{name} {metadata.version(name)}" for name in tools)
    return f"ML SDK scenario runner (Vulkan ML emulation layer on Mesa 25.0.7 lavapipe) ({versions})"


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    project = make_project(tmp_path_factory.mktemp("vgf") / "proj", PIPELINE)
    rng = np.random.default_rng(7)
    (project.root / "data").mkdir()
    np.savez(project.root / "data" / "calib.npz", image=rng.standard_normal((8, 1, 3, 8, 8)).astype(np.float32))
    np.savez(project.root / "data" / "val.npz", image=rng.standard_normal((SAMPLES, 1, 3, 8, 8)).astype(np.float32))
    run = project.doit()
    assert run.returncode == 0, run.stdout + run.stderr
    return project


def rows(project) -> dict:
    return {r["cell"]: r for r in json.loads((project.out / "summary.json").read_text())}


def numerics(project, cell: str) -> dict:
    model, backend, scheme = cell.split("/")
    return json.loads((project.out / model / f"{model}_{backend}_{scheme}.numerics.json").read_text())


def test_vgf_fp32_and_int8_cells_are_validated_on_the_scenario_runner(built):
    table = rows(built)
    for cell, floor in ((FP, 100.0), (INT, 30.0)):
        row = table[cell]
        # a verdict made here on representative data, like a host-runnable cell's (not shipped unchecked)
        assert row["status"] == "ok", row
        assert row["note"].startswith(f"run on the {_runner_name()}, not the ExecuTorch runtime"), row
        report = numerics(built, cell)
        assert report["passed"] and report["runner"] == _runner_name()
        assert report["samples"] == SAMPLES and report["inputs"].startswith("npz")
        output = report["outputs"][0]
        # lavapipe may compute the fp32 graph bit for bit as eager does (no SQNR: infinite)
        exact = output["sqnr_db"] is None and output["max_abs_error"] == 0.0
        assert exact or output["sqnr_db"] > floor, report["outputs"]
        assert state(built, f"validate:{cell}")["status"] == "ok"
    # the int8 program is not the fp32 one: quantization shows in its error
    assert numerics(built, INT)["outputs"][0]["max_abs_error"] > 0
    # no .bpte (judged here), no latency (an emulator is no place to time a program)
    assert not list(built.out.glob("cnn/*.bpte"))
    assert not list(built.out.glob("cnn/*.bench.json"))
    assert "ML SDK scenario runner" in (built.out / "report.html").read_text()


def test_vgf_payload_runs_each_sample_as_its_own(built, tmp_path):
    """The runner computes what eager PyTorch computed (the capture's reference outputs), for each
    sample of a batch in its place (all samples of a call go through one scenario), by running the
    program's VGF delegate."""
    import torch

    from etforge.builders.arm.vgf_probe import find_stack
    from etforge.builders.arm.vgf_run import VgfInterpreter, vgf_program
    from etforge.builders.capture.reference import load_reference_samples

    pte = built.out / "cnn" / "cnn_arm_vgf_fp32.pte"
    ref = load_reference_samples(_store_file(built, "capture:cnn", "reference.npz"))
    samples = [[torch.from_numpy(x) for x in ref.sample_inputs(n)] for n in range(ref.count)]
    got = vgf_program(pte, samples, {})
    for n, outputs in enumerate(got):
        np.testing.assert_allclose(outputs[0], ref.outputs[0][n], atol=1e-5)
    alone = vgf_program(pte, samples[2:3], {})  # the third sample alone: the same as in the batch
    assert np.array_equal(alone[0][0], got[2][0]) and not np.allclose(got[2][0], got[1][0])
    stack, _ = find_stack()
    interpreter = VgfInterpreter(pte.read_bytes(), stack, tmp_path)
    interpreter.run_all(samples[:1])
    assert interpreter.trace == ["delegate:VgfBackend"]


def test_a_vgf_cell_that_misses_its_threshold_fails_naming_the_runner(built, tmp_path):
    """The verdict of any cell: the real validate builder on the built int8 program, with a
    threshold it cannot meet (in-process: no second doit run)."""
    import dataclasses

    from etforge.builders.numerics.validate import build_validate, stand_in_runner
    from etforge.config.resolve import resolve
    from etforge.pipeline.results import TaskStatus

    cell = next(c for c in resolve(built.pipeline).cells if c.name == INT)
    strict = dataclasses.replace(cell, thresholds={"sqnr_db": 200})
    result = build_validate(
        strict,
        built.out / "cnn" / "cnn_arm_vgf_int8.pte",
        _store_file(built, "capture:cnn", "reference.npz"),
        ["float32"],
        tmp_path,
        runner=stand_in_runner(strict.backend, {}),
    )
    assert result.status == TaskStatus.FAILED
    assert result.reason.startswith("output 0: SQNR ") and "< 200 dB" in result.reason, result.reason
    assert result.reason.endswith(f"; run on the {_runner_name()}, not the ExecuTorch runtime"), result.reason


def _split_model():
    """A conv, then topk (no TOSA form: a portable kernel between two VGF delegates), then more
    ops: channels-last tensors cross each delegate's boundary, both ways."""
    import torch

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)

        def forward(self, x):
            y = torch.relu(self.conv(x))
            return torch.topk(y, 4, dim=3).values.repeat(1, 1, 1, 2) * 0.5 + y

    torch.manual_seed(0)
    return Model().eval()


@pytest.fixture(scope="module")
def split_program(tmp_path_factory):
    """The split model lowered in-process for arm_vgf fp32 (~5 s), with its eager module."""
    import torch
    from executorch.exir import to_edge_transform_and_lower

    from etforge.builders.lowering.partitioners import arm_vgf

    model = _split_model()
    example = torch.randn(1, 3, 8, 8).to(memory_format=torch.channels_last)
    lowered = to_edge_transform_and_lower(torch.export.export(model, (example,)), partitioner=arm_vgf({}))
    pte = tmp_path_factory.mktemp("vgf-split") / "split.pte"
    pte.write_bytes(lowered.to_executorch().buffer)
    return model, pte


def test_a_vgf_program_split_by_a_kernel_runs_as_eager_does(split_program, tmp_path):
    """Two VGF delegates with a portable kernel between them, channels-last values at their
    boundaries: each value reaches the next step in its logical layout."""
    import torch

    from etforge.builders.arm.vgf_probe import find_stack
    from etforge.builders.arm.vgf_run import VgfInterpreter, vgf_program

    model, pte = split_program
    stack, _ = find_stack()
    interpreter = VgfInterpreter(pte.read_bytes(), stack, tmp_path)
    order = [list(interpreter.plan.values[i].val.dim_order) for i in interpreter.plan.inputs]
    assert order == [[0, 2, 3, 1]]  # the program takes a channels-last image
    torch.manual_seed(1)
    samples = [[torch.randn(1, 3, 8, 8).to(memory_format=torch.channels_last)] for _ in range(2)]
    interpreter.run_all(samples[:1])
    assert interpreter.trace == ["delegate:VgfBackend", "aten::topk.values", "delegate:VgfBackend"]
    for (x,), (y,) in zip(samples, vgf_program(pte, samples, {})):
        expected = model(x).detach().numpy()
        np.testing.assert_allclose(y, expected, atol=1e-5)
        assert y.shape == expected.shape


def test_without_lavapipe_a_vgf_program_is_skipped_naming_what_is_missing(monkeypatch, tmp_path):
    """No driver manifest, or one whose driver does not load: one line naming the part and the
    script that installs it, raised as Skip (the cell ends `skipped`), before any program is read."""
    from etforge.builders.arm import vgf_probe
    from etforge.builders.arm.vgf_run import vgf_program
    from etforge.pipeline.results import Skip

    monkeypatch.setattr(vgf_probe, "ICD_DIRS", (str(tmp_path),))
    with pytest.raises(Skip) as none:
        vgf_program(tmp_path / "never-read.pte", [], {})
    assert str(none.value) == (
        f"VGF program not run here, missing: Mesa's lavapipe Vulkan driver (no lvp_icd*.json in {tmp_path}; "
        ".ci/install-vulkan.sh)"
    )
    manifest = {
        "file_format_version": "1.0.0",
        "ICD": {"library_path": str(tmp_path / "libnone.so"), "api_version": "1.3.0"},
    }
    (tmp_path / "lvp_icd.x86_64.json").write_text(json.dumps(manifest))
    with pytest.raises(Skip) as broken:
        vgf_program(tmp_path / "never-read.pte", [], {})
    assert str(broken.value).startswith(
        "VGF program not run here, missing: a working lavapipe (vkCreateInstance returned -9"
    )


def test_the_validate_key_covers_the_pinned_driver_and_the_runtime_tools(built):
    """The Mesa pin lives in vgf_probe, which the runner imports: its file is in the code the
    validate key digests; the PyPI parts' versions are in its facts."""
    from etforge.config.resolve import resolve
    from etforge.pipeline.keys import inputs_of
    from etforge.pipeline.stages import STAGE

    plan = resolve(built.pipeline)
    cell = next(c for c in plan.cells if c.name == INT)
    tools = inputs_of(plan, STAGE["validate"], cell)["facts"]["runtime_tools"]
    for name in ("ai-ml-sdk-scenario-runner", "ai-ml-emulation-layer-for-vulkan", "ai-ml-sdk-vgf-library"):
        assert tools[name] == metadata.version(name)
    assert tools["validated_by"]["runner"] == "etforge.builders.arm.vgf_run:vgf_program"
    closure = plan.code.etforge.file_digests(("etforge.builders.arm.vgf_run",))
    assert any(name.endswith("builders/arm/vgf_probe.py") for name in closure), sorted(closure)


def _store_file(project, task: str, name: str) -> Path:
    key = state(project, task)["key"]
    return project.root / "artifacts" / "cache" / key[:2] / key / name
