"""Plan-time decisions of the weight-group schemes (no torch: resolve only)."""

from __future__ import annotations

import pytest
from conftest import make_project

from etforge.config.resolve import resolve
from etforge.core.errors import PipelineError

PIPELINE = """\
name: t
models:
  linreg:
    python: models.linreg:build
    inputs: [{name: features, shape: [1, 4]}]
backends:
  xnnpack: {}
quantization: [fp32, 8da4w]
quantization_options: {8da4w: OPTIONS}
"""


def plan_with(tmp_path, options: str):
    return resolve(make_project(tmp_path / "p", PIPELINE.replace("OPTIONS", options)).pipeline)


def test_a_group_size_xnnpack_cannot_lower_is_rejected_at_plan_time(tmp_path):
    plan = plan_with(tmp_path, "{group_size: 16}")
    assert [c.name for c in plan.cells] == ["linreg/xnnpack/fp32"]
    (rejected,) = plan.rejected
    assert rejected.name == "linreg/xnnpack/8da4w"
    assert rejected.reason == "xnnpack lowers only weight groups of a multiple of 32: 8da4w group_size 16 is not one"


def test_embedding_options_reach_the_quantize_transform(tmp_path):
    plan = plan_with(tmp_path, "{embedding: 8, embedding_group_size: 0, min_weight_elements: 256}")
    cell = next(c for c in plan.cells if c.quant.name == "8da4w")
    assert {k: cell.transform.options[k] for k in ("embedding", "embedding_group_size", "min_weight_elements")} == {
        "embedding": 8,
        "embedding_group_size": 0,
        "min_weight_elements": 256,
    }


def test_an_embedding_width_that_is_not_4_or_8_bits_is_a_pipeline_error(tmp_path):
    with pytest.raises(PipelineError) as info:
        plan_with(tmp_path, "{embedding: 3}")
    assert str(info.value).endswith(
        "pipeline.yaml:9: quantization_options.8da4w.embedding: invalid option: expected one of 4, 8, None, got 3"
    )
