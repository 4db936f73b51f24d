"""Cortex-M cells (ExecuTorch's backends/cortex_m, CMSIS-NN) through the real doit pipeline.

One project built once (module fixture, ~30 s on 2 cores): a tiny CNN, int8, on cortex_m55 (MVE)
and cortex_m7 (DSP), one quantized graph for both. The programs hold cortex_m:: operators only and
are validated by proxy: the .pte's own instructions with ExecuTorch's Python cortex_m:: operators
in place of CMSIS-NN's kernels, which no runtime here has. The M7 cell is over its planned-memory
budget on purpose; the rest of the checks run in-process on the built programs.
"""

from __future__ import annotations

import json

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
  cortex_m55: {}
  cortex_m7: {}
quantization: [int8]
gates:
  max_program_bytes: {cortex_m55: 65536}
  max_planned_bytes: {cortex_m7: 512}
"""
M55, M7 = "cnn/cortex_m55/int8", "cnn/cortex_m7/int8"
PROXY_NOTE = (
    "validated by proxy: ExecuTorch's Python cortex_m:: operators in place of CMSIS-NN's MVE kernels, "
    "which no runtime on this host has (the program's own instructions, constants and memory plan), "
    "run on the Cortex-M dialect interpreter"
)
KERNELS = {  # what the small CNN becomes: every op a CMSIS-NN kernel, in NHWC (explicit layout)
    "cortex_m::quantize_per_tensor.out",
    "cortex_m::transpose.out",
    "cortex_m::quantized_conv2d_nhwc.out",
    "cortex_m::quantized_avg_pool2d_nhwc.out",
    "cortex_m::quantized_linear.out",
    "cortex_m::dequantize_per_tensor.out",
}


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    project = make_project(tmp_path_factory.mktemp("cortex_m") / "proj", PIPELINE)
    run = project.doit()
    # the M7 cell fails its budget, and only it
    assert run.returncode == 1 and "1 failing: cnn/cortex_m7/int8" in run.stdout + run.stderr, run.stdout + run.stderr
    return project


def rows(project) -> dict:
    return {r["cell"]: r for r in json.loads((project.out / "summary.json").read_text())}


def numerics(project, cell: str) -> dict:
    model, backend, scheme = cell.split("/")
    return json.loads((project.out / model / f"{model}_{backend}_{scheme}.numerics.json").read_text())


def pte(project, cell: str):
    model, backend, scheme = cell.split("/")
    return project.out / model / f"{model}_{backend}_{scheme}.pte"


def program(project, cell: str):
    from executorch.exir._serialize._program import deserialize_pte_binary

    return deserialize_pte_binary(pte(project, cell).read_bytes()).program


def cached(project, task: str, name: str):
    key = state(project, task)["key"]
    return project.root / "artifacts" / "cache" / key[:2] / key / name


def test_an_m55_int8_cell_is_validated_by_proxy_and_says_so(built):
    row = rows(built)[M55]
    assert row["status"] == "provisional", row  # judged here, on seeded random inputs
    assert row["note"].startswith(PROXY_NOTE), row
    report = numerics(built, M55)
    assert report["passed"] and report["runner"] == "Cortex-M dialect interpreter"
    assert "CMSIS-NN's MVE kernels, which no runtime on this host has" in report["proxy"]
    assert report["outputs"][0]["sqnr_db"] > 30, report["outputs"]  # measured 48.9 dB against eager fp32
    numeric = check(state(built, f"validate:{M55}")["info"], "numerics")
    assert numeric["proxy"] == report["proxy"] and numeric["runner"] == report["runner"]
    index = json.loads((built.out / "manifests" / "index.json").read_text())
    entry = next(v for v in index["models"] if v["backend"] == "cortex_m55")
    assert entry["verdict"]["validated_by"] == PROXY_NOTE and entry["delegates"] == []
    assert "Cortex-M dialect interpreter" in (built.out / "report.html").read_text()
    # a verdict made here: no bundle for the device, and no host timing of a program this host cannot run
    assert not list(built.out.glob("cnn/*.bpte"))
    assert not (built.out / ".state" / "benchmark__cnn__cortex_m55__int8.json").exists()


def test_the_program_holds_only_what_a_cortex_m_build_loads(built):
    from etforge.builders.cortex_m.dialect import foreign_operators, registered_operators

    for cell in (M55, M7):
        found = program(built, cell)
        (plan,) = [p for p in found.execution_plan if p.name == "forward"]
        assert {f"{op.name}.{op.overload}" for op in plan.operators} == KERNELS, cell
        assert not plan.delegates and foreign_operators(found, registered_operators()) == []
        export = state(built, f"export:{cell}")["info"]
        assert set(export["operators"]) == KERNELS and export["delegates"] == []
        assert (
            "cortex_m::quantized_conv2d_nhwc.out"
            in cached(built, f"export:{cell}", "selected_operators.yaml").read_text()
        )
    # the model's own NCHW input, as every other backend's program takes it (explicit layout)
    (plan,) = [p for p in program(built, M55).execution_plan if p.name == "forward"]
    assert list(plan.values[plan.inputs[0]].val.dim_order) == [0, 1, 2, 3]


def test_the_core_decides_the_kernels_and_their_scratch_memory(built):
    """One quantized graph, two programs: the MVE linear kernel takes precomputed kernel sums, the DSP
    one none, and CMSIS-NN's scratch buffers (planned memory) differ between the two kernel families."""
    from executorch.exir import schema

    assert state(built, f"export:{M55}")["info"]["sha256"] != state(built, f"export:{M7}")["info"]["sha256"]
    facts = {}
    for cell in (M55, M7):
        (plan,) = [p for p in program(built, cell).execution_plan if p.name == "forward"]
        linear = next(
            i.instr_args
            for i in plan.chains[0].instructions
            if plan.operators[i.instr_args.op_index].name == "cortex_m::quantized_linear"
        )
        kernel_sum = plan.values[linear.args[3]].val
        scratch = [
            list(v.val.sizes)
            for v in plan.values
            if isinstance(v.val, schema.Tensor) and v.val.scalar_type == 0 and v.val.data_buffer_idx == 0
        ]
        facts[cell] = (isinstance(kernel_sum, schema.Tensor), scratch)
    assert facts[M55][0] and not facts[M7][0]
    assert facts[M55][1] != facts[M7][1], facts


def test_the_proxy_computes_what_upstreams_dialect_test_computes(built):
    """The .pte run from its bytes gives, bit for bit, what upstream's CortexMTester.test_dialect
    compares against: the rewritten edge program's module, here for the cell's own quantized graph."""
    import executorch.backends.cortex_m.passes  # noqa: F401  (registers the ops the quantized graph holds)
    import torch

    from etforge.builders.capture.capture import load_programs
    from etforge.builders.cortex_m.dialect import cortex_m_dialect
    from etforge.builders.cortex_m.lowering import lower_to_edge

    graph = load_programs(cached(built, "quantize:cnn/int8/cortex_m_int8", "model.pt2"))["forward"]
    module = lower_to_edge(graph, {"cpu": "cortex-m55", "isa": "MVE"}).exported_program().module()
    generator = torch.Generator().manual_seed(3)
    samples = [[torch.randn(1, 3, 8, 8, generator=generator)] for _ in range(3)]
    ours = cortex_m_dialect(pte(built, M55), samples, {})
    for (x,), (y,) in zip(samples, ours):
        assert torch.equal(torch.from_numpy(y), module(x))


def test_an_m55_cell_that_misses_its_threshold_fails_naming_the_proxy(built, tmp_path):
    """The real validate builder on the built program, with a threshold the int8 cell cannot meet."""
    import dataclasses

    from etforge.builders.numerics.validate import build_validate, stand_in_runner
    from etforge.config.resolve import resolve
    from etforge.pipeline.results import TaskStatus

    cell = next(c for c in resolve(built.pipeline).cells if c.name == M55)
    strict = dataclasses.replace(cell, thresholds={"sqnr_db": 200})
    result = build_validate(
        strict,
        pte(built, M55),
        cached(built, "capture:cnn", "reference.npz"),
        ["float32"],
        tmp_path,
        runner=stand_in_runner(strict.backend, {}),
    )
    assert result.status == TaskStatus.FAILED
    assert result.reason.startswith("output 0: SQNR ") and "< 200 dB" in result.reason, result.reason
    assert result.reason.endswith(PROXY_NOTE), result.reason
    (numeric,) = result.result.checks
    assert numeric.failed and numeric.proxy.startswith("ExecuTorch's Python cortex_m:: operators")


def test_budgets_judge_the_programs_planned_memory_and_size(built):
    from executorch.exir._serialize._program import deserialize_pte_binary

    table = rows(built)
    planned = {}
    for cell in (M55, M7):
        costs = state(built, f"export:{cell}")["info"]["costs"]
        raw = deserialize_pte_binary(pte(built, cell).read_bytes()).program
        (plan,) = [p for p in raw.execution_plan if p.name == "forward"]
        # the arenas a Cortex-M build must hand the method: activations and CMSIS-NN scratch buffers
        assert costs["planned_bytes"]["forward"] == [int(n) for n in plan.non_const_buffer_sizes[1:]]
        planned[cell] = sum(costs["planned_bytes"]["forward"])
    assert table[M55]["status"] == "provisional" and table[M55]["checks"]["budget"] == "within"
    assert table[M7]["status"] == "failed", table[M7]
    assert table[M7]["note"] == f"over budget: planned memory {planned[M7]} B > gates.max_planned_bytes.cortex_m7 512 B"
    assert numerics(built, M7)["passed"]  # its numerics pass: the budget alone fails it


def test_a_program_a_cortex_m_build_cannot_load_is_refused(built):
    """An operator no Cortex-M kernel library registers (here the M55 program with one op renamed to
    ExecuTorch's llama:: SDPA) stops the proxy with one line, before anything runs."""
    from executorch.exir._serialize._program import deserialize_pte_binary, serialize_pte_binary

    from etforge.builders.cortex_m.dialect import DialectInterpreter
    from etforge.core.errors import BuildError

    changed = deserialize_pte_binary(pte(built, M55).read_bytes())
    (plan,) = [p for p in changed.program.execution_plan if p.name == "forward"]
    plan.operators[0].name, plan.operators[0].overload = "llama::custom_sdpa", "out"
    refused = r"^not a program a Cortex-M build of ExecuTorch loads: it holds llama::custom_sdpa\.out \("
    with pytest.raises(BuildError, match=refused):
        DialectInterpreter(bytes(serialize_pte_binary(changed)))


def test_each_core_gets_its_cmsis_nn_kernel_family_and_a_bad_one_is_one_line():
    """What a project recipe for another core gets (no build: upstream's CortexMTargetConfig only)."""
    from etforge.builders.cortex_m.lowering import target_config
    from etforge.core.errors import BadValue

    family = {cpu: target_config({"cpu": cpu}).backend.name for cpu in ("cortex-m0", "cortex-m4", "cortex-m85")}
    assert family == {"cortex-m0": "SCALAR", "cortex-m4": "DSP", "cortex-m85": "MVE"}
    assert target_config({"cpu": "cortex-m55", "isa": "SCALAR"}).backend.name == "SCALAR"
    for options, said in (
        ({"cpu": "cortex-m99"}, "Unsupported Cortex-M target string: 'cortex-m99'"),
        ({"cpu": "cortex-m7", "isa": "MVE"}, "Backend MVE is not supported on M7"),
        ({"cpu": "cortex-m55", "isa": "NEON"}, "unknown kernel family 'NEON'; CMSIS-NN has ['DSP', 'MVE', 'SCALAR']"),
    ):
        with pytest.raises(BadValue) as raised:
            target_config(options)
        assert said in str(raised.value) and "\n" not in str(raised.value), raised.value
