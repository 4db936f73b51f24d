"""LLM schemes beyond fp32/8da4w: an fp16 cell on XNNPACK (model cast before the static-KV-cache
export, gated against fp32 eager and against the fp16 eager model), a Core ML fp32 cell (a static
capture without llama:: ops, lowered with the LLM's Core ML settings, ending in a .bpte), the
combinations that cannot work (refused at plan time with their reason) and the same-scheme gate.

One project, built once for the module: the tiny untied Llama of tests/test_llm_export_and_decode.py with
static shapes (Core ML takes no dynamic sequence length), 4-token prompt, 4 decode steps.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from conftest import TINY_LLAMA_CONFIG, check, make_project, state

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

CONFIG = TINY_LLAMA_CONFIG
MODEL = f"""\
  tiny_llm:
    transformers:
      task: text-generation
      config: {CONFIG}
      llm: {{max_context_len: 16, prompt_len: 4, decode_steps: 4, dynamic_shapes: DYNAMIC}}
"""
PIPELINE = f"""\
name: t
version: 0.0.1
models:
{MODEL.replace("DYNAMIC", "false")}backends:
  xnnpack: {{}}
  coreml: {{}}
quantization: [fp32, fp16]
targets: false  # aarch64 verdicts: tests/test_aarch64_targets.py
matrix:
  product: false
  include:
    - {{backend: xnnpack, quantization: fp16}}
    - {{backend: coreml, quantization: fp32}}
"""


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    project = make_project(tmp_path_factory.mktemp("llms") / "proj", PIPELINE)
    run = project.doit("validate")
    assert run.returncode == 0, run.stdout + run.stderr
    return project


def test_fp16_llm_cell_validates_against_fp32_and_fp16_eager(built):
    report = json.loads((built.out / "tiny_llm" / "tiny_llm_xnnpack_fp16.numerics.json").read_text())
    assert report["passed"], report["misses"]
    llm = report["llm"]
    assert 40 < llm["sqnr_db"] < 100  # fp16: far from fp32's ~130 dB, well inside the 35 dB gate
    assert llm["top1_agreement"] == 1.0
    assert report["thresholds"]["same_scheme_sqnr_db"] == 25
    assert llm["same_scheme"]["sqnr_db"] > llm["sqnr_db"]  # the program matches the fp16 model closer
    pte = built.out / "tiny_llm" / "tiny_llm_xnnpack_fp16.pte"
    assert pte.stat().st_size < 0.7 * 600_000  # fp16 weights (fp32 program: ~590 KB)


def test_coreml_llm_cell_lowers_without_custom_ops_and_ends_on_device(built):
    export = json.loads((built.out / "tiny_llm" / "tiny_llm_coreml_fp32.export.json").read_text())
    delegation = check(export, "delegation")
    assert export["delegates"] == ["CoreMLBackend"] and delegation["delegated_subgraphs"] >= 1
    assert not any(op.startswith("llama.") for op in delegation["not_delegated"]), delegation["not_delegated"]
    assert export["llm_metadata"]["enable_dynamic_shape"] is False
    assert export["llm_metadata"]["use_sdpa_with_kv_cache"] is False
    record = state(built, "validate:tiny_llm/coreml/fp32")
    assert record["status"] == "not-runnable", record
    bundled = json.loads((built.out / "tiny_llm" / "tiny_llm_coreml_fp32.bundled.json").read_text())
    assert bundled["test_cases"] == 4 and bundled["ordered"] is True
    assert (built.out / "tiny_llm" / "tiny_llm_coreml_fp32.bpte").stat().st_size > export["size_bytes"]


def _plan(tmp_path, dynamic: str, backends: str, schemes: str):
    from etforge.config.resolve import resolve

    text = f"name: t\nmodels:\n{MODEL.replace('DYNAMIC', dynamic)}backends: {backends}\nquantization: {schemes}\n"
    return resolve(make_project(tmp_path / "p", text).pipeline)


def test_llm_combinations_that_cannot_work_are_rejected_at_plan_time(tmp_path):
    plan = _plan(
        tmp_path,
        "false",
        "{xnnpack: {}, portable: {}, coreml: {}}",
        "[fp32, fp16, bf16, 8da4w, 8da8w, coreml_int4w, coreml_int8w]",
    )
    built = {c.name.removeprefix("tiny_llm/") for c in plan.cells}
    assert built == {
        "xnnpack/fp32",
        "xnnpack/fp16",
        "xnnpack/8da4w",
        "xnnpack/8da8w",
        "portable/fp32",
        "coreml/fp32",
        "coreml/coreml_int4w",
    }
    reasons = {r.name.removeprefix("tiny_llm/"): r.reason for r in plan.rejected}
    assert "KeyError: torch.int8" in reasons["coreml/8da4w"] and "coreml_int4w" in reasons["coreml/8da4w"]
    assert "Missing out variants" in reasons["portable/8da4w"]
    assert "Missing out variants" in reasons["portable/8da8w"]
    assert (
        "weight-only" in reasons["xnnpack/coreml_int4w"] or "drops the weight scales" in reasons["xnnpack/coreml_int4w"]
    )
    assert "fp32 weights" in reasons["coreml/fp16"]
    assert "does not delegate bf16" in reasons["xnnpack/bf16"]
    assert all(reasons[c] for c in reasons)


def test_dynamic_core_ml_llm_is_rejected_with_the_fix(tmp_path):
    plan = _plan(tmp_path, "true", "{xnnpack: {}, coreml: {}}", "[fp32]")
    assert [c.name for c in plan.cells] == ["tiny_llm/xnnpack/fp32"]
    (rejected,) = plan.rejected
    assert "static shapes" in rejected.reason and "dynamic_shapes: false" in rejected.reason


def test_same_scheme_gate_fails_a_doctored_or_nan_metric():
    import numpy as np
    import torch

    from etforge.builders.llm.numerics import LLM_THRESHOLDS, compare_same_scheme, llm_verdict

    thresholds = LLM_THRESHOLDS["8da4w"]
    healthy = {
        "sqnr_db": 15.0,
        "top1_agreement": 1.0,
        "greedy_agreement": 0.5,
        "nonfinite": {"values": 8, "nan": 0, "inf": 0},
        "same_scheme": {"sqnr_db": 40.0, "top1_agreement": 1.0},
    }
    assert llm_verdict(healthy, thresholds) == []
    doctored = {**healthy, "same_scheme": {"sqnr_db": 12.0, "top1_agreement": 0.5}}
    misses = llm_verdict(doctored, thresholds)
    assert len(misses) == 2 and "same-scheme eager model 12 dB < 25 dB" in misses[0]
    nan = {**healthy, "same_scheme": {"sqnr_db": float("nan"), "top1_agreement": float("nan")}}
    assert len(llm_verdict(nan, thresholds)) == 2
    assert "no same-scheme eager logits" in llm_verdict({**healthy, "same_scheme": None}, thresholds)[0]
    # NaN reference logits never pass as agreement, even where the program's logits are finite
    rng = np.random.default_rng(0)
    logits = rng.standard_normal((7, 32)).astype(np.float32)
    run = {"steps": torch.from_numpy(logits[3:7].copy())}
    assert compare_same_scheme(logits, [0, 0, 0, 0], 4, run)["sqnr_db"] == float("inf")
    logits[5, 3] = np.nan
    result = compare_same_scheme(logits, [0, 0, 0, 0], 4, run)
    assert result["sqnr_db"] != result["sqnr_db"]  # NaN
    assert llm_verdict({**healthy, "same_scheme": result}, thresholds)
