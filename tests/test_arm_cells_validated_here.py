"""Arm cells checked on this host, through the real doit pipeline.

One project built once (module fixture, ~45 s on 2 cores): a tiny CNN on arm_tosa fp32
(TOSA-1.0+FP) and int8 (TOSA-1.0+INT) and ethos_u55 int8. The TOSA cells run on the TOSA
reference model, the Ethos-U cell through the TOSA graph Vela compiled (a proxy) with Vela's
summary in its export record. VGF cells: tests/test_vgf_cells.py.
"""

from __future__ import annotations

import json
import struct
from importlib import metadata

import pytest
from conftest import check, make_project, state

PIPELINE = """\
name: t
version: 0.0.1
models:
  cnn:
    python: models.small_cnn:build
    kwargs: {num_classes: 3, width: 4}
    inputs: [{name: image, shape: [1, 3, 8, 8]}]
backends:
  arm_tosa: {}
  ethos_u55: {}
quantization: [fp32, int8]
matrix:
  product: false
  include:
    - {model: cnn, backend: arm_tosa}
    - {model: cnn, backend: ethos_u55, quantization: int8}
"""
TOSA_FP, TOSA_INT, ETHOS = "cnn/arm_tosa/fp32", "cnn/arm_tosa/int8", "cnn/ethos_u55/int8"


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    project = make_project(tmp_path_factory.mktemp("arm") / "proj", PIPELINE)
    run = project.doit()
    assert run.returncode == 0, run.stdout + run.stderr
    return project


def rows(project) -> dict:
    return {r["cell"]: r for r in json.loads((project.out / "summary.json").read_text())}


def numerics(project, cell: str) -> dict:
    model, backend, scheme = cell.split("/")
    return json.loads((project.out / model / f"{model}_{backend}_{scheme}.numerics.json").read_text())


def index_entry(project, cell: str) -> dict:
    index = json.loads((project.out / "manifests" / "index.json").read_text())
    model, backend, scheme = cell.split("/")
    return next(
        v for v in index["models"] if (v["modelName"], v["backend"], v["quantization"]) == (model, backend, scheme)
    )


def test_tosa_fp_and_int_cells_are_validated_on_the_reference_model(built):
    table = rows(built)
    for cell, floor in ((TOSA_FP, 100.0), (TOSA_INT, 30.0)):
        row = table[cell]
        # judged here like a host-runnable cell (random inputs: provisional), not shipped unchecked
        assert row["status"] == "provisional", row
        assert row["note"].startswith("run on the TOSA reference model (tosa-tools "), row
        report = numerics(built, cell)
        assert report["passed"] and report["runner"].startswith("TOSA reference model (tosa-tools ")
        output = report["outputs"][0]
        # the FP reference model may compute bit for bit what eager does (no SQNR: infinite)
        exact = output["sqnr_db"] is None and output["max_abs_error"] == 0.0
        assert exact or output["sqnr_db"] > floor, report["outputs"]
        assert report["thresholds"] == {"sqnr_db": 60 if cell == TOSA_FP else 20}
        assert state(built, f"validate:{cell}")["status"] == "ok"
        assert "validated_by" in index_entry(built, cell)["verdict"], index_entry(built, cell)
    assert "TOSA reference model" in (built.out / "report.html").read_text()
    # no .bpte: the verdict was made here
    assert not list(built.out.glob("cnn/cnn_arm_tosa_*.bpte"))


def test_tosa_int_program_runs_as_upstream_runs_it(built):
    """The whole INT program (quantize, TOSA delegate, dequantize) from the .pte alone gives what
    ExecuTorch's Arm tests get from the in-memory program (TosaReferenceModelDispatch)."""
    import torch
    from executorch.backends.arm.test.runner_utils import TosaReferenceModelDispatch
    from executorch.exir import to_edge_transform_and_lower

    from etforge.builders.arm.tosa_reference import tosa_program
    from etforge.builders.capture.capture import load_programs
    from etforge.builders.lowering.partitioners import arm_tosa

    key = state(built, "quantize:cnn/int8/arm_tosa_int8")["key"]
    program = load_programs(built.root / "artifacts" / "cache" / key[:2] / key / "model.pt2")["forward"]
    edge = to_edge_transform_and_lower(program, partitioner=arm_tosa({"tosa_spec": "TOSA-1.0+INT"}))
    x = torch.randn(1, 3, 8, 8, generator=torch.Generator().manual_seed(3))
    with TosaReferenceModelDispatch(), torch.no_grad():
        upstream = edge.exported_program().module()(x)
    (ours,) = tosa_program(built.out / "cnn" / "cnn_arm_tosa_int8.pte", [[x]], {})[0]
    assert torch.equal(torch.from_numpy(ours), upstream)


def test_a_tosa_cell_that_misses_its_threshold_fails_saying_what_ran_it(built, tmp_path):
    """The same verdict as a host-runnable cell: here the real validate builder on the built
    program, with a threshold the INT cell cannot meet (in-process: no second doit run). Not the
    FP cell: its reference model may match eager bit for bit, which meets any SQNR."""
    import dataclasses

    from etforge.builders.numerics.validate import build_validate, stand_in_runner
    from etforge.config.resolve import resolve
    from etforge.pipeline.results import TaskStatus

    cell = next(c for c in resolve(built.pipeline).cells if c.name == TOSA_INT)
    strict = dataclasses.replace(cell, thresholds={"sqnr_db": 200})
    entry = built.root / "artifacts" / "cache"
    capture_key = state(built, "capture:cnn")["key"]
    result = build_validate(
        strict,
        built.out / "cnn" / "cnn_arm_tosa_int8.pte",
        entry / capture_key[:2] / capture_key / "reference.npz",
        ["float32"],
        tmp_path,
        runner=stand_in_runner(strict.backend, {}),
    )
    assert result.status == TaskStatus.FAILED
    assert result.reason.startswith("output 0: SQNR ") and "< 200 dB" in result.reason, result.reason
    tools = metadata.version("tosa-tools")
    assert result.reason.endswith(f"; run on the TOSA reference model (tosa-tools {tools}), not the ExecuTorch runtime")
    (numerics,) = result.result.checks
    assert numerics.passed is False and numerics.runner.startswith("TOSA reference model")


def _vela_blocks(pte: bytes) -> dict:
    """The blocks of the Ethos-U delegate's Vela bin stream (executorch backends/arm/arm_vela.py)."""
    from executorch.exir._serialize._program import deserialize_pte_binary

    program = deserialize_pte_binary(pte).program
    (delegate,) = program.execution_plan[0].delegates
    payload = bytes(program.backend_delegate_data[delegate.processed.index].data)
    blocks, at = {}, 0
    while at < len(payload):
        name = payload[at : at + 16].split(b"\0", 1)[0].decode()
        (length,) = struct.unpack_from("<I", payload, at + 16)
        blocks[name] = payload[at + 32 : at + 32 + length]
        at += 32 + (length + 15) // 16 * 16
    return blocks


def test_ethos_u_cell_records_vela_summary_and_proxy_verdict(built):
    info = check(state(built, f"export:{ETHOS}")["info"], "vela")
    assert (info["accelerator"], info["system_config"], info["memory_mode"]) == (
        "Ethos_U55_128",
        "Ethos_U55_High_End_Embedded",
        "Shared_Sram",
    )
    assert info["npu_ops"] > 0 and info["cpu_ops"] == 0
    assert info["cycles_total"] >= info["cycles_npu"] > 0
    assert info["inference_time_s"] == pytest.approx(info["cycles_total"] / info["core_clock_hz"])
    # The memory figures are the program's own: the device allocates the scratch area the bin
    # stream asks for, and the weights it carries live in off-chip flash (Shared_Sram).
    blocks = _vela_blocks((built.out / "cnn" / "cnn_ethos_u55_int8.pte").read_bytes())
    assert info["sram_bytes"] == struct.unpack("<I", blocks["scratch_size"])[0]
    assert info["offchip_flash_bytes"] == len(blocks["weight_data"])
    assert len(info["delegates"]) == 1 and info["delegates"][0]["nn_macs"] > 0
    # validated through the TOSA form of the same quantized graph, and said so
    row = rows(built)[ETHOS]
    assert row["status"] == "provisional"
    assert row["note"].startswith("validated by proxy: the TOSA-INT graph Vela compiled"), row
    report = numerics(built, ETHOS)
    assert report["passed"] and "Vela's NPU compilation not checked" in report["proxy"]
    assert report["outputs"][0]["sqnr_db"] > 30
