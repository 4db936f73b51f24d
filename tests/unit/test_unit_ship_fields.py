"""What the manifests say a device needs (capabilities) and which variant each platform picks first."""

from __future__ import annotations

from etforge.config.recipes import DEFAULT_PATH
from etforge.pipeline.stage_results import ExportResult
from etforge.program.costs import ProgramCosts
from etforge.publish.manifests.ship_fields import capabilities, platform_defaults
from unit.support import make_unit_project

PIPELINE = """\
name: t
version: 0.0.1
models:
  a:
    python: models.a:build
    inputs: [{name: x, shape: [1, 4]}]
backends:
  coreml: {minimum_deployment_target: iOS18}
  qnn: {}
  xnnpack: {}
quantization: [fp32]
"""


def test_capabilities_name_ram_delegates_and_the_options_recipes_declare(tmp_path):
    plan = make_unit_project(tmp_path / "p", PIPELINE, ("a",)).plan()
    cells = {c.backend.name: c for c in plan.cells}
    program = ExportResult(
        costs=ProgramCosts(
            size_breakdown={"constants": 1000, "delegates": {"CoreMLBackend": 50}, "program": 10},
            planned_bytes={"forward": [300, 200], "etforge_meta_json": []},
            delegate_subgraphs={"CoreMLBackend": 2},
        ),
        data_size_bytes=24,
    )
    caps = capabilities(cells["coreml"], program)
    assert caps == {
        "min_ram_bytes": 500 + 1000 + 24,
        "delegates_required": ["CoreMLBackend"],
        "coreml_min_deployment_target": "iOS18",
    }
    assert capabilities(cells["qnn"], ExportResult(delegates=("QnnBackend",)))["qnn_soc"] == "SM8650"
    assert capabilities(cells["xnnpack"], ExportResult(delegates=("XnnpackBackend",))) == {
        "min_ram_bytes": None,  # not recorded: no figure is made up
        "delegates_required": ["XnnpackBackend"],
    }


def test_every_capability_a_recipe_declares_names_one_of_its_options():
    for name in DEFAULT_PATH.available("backend"):
        recipe = DEFAULT_PATH.load("backend", name)
        for field, option in ((recipe.data.get("manifest") or {}).get("capabilities") or {}).items():
            assert option in (recipe.data.get("options") or {}), f"{name}: {field} names no option {option!r}"


def test_the_default_is_the_fastest_measured_else_the_declared_order():
    fallback = {
        "android": ["a/qnn/fp32", "a/xnnpack/int8", "a/xnnpack/fp32"],
        "linux": ["a/xnnpack/fp32", "a/xnnpack/int8", "a/portable/fp32"],
        "ios": [],
    }
    latency = {"a/xnnpack/fp32": 0.52, "a/xnnpack/int8": 0.31, "a/portable/fp32": 4.0}
    got = platform_defaults(fallback, latency)
    assert got["android"] == {
        "variant": "a/qnn/fp32",
        "ranked_by": "fallback order",
        "reason": "first in the declared android fallback order (the first is not measured on the build host)",
    }
    assert got["linux"] == {
        "variant": "a/xnnpack/int8",
        "ranked_by": "host latency",
        "reason": "fastest run measured on the build host of 3 measured variant(s) "
        "(within 10% of it, the declared order decides)",
    }
    # a re-benchmark that moves p50s within the tie margin changes neither the pick nor its reason
    close = {"a/xnnpack/fp32": 0.32, "a/xnnpack/int8": 0.31, "a/portable/fp32": 4.0}
    assert platform_defaults(fallback, close)["linux"]["variant"] == "a/xnnpack/fp32"
    close_again = {"a/xnnpack/fp32": 0.30, "a/xnnpack/int8": 0.32, "a/portable/fp32": 4.1}
    assert platform_defaults(fallback, close_again) == platform_defaults(fallback, close)
    assert "ios" not in got
    assert platform_defaults(fallback, {})["linux"]["reason"] == (
        "first in the declared linux fallback order (not measured on the build host)"
    )
