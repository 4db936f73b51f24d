"""Plan-time refusals of Hugging Face cells, resolved in-process (no torch):

- a backend recipe's ``hf_tasks`` block (what was measured not to build: task, optionally model types
  and schemes, the reason, when and with what) rejects those cells with its reason and date, in the plan
  and the summary, like a scheme recipe's refusals; the real recipes' entries name real tasks and schemes;
- ``keep_float: auto`` on a text-generation or encoder-decoder model is refused at plan time (one ``file:line: key`` line
  when it applies to LLM cells only; else those cells are rejected naming that line), explicit regexes stay.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from etforge.config import recipes
from etforge.config.hf_config_keys import known_model_types
from etforge.config.hf_source import TASKS
from etforge.core.errors import PipelineError
from etforge.publish import summary
from unit.support import make_unit_project

BERT = (
    "{model_type: bert, vocab_size: 512, hidden_size: 32, num_hidden_layers: 1, num_attention_heads: 2, "
    "intermediate_size: 64, max_position_embeddings: 64}"
)
VIT = (
    "{model_type: vit, hidden_size: 32, num_hidden_layers: 1, num_attention_heads: 2, intermediate_size: 64, "
    "image_size: 32, patch_size: 8, num_labels: 3}"
)
LLAMA = (
    "{model_type: llama, vocab_size: 512, hidden_size: 64, intermediate_size: 128, num_hidden_layers: 2, "
    "num_attention_heads: 4, num_key_value_heads: 2, max_position_embeddings: 64}"
)
TOKENS = (
    "    inputs:\n"
    "      - {name: input_ids, shape: [1, 12], dtype: int64, range: [3, 512]}\n"
    "      - {name: attention_mask, shape: [1, 12], dtype: int64, sample: attention_mask}\n"
)
PIPELINE = f"""\
name: t
version: 0.0.1
models:
  bert_mlm:
    transformers: {{task: fill-mask, config: {BERT}}}
{TOKENS}  vit:
    transformers: {{task: image-classification, config: {VIT}}}
    inputs: [{{name: pixel_values, shape: [1, 3, 32, 32]}}]
backends:
  portable: {{}}
quantization: [fp32, int8]
"""
MEASURED = "2026-11-25: transformers 5.23.0, executorch 1.5.1 (tiny configs, random weights)"
# Appended to a copy of the real portable recipe, as the project's own recipes/backends/portable.yaml.
HF_TASKS = f"""
hf_tasks:
  measured: "{MEASURED}"
  rejected:
    - {{task: fill-mask, schemes: [int8], reason: "int8 fill-mask fails lowering here (FakeError)"}}
    - {{task: image-classification, model_types: [mobilevit], reason: "MobileViT fails everywhere"}}
"""


def _project(tmp_path: Path, pipeline: str = PIPELINE, block: str = HF_TASKS, recipe: str = "portable"):
    project = make_unit_project(tmp_path / "proj", pipeline, models=())
    text = _without_block((recipes.RECIPE_DIR / "backends" / f"{recipe}.yaml").read_text(), "hf_tasks")
    project.write(f"recipes/backends/{recipe}.yaml", text + block)
    return project


def _without_block(text: str, key: str) -> str:
    """A recipe's text without its top-level ``key`` block (the test adds its own)."""
    out, inside = [], False
    for line in text.splitlines(keepends=True):
        if line.startswith(f"{key}:"):
            inside = True
        elif inside and line.strip() and not line[0].isspace() and not line.startswith("#"):
            inside = False
        if not inside:
            out.append(line)
    return "".join(out)


def _error(project) -> str:
    with pytest.raises(PipelineError) as info:
        project.plan()
    message = str(info.value).strip()
    assert "\n" not in message
    return message


def test_a_measured_task_failure_is_rejected_at_plan_time_with_its_reason_and_date(tmp_path):
    plan = _project(tmp_path).plan()
    refused = {r.name: r.reason for r in plan.rejected}
    assert refused == {
        "bert_mlm/portable/int8": f"int8 fill-mask fails lowering here (FakeError) (measured {MEASURED})"
    }
    # only the scheme named (fp32 stays), only the model types named (a ViT is no MobileViT)
    assert {c.name for c in plan.cells} == {"bert_mlm/portable/fp32", "vit/portable/fp32", "vit/portable/int8"}
    # the summary and the report show it as a scheme recipe's refusal is shown
    row = summary.rejected_row(plan.rejected[0])
    assert row["status"] == "rejected" and row["note"] == refused["bert_mlm/portable/int8"], row


def test_an_entry_without_schemes_rejects_every_scheme_of_its_model_types(tmp_path):
    pipeline = PIPELINE.replace("model_type: vit, ", "model_type: mobilevit, ").replace(
        "hidden_size: 32, num_hidden_layers: 1, num_attention_heads: 2, intermediate_size: 64, image_size: 32, "
        "patch_size: 8, num_labels: 3",
        "image_size: 32, num_labels: 3",
    )
    plan = _project(tmp_path, pipeline).plan()
    assert {r.name for r in plan.rejected} == {"bert_mlm/portable/int8", "vit/portable/fp32", "vit/portable/int8"}
    assert all("MobileViT fails everywhere" in r.reason for r in plan.rejected if r.model == "vit")


def test_a_chain_is_refused_when_one_of_its_members_is(tmp_path):
    pipeline = PIPELINE.replace("  portable: {}\n", "  android: {chain: [vulkan, xnnpack]}\n").replace(
        "[fp32, int8]", "[int8]"
    )
    plan = _project(tmp_path, pipeline, recipe="xnnpack").plan()
    assert [r.name for r in plan.rejected] == ["bert_mlm/android/int8"]
    assert [c.name for c in plan.cells] == ["vit/android/int8"]


def test_a_matrix_every_cell_of_which_is_refused_is_one_line(tmp_path):
    only_mlm = PIPELINE[: PIPELINE.index("  vit:")] + PIPELINE[PIPELINE.index("backends:") :]
    line = _error(_project(tmp_path, only_mlm.replace("[fp32, int8]", "[int8]")))
    assert "every cell of the matrix is refused: bert_mlm/portable/int8: int8 fill-mask fails" in line, line


LLM_PIPELINE = f"""\
name: t
version: 0.0.1
models:
  tiny_llm:
    transformers: {{task: text-generation, config: {LLAMA}, llm: {{max_context_len: 32}}}}
backends:
  xnnpack: {{}}
quantization: [fp32, 8da4w]
quantization_options:
  8da4w: {{keep_float: auto}}
"""


def test_keep_float_auto_on_an_llm_only_is_one_line_naming_the_option(tmp_path):
    project = make_unit_project(tmp_path / "proj", LLM_PIPELINE, models=())
    line = _error(project)
    assert "pipeline.yaml:10: quantization_options.8da4w.keep_float: auto is not implemented" in line, line
    assert "generative models (tiny_llm)" in line and "keep_float: [regex, ...]" in line


def test_keep_float_auto_on_an_encoder_decoder_is_refused_too(tmp_path):
    t5 = "{model_type: t5, vocab_size: 64, d_model: 32, d_kv: 8, d_ff: 64, num_layers: 1, num_heads: 4}"
    pipeline = LLM_PIPELINE.replace(
        f"transformers: {{task: text-generation, config: {LLAMA}, llm: {{max_context_len: 32}}}}",
        f"transformers: {{task: text2text-generation, config: {t5}, seq2seq: {{max_cache_len: 16}}}}",
    )
    line = _error(make_unit_project(tmp_path / "proj", pipeline, models=()))
    assert "quantization_options.8da4w.keep_float: auto is not implemented for generative models (tiny_llm)" in line


def test_keep_float_auto_shared_with_a_module_rejects_only_the_llm_cells(tmp_path):
    pipeline = LLM_PIPELINE.replace(
        "backends:",
        "  mlp:\n    python: models.a:build\n    inputs: [{name: x, shape: [1, 64]}]\nbackends:",
    )
    project = make_unit_project(tmp_path / "proj", pipeline, models=("a",))
    plan = project.plan()
    assert [r.name for r in plan.rejected] == ["tiny_llm/xnnpack/8da4w"]
    assert "pipeline.yaml:13: quantization_options.8da4w.keep_float: auto is not" in plan.rejected[0].reason
    assert {c.name for c in plan.cells} == {"tiny_llm/xnnpack/fp32", "mlp/xnnpack/fp32", "mlp/xnnpack/8da4w"}


def test_explicit_keep_float_regexes_on_an_llm_are_kept(tmp_path):
    pipeline = LLM_PIPELINE.replace("{keep_float: auto}", "{keep_float: ['model.layers.0.mlp.*']}")
    plan = make_unit_project(tmp_path / "proj", pipeline, models=()).plan()
    assert not plan.rejected
    cell = next(c for c in plan.cells if c.name == "tiny_llm/xnnpack/8da4w")
    assert cell.transform.options["keep_float"] == ["model.layers.0.mlp.*"]


def test_the_real_recipes_hf_task_rejections_name_real_tasks_schemes_and_model_types():
    path = recipes.RecipePath()
    schemes = set(path.available("quantization"))
    model_types = known_model_types()
    entries = 0
    for name in path.available("backend"):
        block = path.load("backend", name).data.get("hf_tasks")
        if not block:
            continue
        assert block["measured"].strip(), name
        for entry in block["rejected"]:
            entries += 1
            assert entry["task"] in TASKS and entry["task"] != "text-generation", (name, entry)
            assert set(entry.get("schemes", ())) <= schemes, (name, entry)
            assert model_types is None or set(entry.get("model_types", ())) <= set(model_types), (name, entry)
    assert entries, "no backend recipe carries a measured hf_tasks rejection"


def test_the_real_recipes_reject_what_was_measured_to_fail(tmp_path):
    pipeline = PIPELINE.replace("  portable: {}\n", "  coreml: {}\n  openvino: {}\n  xnnpack: {}\n")
    plan = make_unit_project(tmp_path / "proj", pipeline, models=()).plan()
    refused = {r.name: r.reason for r in plan.rejected}
    for cell in ("bert_mlm/coreml/int8", "vit/coreml/int8", "bert_mlm/openvino/int8", "vit/openvino/int8"):
        assert "(measured 2026-11-25 on tiny random-weight configs" in refused[cell], refused
    assert "fake_quantize_tensor_cachemask_kernel_type_handling" in refused["vit/coreml/int8"]
    assert "LayerNorm's 1-D bias" in refused["vit/openvino/int8"]
    # what was measured to build stays in the plan
    assert {"vit/xnnpack/int8", "bert_mlm/coreml/fp32", "vit/openvino/fp32"} <= {c.name for c in plan.cells}
