"""Verdicts of the aarch64 ExecuTorch runtime under qemu-user (docs/targets.md).

Real: the aarch64 executorch wheel from PyPI, cpp/program_runner cross-built against it (both set
up once, by ``etforge setup-targets``, and kept between runs) and qemu-user on a Cortex-A76 (fp16
arithmetic, dot product) and a Cortex-A72 (neither). One small pipeline is built once for the
module; the tests that change something work on copies of it.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
from conftest import REPO, TINY_LLAMA_CONFIG, copy_project, make_project, state

A76, A72 = "aarch64 cortex-a76 (qemu-user)", "aarch64 cortex-a72 (qemu-user)"
HOST_COLUMN = "SQNR dB"
PIPELINE = """\
name: t
version: 0.0.1
models:
  cnn:
    python: models.small_cnn:build
    kwargs: {num_classes: 10, width: 8}
    inputs: [{name: image, shape: [1, 3, 32, 32]}]
  reg:
    python: models.linreg:build
    inputs: [{name: features, shape: [1, 4]}]
backends:
  xnnpack: {}
quantization: [fp32, int8, fp16]
"""
CELLS = [f"{m}/xnnpack/{q}" for m in ("cnn", "reg") for q in ("fp32", "int8", "fp16")]


def fp16_without_size_gate() -> str:
    """The fp16 recipe without its size gate: executorch 1.5.1 keeps XNNPACK conv weights in fp32, so
    the CNN's fp16 cell would fail on its size before its numerics could say anything."""
    text = (REPO / "recipes" / "quantization" / "fp16.yaml").read_text()
    return re.sub(r"(?m)^size_gate:.*\n", "", text)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    from etforge.builders.targets.setup import setup_targets

    setup_targets(say=lambda line: None)  # idempotent: installs on a fresh machine, else finds it all
    project = make_project(tmp_path_factory.mktemp("aarch64") / "proj", PIPELINE)
    recipes = project.root / "recipes" / "quantization"
    recipes.mkdir(parents=True)
    (recipes / "fp16.yaml").write_text(fp16_without_size_gate())
    run = project.doit("-n", "2", "-P", "process", "validate", "target", "sizegate", "report")
    assert run.returncode == 0, run.stdout + run.stderr
    return project


def summary(project) -> dict:
    return {c["cell"]: c for c in json.loads((project.out / "summary.json").read_text())}


def figure(text: str) -> float:
    return float("inf") if text == "exact" else float(text)


def test_every_cell_is_judged_on_both_cores_and_shows_each_figure(built):
    cells = summary(built)
    for name in CELLS:
        checks = cells[name]["checks"]
        assert cells[name]["status"] == "provisional", cells[name]  # validated, on random inputs
        for core in (A76, A72):
            assert figure(checks[f"SQNR dB ({core})"]) >= 25, (name, core, checks)
    # int8 is bit-exact across architectures on named cores (no SME): the same figure as this host's
    for name in ("cnn/xnnpack/int8", "reg/xnnpack/int8"):
        checks = cells[name]["checks"]
        assert checks[f"SQNR dB ({A76})"] == checks[f"SQNR dB ({A72})"] == checks[HOST_COLUMN]
    record = state(built, "target:cnn/xnnpack/fp32")
    judged = {c["target"] for c in record["info"]["checks"] if c["check"] == "numerics"}
    assert judged == {A76, A72}
    export = state(built, "export:cnn/xnnpack/fp32")
    assert record["info"]["program_sha256"] == export["info"]["sha256"]  # tied to the bytes it judged


def test_a_threshold_between_two_runtimes_figures_fails_the_cell_naming_both(built, tmp_path):
    figures = {
        core: figure(summary(built)["cnn/xnnpack/fp16"]["checks"][column])
        for core, column in (("host", HOST_COLUMN), (A76, f"SQNR dB ({A76})"), (A72, f"SQNR dB ({A72})"))
    }
    low, high = sorted(set(figures.values()))[:2]
    assert high - low >= 1.0, f"the runtimes agree on fp16 here: {figures}"  # a measured fact (docs/targets.md)
    bound = round((low + high) / 2, 1)
    copy = copy_project(built, tmp_path / "copy")
    copy.write_pipeline(PIPELINE + f"thresholds:\n  fp16: {{sqnr_db: {bound}}}\n")
    run = copy.doit("validate", "target", "report")
    assert run.returncode != 0
    cell = summary(copy)["cnn/xnnpack/fp16"]
    assert cell["status"] == "failed"
    assert f"{low:.1f}" in cell["note"] and f"{high:.1f}" in cell["note"], cell["note"]
    assert str(bound) in cell["note"]
    assert summary(copy)["reg/xnnpack/fp16"]["status"] == "provisional"  # 75 dB everywhere


def test_without_qemu_the_cell_keeps_its_host_verdict_and_says_what_is_missing(built, tmp_path):
    path = tmp_path / "bin"  # this machine's tools, less qemu
    path.mkdir()
    for tool in Path("/usr/bin").iterdir():
        if not tool.name.startswith("qemu-"):
            (path / tool.name).symlink_to(tool)
    copy = copy_project(built, tmp_path / "copy")
    run = copy.doit("target", "report", extra_env={"PATH": str(path)})
    assert run.returncode == 0, run.stdout + run.stderr
    assert "target:cnn/xnnpack/fp32" in run.started  # its key holds qemu's version: it judged again
    cell = summary(copy)["cnn/xnnpack/fp32"]
    assert cell["status"] == "provisional"
    assert cell["checks"][HOST_COLUMN] == summary(built)["cnn/xnnpack/fp32"]["checks"][HOST_COLUMN]
    assert cell["checks"][f"SQNR dB ({A76})"] == "not run"
    line = f"not checked on {A76}, {A72}: qemu-aarch64 is not on PATH (Debian's qemu-user; run `etforge setup-targets`)"
    assert line in cell["note"]
    assert os.linesep not in cell["note"]


def test_no_target_figure_is_a_latency(built):
    cells = summary(built)
    report = (built.out / "report.html").read_text()
    assert "qemu" not in json.dumps([c["p50_ms"] for c in cells.values()])
    for name in ("target:cnn/xnnpack/fp32", "target:reg/xnnpack/int8"):
        info = state(built, name)["info"]
        assert not {k for k in json.dumps(info).split('"') if "latency" in k or k.endswith("_ms")}
    assert "aarch64" in report  # the report shows the targets' figures, as checks


LLM_PIPELINE = f"""\
name: t
version: 0.0.1
models:
  tiny_llm:
    transformers:
      task: text-generation
      config: {TINY_LLAMA_CONFIG}
      llm: {{max_context_len: 32, prompt_len: 8, decode_steps: 8}}
backends:
  xnnpack: {{}}
quantization: [fp32]
"""


def test_an_llm_program_says_which_library_the_aarch64_runtime_lacks(built, tmp_path):
    project = make_project(tmp_path / "llm", LLM_PIPELINE)
    run = project.doit("target", "report")
    assert run.returncode == 0, run.stdout + run.stderr
    cell = summary(project)["tiny_llm/xnnpack/fp32"]
    assert cell["status"] in ("ok", "provisional"), cell  # its host verdict stands: not failed, not unjudged
    assert cell["checks"][f"SQNR dB ({A76})"] == cell["checks"][f"SQNR dB ({A72})"] == "not run"
    assert (
        f"not checked on {A76}, {A72}: needs llama::custom_sdpa.out, llama::update_cache.out, which no library "
        "of the aarch64 ExecuTorch 1.5.1 runtime registers: the wheel registers them only in "
        "executorch/extension/llm/custom_ops/libcustom_ops_aot_lib.so, which needs "
    ) in cell["note"]
    assert "libtorch.so" in cell["note"]
