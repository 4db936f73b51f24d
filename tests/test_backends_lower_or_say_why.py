"""Backend recipes: real lowering on this host, and refusal of SDK-gated ones.

Every backend recipe that lowers here is driven through its own partitioner
factory, loaded from recipes/backends/<name>.yaml with its default options,
on one small CNN exported once for the module. Ethos-U is int8-only, so it is
tested on a PT2E int8 program. SDK-gated recipes must report their missing
requirement from ``needs`` without importing the backend.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import yaml
from conftest import check

REPO = Path(__file__).resolve().parent.parent
RECIPES = REPO / "recipes" / "backends"

# Lower here (fp32): recipe name -> whether the pip runtime runs the program here.
FP32_LOWERABLE = ["xnnpack", "portable", "coreml", "vulkan", "openvino", "arm_tosa", "arm_vgf"]
INT8_ONLY = ["ethos_u55", "ethos_u85"]
CORTEX_M = ["cortex_m55", "cortex_m7"]  # int8 only, no delegate: tests/test_cortex_m_cells.py
# Need an SDK, another platform or a source build of executorch.
SDK_GATED = ["qnn", "mediatek", "nxp_neutron", "samsung_exynos", "cadence", "cuda", "metal", "mlx", "mps"]
PLATFORM_WORDS = {"darwin": "macOS", "linux": "Linux", "win32": "Windows"}


def recipe(name: str) -> dict:
    return yaml.safe_load((RECIPES / f"{name}.yaml").read_text())


def defaults(doc: dict) -> dict:
    return {k: v["default"] for k, v in (doc.get("options") or {}).items() if "default" in v}


def factory(doc: dict):
    module_name, func_name = doc["partitioner"].split(":")
    return getattr(importlib.import_module(module_name), func_name)


def partitioners(name: str) -> list:
    doc = recipe(name)
    return [] if doc["partitioner"] is None else list(factory(doc)(defaults(doc)))


def missing(needs: dict) -> list[tuple[str, str]]:
    """(kind, what) for each unmet requirement, found without importing anything."""
    out = [("env", var) for var in needs.get("env", []) if not os.environ.get(var)]
    for module in needs.get("modules", []):
        top, *rest = module.split(".")
        spec = importlib.util.find_spec(top)
        found = spec is not None
        if found and rest:
            found = any(
                Path(loc).joinpath(*rest).is_dir()
                or Path(loc).joinpath(*rest).with_suffix(".py").is_file()
                or any(Path(loc).joinpath(*rest[:-1]).glob(rest[-1] + ".*.so"))
                for loc in spec.submodule_search_locations or ()
            )
        if not found:
            out.append(("module", module))
    platforms = needs.get("platforms") or []
    if platforms and sys.platform not in platforms:
        out.append(("platform", platforms[0]))
    return out


# --------------------------------------------------------------------------- recipe files


def test_every_backend_recipe_is_covered_and_well_formed():
    names = sorted(p.stem for p in RECIPES.glob("*.yaml"))
    assert sorted(FP32_LOWERABLE + INT8_ONLY + CORTEX_M + SDK_GATED) == names
    for name in names:
        doc = recipe(name)
        assert doc["name"] == name and doc["kind"] == "backend" and doc["description"]
        runtime_keys = {"delegates", "host_runnable", "cmake_targets", "validated_by", "probe", "targets"}
        assert {"delegates", "host_runnable"} <= set(doc["runtime"]) <= runtime_keys
        # what checks a program the runtime cannot run (validated_by) or says what is missing (probe)
        for ref in ((doc["runtime"].get("validated_by") or {}).get("runner"), doc["runtime"].get("probe")):
            if ref:
                assert not doc["runtime"]["host_runnable"], name
                module_name, func_name = ref.split(":")
                assert callable(getattr(importlib.import_module(module_name), func_name)), ref
        # the one home of its facts: how the manifests name it, and what an app links for its delegate
        assert doc["manifest"]["description"], name
        assert bool(doc["runtime"].get("cmake_targets")) <= bool(doc["runtime"]["delegates"]), name
        # A delegate declares the coverage it must reach; no delegate (portable), no gate.
        if doc["runtime"]["delegates"]:
            assert 0 < doc["min_delegation_coverage"] <= 1, name
        else:
            assert "min_delegation_coverage" not in doc, name
        for option, schema in (doc.get("options") or {}).items():
            assert "default" in schema, f"{name}.{option} has no default"
            if "enum" in schema:
                assert schema["default"] in schema["enum"], f"{name}.{option} default not in enum"
        if doc["partitioner"] is not None:
            module_name, func_name = doc["partitioner"].split(":")
            assert callable(getattr(importlib.import_module(module_name), func_name))
        if doc.get("needs"):
            assert set(doc["needs"]) <= {"modules", "env", "platforms", "hint"}
            assert doc["needs"].get("hint"), f"{name}: needs without a hint"


def test_importing_the_factories_imports_no_backend():
    import subprocess

    code = (
        "import sys, etforge.builders.lowering.partitioners, etforge.builders.quantization.quantizers; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'executorch', 'coremltools')))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize("name", SDK_GATED)
def test_sdk_gated_recipe_is_unmet_here_and_its_hint_names_the_missing_piece(name):
    doc = recipe(name)
    unmet = missing(doc["needs"])
    assert unmet, f"{name}: every need is met on this host; move it to the lowering tests"
    hint = doc["needs"]["hint"]
    for kind, what in unmet:
        if kind == "platform":
            assert PLATFORM_WORDS.get(what, what) in hint or what in hint, (name, what, hint)
        elif kind == "module":
            # the module itself, or (for a generated/compiled submodule) its package
            assert what in hint or what.rsplit(".", 1)[0] in hint, (name, what, hint)
        else:
            assert what in hint, (name, what, hint)


def test_host_checker_agrees_with_recipe_needs():
    from etforge.config import requirements as host

    for name in SDK_GATED:
        assert host.missing_requirement(recipe(name)["needs"]), name
    for name in FP32_LOWERABLE + INT8_ONLY + CORTEX_M:
        assert host.missing_requirement(recipe(name).get("needs")) is None, name


def test_qnn_factory_refuses_without_sdk_and_never_imports_qualcomm(monkeypatch):
    monkeypatch.delenv("QNN_SDK_ROOT", raising=False)
    from etforge.builders.lowering import partitioners as P

    with pytest.raises(RuntimeError, match="QNN_SDK_ROOT"):
        P.qnn(defaults(recipe("qnn")))
    assert not any(m.startswith("executorch.backends.qualcomm") for m in sys.modules)


# --------------------------------------------------------------------------- lowering


class SmallCNN:
    @staticmethod
    def build():
        import torch

        torch.manual_seed(0)
        model = torch.nn.Sequential(
            torch.nn.Conv2d(3, 8, 3, padding=1),
            torch.nn.BatchNorm2d(8),
            torch.nn.ReLU(),
            torch.nn.Conv2d(8, 16, 3, padding=1),
            torch.nn.BatchNorm2d(16),
            torch.nn.ReLU(),
            torch.nn.AdaptiveAvgPool2d(1),
            torch.nn.Flatten(),
            torch.nn.Linear(16, 10),
        )
        for m in model.modules():  # meaningful BN statistics (random init collapses outputs)
            if isinstance(m, torch.nn.BatchNorm2d):
                m.momentum = None
        model.train()
        with torch.no_grad():
            for _ in range(4):
                model(torch.randn(4, 3, 16, 16))
        return model.eval(), (torch.randn(1, 3, 16, 16),)


@pytest.fixture(scope="module")
def cnn():
    import torch

    model, x = SmallCNN.build()
    with torch.no_grad():
        ref = model(*x)
    return model, x, ref, torch.export.export(model, x)


def lower(program, parts):
    from executorch.devtools.backend_debug import get_delegation_info
    from executorch.exir import to_edge_transform_and_lower

    edge = to_edge_transform_and_lower(program, partitioner=parts)
    delegated = get_delegation_info(edge.exported_program().graph_module).num_delegated_nodes
    return delegated, edge.to_executorch().buffer


def run(pte: bytes, x):
    from executorch.runtime import Runtime

    program = Runtime.get().load_program(pte)  # keep alive while the method runs
    return program.load_method("forward").execute([t.contiguous() for t in x])[0]


@pytest.mark.parametrize("name", FP32_LOWERABLE)
def test_fp32_lowers(name, cnn):
    import torch

    _, x, ref, program = cnn
    doc = recipe(name)
    delegated, pte = lower(program, partitioners(name))
    assert len(pte) > 1000
    if doc["runtime"]["delegates"]:
        assert delegated > 0, f"{name} took no op"
    else:
        assert delegated == 0
    if doc["runtime"]["host_runnable"]:
        out = run(pte, x)
        # OpenVINO computes in bf16 on CPUs that have it
        torch.testing.assert_close(out, ref, atol=1e-2 if name == "openvino" else 1e-5, rtol=1e-2)


@pytest.mark.parametrize("name", INT8_ONLY)
def test_ethos_u_int8_lowers_and_float_delegates_nothing(name, cnn):
    import executorch.kernels.quantized  # noqa: F401  (q/dq ops left outside the delegate)
    import torch

    from etforge.builders.quantization.quantize import pt2e_quantize
    from etforge.builders.quantization.quantizers import ethos_u_int8

    model, x, _, program = cnn
    options = defaults(recipe(name))
    calibration = [(torch.randn(1, 3, 16, 16),) for _ in range(4)]
    quantized = torch.export.export(pt2e_quantize(model, x, ethos_u_int8(options), calibration), x)
    delegated, pte = lower(quantized, partitioners(name))
    assert delegated > 0 and len(pte) > 1000
    float_delegated, _ = lower(program, partitioners(name))
    assert float_delegated == 0


def test_fallback_chain_coreml_then_xnnpack(cnn):
    from executorch.exir import to_edge_transform_and_lower

    from etforge.builders.gates.gates import delegation_coverage

    _, _, _, program = cnn
    edge = to_edge_transform_and_lower(program, partitioner=partitioners("coreml") + partitioners("xnnpack"))
    coverage = delegation_coverage(edge.exported_program().graph_module)
    # A chain's coverage counts every member: Core ML takes this whole graph.
    assert coverage["delegation_coverage"] == 1.0 and coverage["not_delegated"] == {}
    assert coverage["delegated_by_backend"] == {"CoreMLBackend": coverage["compute_ops"]}
    assert len(edge.to_executorch().buffer) > 1000


# --------------------------------------------------------------------------- the coverage gate, through doit

MOSTLY_PORTABLE = '''\
"""One linear layer XNNPACK takes, then a 3-D convolution it has no kernel for: most of the compute runs on
portable kernels."""
import torch
from torch import nn


class MostlyPortable(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(8, 8)
        self.conv = nn.Conv3d(2, 16, 3)

    def forward(self, x):
        return self.conv(self.linear(x)).atan()


def build():
    return MostlyPortable()
'''
COVERAGE_PIPELINE = """\
name: t
models:
  linreg:
    python: models.linreg:build
    inputs: [{name: features, shape: [1, 4]}]
  mostly_portable:
    python: models.mostly_portable:build
    inputs: [{name: x, shape: [1, 2, 8, 8, 8]}]
backends:
  xnnpack: {}
quantization: [fp32]
"""


@pytest.fixture(scope="module")
def coverage_run(tmp_path_factory):
    from conftest import make_project

    project = make_project(tmp_path_factory.mktemp("coverage") / "proj", COVERAGE_PIPELINE)
    (project.root / "models" / "mostly_portable.py").write_text(MOSTLY_PORTABLE)
    return project, project.doit("export")


def _export_state(project, cell: str) -> dict:
    import json

    return json.loads((project.out / ".state" / f"export__{cell.replace('/', '__')}.json").read_text())


def test_the_coverage_gate_fails_a_program_that_runs_mostly_on_portable_kernels(coverage_run):
    import json

    project, run = coverage_run
    assert run.returncode == 1, run.stdout + run.stderr
    state = _export_state(project, "mostly_portable/xnnpack/fp32")
    assert state["status"] == "failed"
    reason = state["reason"]
    # judged on compute: the convolution's FLOPs dwarf the delegated linear's
    assert reason.startswith("backend 'xnnpack' runs 4% of the program's compute ("), reason
    assert "gate: at least 50%); the rest runs on portable kernels (aten.convolution " in reason
    assert reason.endswith("; 1 of 3 compute ops (33%) delegated"), reason
    # The evidence stays: the program and its export.json with the coverage.
    info = json.loads((project.out / "mostly_portable" / "mostly_portable_xnnpack_fp32.export.json").read_text())
    info = check(info, "delegation")
    assert info["compute_coverage"] < 0.1 and info["flops_not_delegated"]["aten.convolution"] > 100_000
    assert info["delegation_coverage"] == 0.3333 and info["delegated_by_backend"] == {"XnnpackBackend": 1}
    assert (project.out / "mostly_portable" / "mostly_portable_xnnpack_fp32.pte").is_file()


def test_the_coverage_gate_passes_a_fully_delegated_program(coverage_run):
    project, _ = coverage_run
    state = _export_state(project, "linreg/xnnpack/fp32")
    assert state["status"] == "ok"
    delegation = check(state["info"], "delegation")
    assert delegation["delegation_coverage"] == delegation["compute_coverage"] == 1.0
    assert delegation["compute_ops"] == delegation["delegated_compute_ops"] == 1


def test_a_pipeline_can_lower_a_backends_minimum_and_that_rejudges_the_export(coverage_run):
    from etforge.checks.delegation import Delegation
    from etforge.config.resolve import resolve
    from etforge.pipeline.specs import spec_of
    from etforge.pipeline.stage_results import ExportResult

    project, _ = coverage_run
    before = resolve(project.pipeline)
    project.write_pipeline(COVERAGE_PIPELINE + "gates: {min_delegation_coverage: {xnnpack: 0.02}}\n")
    try:
        after = resolve(project.pipeline)
    finally:
        project.write_pipeline(COVERAGE_PIPELINE)
    cell = next(c for c in after.cells if c.model.name == "mostly_portable")
    old = next(c for c in before.cells if c.model.name == "mostly_portable")
    assert (old.backend.min_coverage, cell.backend.min_coverage) == (0.5, 0.02)
    assert (
        spec_of(after, "export", cell).key != spec_of(before, "export", old).key
    )  # a changed minimum judges the program again
    (measured,) = ExportResult.from_json(_export_state(project, "mostly_portable/xnnpack/fp32")["info"]).checks
    assert isinstance(measured, Delegation)
    assert replace(measured, minimum=cell.backend.min_coverage).judged().passed  # the pipeline's 2%
    assert "runs 4% of the program's compute" in replace(measured, minimum=old.backend.min_coverage).judged().reason()
