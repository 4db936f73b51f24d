"""Encoder-decoder Hugging Face tasks: automatic-speech-recognition (Whisper) and text2text-generation
(T5), each from a tiny config with random weights, exported as ONE program with two methods
(encoder, text_decoder with a static KV cache), lowered to XNNPACK fp32 and validated like an LLM:
the encoder once, then the decoder step by step against eager PyTorch in the ExecuTorch runtime.

One project is built once for the module (2 cells and one benchmark, in one process; most of the
time is XNNPACK lowering). The plan-time tests resolve in-process (no torch).
Portable and 8da4w cells are ``slow``.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest
from conftest import TINY_WHISPER_CONFIG, check, make_project

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from etforge.config.resolve import resolve  # noqa: E402
from etforge.core.errors import PipelineError  # noqa: E402

# T5 5.x always ties its output embeddings (no tie_word_embeddings key): its greedy tokens repeat,
# the per-step logits still differ (relative position bias, the cache).
T5 = "{model_type: t5, vocab_size: 256, d_model: 32, d_kv: 16, d_ff: 64, num_layers: 1, num_heads: 2}"
PIPELINE = f"""\
name: t
version: 0.0.1
models:
  whisper:
    transformers:
      task: automatic-speech-recognition
      config: {TINY_WHISPER_CONFIG}
      seq2seq: {{max_cache_len: 16, decode_steps: 6}}
  t5:
    transformers:
      task: text2text-generation
      config: {T5}
      seq2seq: {{max_cache_len: 16, decode_steps: 6, encoder_len: 12}}
backends:
  xnnpack: {{}}
quantization: [fp32]
targets: false  # aarch64 verdicts: tests/test_aarch64_targets.py
"""
METHODS = {"encoder", "text_decoder"}


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    project = make_project(tmp_path_factory.mktemp("seq2seq") / "proj", PIPELINE)
    # one process (a worker process would import torch and transformers again: the suite is CPU-bound);
    # one benchmark (a few seconds) for the generation figures
    run = project.doit("validate", "benchmark:whisper/xnnpack/fp32")
    assert run.returncode == 0, run.stdout + run.stderr
    return project


def _numerics(project, cell: str) -> dict:
    model = cell.split("/")[0]
    return json.loads((project.out / model / (cell.replace("/", "_") + ".numerics.json")).read_text())


@pytest.mark.parametrize(
    "model, encoder_input",
    [("whisper", ("input_features", [1, 16, 32])), ("t5", ("input_ids", [1, 12]))],
)
def test_one_program_two_methods_validated_step_by_step(built, model, encoder_input):
    from executorch.runtime import Runtime

    cell = f"{model}/xnnpack/fp32"
    report = _numerics(built, cell)
    steps = report["seq2seq"]
    assert report["passed"], report["misses"]
    assert report["methods"] == ["encoder", "text_decoder"]
    assert steps["decode_steps"] == 6 and len(steps["step_sqnr_db"]) == 6
    assert all(math.isfinite(v) and v > 100 for v in steps["step_sqnr_db"]), steps["step_sqnr_db"]
    assert steps["encoder_sqnr_db"] > 100
    assert steps["sqnr_db"] == min(steps["step_sqnr_db"] + [steps["encoder_sqnr_db"]])  # the worst decides
    assert steps["top1_agreement"] == 1.0 and steps["program_tokens"] == steps["eager_tokens"]
    pte = built.out / model / f"{model}_xnnpack_fp32.pte"
    program = Runtime.get().load_program(pte.read_bytes())
    assert set(program.method_names) >= METHODS
    for name in METHODS:
        program.load_method(name)
    export = json.loads((built.out / model / f"{model}_xnnpack_fp32.export.json").read_text())
    assert export["cell"]["inputs"][0]["name"] == encoder_input[0]
    assert export["cell"]["inputs"][0]["shape"] == encoder_input[1]
    assert check(export, "delegation")["delegated_ops"] > 0
    # what ExecuTorch's runners read from the program (constant methods), like an LLM's
    assert export["llm_metadata"]["get_max_seq_len"] == 16 and export["llm_metadata"]["get_vocab_size"] == 256
    assert {"get_max_seq_len", "get_eos_ids"} <= set(program.method_names)


def test_whisper_tokens_vary_so_greedy_agreement_means_something(built):
    steps = _numerics(built, "whisper/xnnpack/fp32")["seq2seq"]
    assert len(set(steps["eager_tokens"])) > 2 and steps["greedy_agreement"] == 1.0


def test_benchmark_reports_a_generation_like_an_llm(built):
    """The encoder is the prefill (its output length the prompt, as ExecuTorch's ASR runner counts),
    then greedy decoder steps up to the cache length; the report's LLM table reads the same figures."""
    bench = json.loads((built.out / "whisper" / "whisper_xnnpack_fp32.bench.json").read_text())
    llm = bench["llm"]
    assert llm["prompt_len"] == 16 and llm["decode_steps"] == 15  # max_source_positions; max_cache_len - 1
    assert llm["decode_tok_s"] > 0 and llm["ttft_ms"] > llm["prefill_ms"] > 0
    assert "text_decoder" in bench["per_method"]  # the other method timed too (the encoder: the headline)


def _error(tmp_path: Path, text: str) -> str:
    (tmp_path / "pipeline.yaml").write_text(text)
    with pytest.raises(PipelineError) as info:
        resolve(tmp_path / "pipeline.yaml")
    message = str(info.value).strip()
    assert "\n" not in message
    return message


@pytest.mark.parametrize(
    "before, after, line, expected",
    [
        ("d_model: 32, encoder_layers", "d_modle: 32, encoder_layers", 7, "unknown whisper config key 'd_modle'"),
        ("d_kv: 16", "d_kvv: 16", 12, "unknown t5 config key 'd_kvv'; did you mean 'd_kv'?"),
    ],
)
def test_a_config_key_the_class_does_not_take_is_one_line(tmp_path, before, after, line, expected):
    message = _error(tmp_path, PIPELINE.replace(before, after))
    assert f":{line}: models." in message and expected in message


def test_seq2seq_options_and_inputs_are_checked(tmp_path):
    line = _error(tmp_path, PIPELINE.replace("decode_steps: 6, encoder_len", "decode_steps: 60, encoder_len"))
    assert ":13: models.t5.transformers.seq2seq: decode_steps 60 exceeds max_cache_len 16" in line
    line = _error(tmp_path, PIPELINE.replace("max_cache_len: 16, decode_steps: 6}", "max_cache_len: 64}"))
    assert "max_cache_len 64 exceeds the config's max_target_positions 32" in line
    text = PIPELINE.replace("  t5:\n", "  t5:\n    inputs: [{name: x, shape: [1]}]\n")
    assert "a text2text-generation model's methods are implied" in _error(tmp_path, text)
    line = _error(tmp_path, PIPELINE.replace("task: text2text-generation", "task: feature-extraction"))
    assert "'seq2seq' options apply to tasks automatic-speech-recognition, text2text-generation" in line


def test_a_config_of_the_other_task_is_one_line(tmp_path):
    line = _error(tmp_path, PIPELINE.replace("task: automatic-speech-recognition", "task: text2text-generation"))
    assert ":6: models.whisper.transformers.task: AutoModelForSeq2SeqLM (task 'text2text-generation') " in line
    assert "has no class for model_type 'whisper'" in line and "t5" in line
    line = _error(tmp_path, PIPELINE.replace("task: text2text-generation", "task: automatic-speech-recognition"))
    assert "AutoModelForSpeechSeq2Seq (task 'automatic-speech-recognition') has no class for model_type 't5'" in line
    assert "moonshine" in line  # the model types it takes, the first 12 by name


def test_methods_are_implied_from_the_config(tmp_path):
    (tmp_path / "pipeline.yaml").write_text(PIPELINE)
    plan = resolve(tmp_path / "pipeline.yaml")
    whisper = plan.models["whisper"]
    assert whisper.kind == "seq2seq"
    (encoder, (features,)), (decoder, inputs) = whisper.methods
    assert (encoder, features.name, features.shape) == ("encoder", "input_features", (1, 16, 32))
    assert decoder == "text_decoder"
    assert [(i.name, i.shape) for i in inputs] == [
        ("decoder_input_ids", (1, 1)),
        ("encoder_hidden_states", (1, 16, 32)),  # max_source_positions x d_model
        ("cache_position", (1,)),
    ]


def test_unsupported_backend_and_scheme_are_rejected_at_plan_time(tmp_path):
    text = PIPELINE.replace("  xnnpack: {}\n", "  xnnpack: {}\n  coreml: {}\n").replace(
        "quantization: [fp32]", "quantization: [fp32, int8]"
    )
    (tmp_path / "pipeline.yaml").write_text(text)
    plan = resolve(tmp_path / "pipeline.yaml")
    reasons = {r.name: r.reason for r in plan.rejected}
    assert "encoder-decoder export (Whisper, T5; static KV cache) is measured on" in reasons["whisper/coreml/fp32"]
    assert "not coreml" in reasons["t5/coreml/fp32"]
    assert "static int8 (PT2E) calibrates one exported graph" in reasons["whisper/xnnpack/int8"]  # the recipe's
    assert "fp16 encoder-decoder programs are refused on XNNPACK" in _fp16_reason(tmp_path)
    assert {c.name for c in plan.cells} == {"whisper/xnnpack/fp32", "t5/xnnpack/fp32"}


def _fp16_reason(tmp_path: Path) -> str:
    (tmp_path / "pipeline.yaml").write_text(PIPELINE.replace("quantization: [fp32]", "quantization: [fp32, fp16]"))
    return {r.name: r.reason for r in resolve(tmp_path / "pipeline.yaml").rejected}["t5/xnnpack/fp16"]


@pytest.mark.slow
def test_portable_and_8da4w_validate_step_by_step(tmp_path):
    text = PIPELINE.replace("  xnnpack: {}\n", "  xnnpack: {}\n  portable: {}\n").replace(
        "quantization: [fp32]", "quantization: [fp32, 8da4w]"
    )
    project = make_project(tmp_path / "proj", text)
    run = project.doit("validate")
    assert run.returncode == 0, run.stdout + run.stderr
    for model in ("whisper", "t5"):
        assert min(_numerics(project, f"{model}/portable/fp32")["seq2seq"]["step_sqnr_db"]) > 100
        quantized = _numerics(project, f"{model}/xnnpack/8da4w")
        assert quantized["passed"], quantized["misses"]
        assert quantized["seq2seq"]["same_scheme"]["sqnr_db"] > 30  # the lowering, apart from the quantization


def test_seq2seq_tasks_run_their_own_builders_and_their_keys_cover_them():
    from etforge.config.model import ModelKind
    from etforge.pipeline.stages import DEFAULT_TABLE, STAGES, code_of

    chosen = {s.name: DEFAULT_TABLE.builder_for(s, ModelKind.SEQ2SEQ) for s in STAGES if s.subject != "pipeline"}
    for stage in ("capture", "quantize", "export", "validate", "benchmark"):
        assert chosen[stage] == f"etforge.builders.seq2seq.stages:{stage}_stage"
        code = code_of(next(s for s in STAGES if s.name == stage), ModelKind.SEQ2SEQ)
        assert "etforge.builders.seq2seq.stages" in code  # its import closure joins the task's key
    assert chosen["sizegate"] == "etforge.builders.gates.gates:size_gate_stage"


def test_an_infinite_program_value_is_minus_infinity_db_not_a_crash():
    """An fp16 decoder returned inf logits (Whisper on XNNPACK): the SQNR is -inf, which every gate fails."""
    from etforge.builders.numerics.compare import sqnr_db

    assert sqnr_db([1.0, 2.0], [float("inf"), 2.0]) == float("-inf")
