"""`etforge repro CELL`: a standalone script that reproduces a cell's figure without etforge."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig

import pytest
from conftest import make_project

PIPELINE = """\
name: t
version: 0.0.1
models:
  cnn:
    python: models.small_cnn:build
    kwargs: {num_classes: 3, width: 4}
    inputs: [{name: image, shape: [1, 3, 8, 8]}]
backends:
  xnnpack: {}
quantization: [int8]
thresholds: {int8: {sqnr_db: 200}}
targets: false
"""
CELL = "cnn/xnnpack/int8"


@pytest.fixture(scope="module")
def repro(tmp_path_factory):
    """The int8 cell built (failing its 200 dB threshold) and its repro written."""
    project = make_project(tmp_path_factory.mktemp("repro") / "proj", PIPELINE)
    built = project.doit(f"validate:{CELL}")
    assert "FAILED" in built.stdout and "SQNR" in built.stdout, built.stdout + built.stderr
    written = project.doit("repro", CELL)
    assert written.returncode == 0, written.stdout + written.stderr
    return project, written


def _without_etforge(args: list, cwd) -> subprocess.CompletedProcess:
    """Run python -S with only the venv's site-packages: the editable install's .pth (tasks/) is not read."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "ETFORGE_PIPELINE")}
    env["PYTHONPATH"] = sysconfig.get_paths()["purelib"]
    return subprocess.run([sys.executable, "-S", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def test_repro_writes_a_script_and_its_inputs(repro):
    project, written = repro
    out = project.out / "repro" / "cnn_xnnpack_int8"
    assert {"repro.py", "inputs.npz", "model.pt2"} <= {p.name for p in out.iterdir()}
    assert "repro/cnn_xnnpack_int8/repro.py" in written.stdout
    text = (out / "repro.py").read_text()
    assert "etforge" not in "".join(line for line in text.splitlines() if line.startswith(("import", "from")))
    assert "get_symmetric_quantization_config(is_per_channel=True, is_dynamic=False)" in text


def test_repro_script_reproduces_the_failure_without_etforge(repro):
    project, _ = repro
    out = project.out / "repro" / "cnn_xnnpack_int8"
    probe = _without_etforge(["-c", "import etforge"], out)
    assert probe.returncode != 0 and "ModuleNotFoundError" in probe.stderr
    run = _without_etforge(["repro.py"], out)
    recorded = json.loads((project.out / "cnn" / "cnn_xnnpack_int8.numerics.json").read_text())
    sqnr = recorded["outputs"][0]["sqnr_db"]
    assert sqnr < 200
    assert f"output 0: SQNR {sqnr:.2f} dB" in run.stdout, run.stdout + run.stderr
    assert "torch 2.13.0" in run.stdout and "executorch 1.5.1" in run.stdout
    assert run.returncode == 1, run.stdout + run.stderr


def test_repro_refuses_an_unknown_cell_in_one_line(repro):
    project, _ = repro
    run = project.doit("repro", "cnn/xnnpack/fp32")
    assert run.returncode == 3
    assert run.stderr.strip().count("\n") == 0 and "no cell named 'cnn/xnnpack/fp32'" in run.stderr
