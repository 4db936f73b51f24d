"""A decoder-only LLM through capture -> (quantize) -> export -> validate, on a tiny untied
Llama (2 layers, hidden 64, vocab 512; tied random configs emit one constant token, so greedy
agreement would prove nothing). One project is built once for the module: a random-weight
model on XNNPACK (fp32 and 8da4w + 4-bit embeddings) and portable (fp32). The same architecture
from a local checkpoint directory (portable fp32) has its own project, for the pinning test
(``slow``: a checkpoint's digest and its plan-time check are tests/test_hf_sources_are_checked.py's).
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import pytest
from conftest import TINY_LLAMA_CONFIG, check, make_project, state

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

CONFIG = TINY_LLAMA_CONFIG
PIPELINE = f"""\
name: t
version: 0.0.1
models:
  tiny_llm:
    transformers:
      task: text-generation
      config: {CONFIG}
      llm: {{max_context_len: 32, prompt_len: 8, decode_steps: 8}}
    # 4-bit linears and embeddings on a tiny random model: ~13.5 dB worst-step logits SQNR
    thresholds: {{8da4w: {{sqnr_db: 10}}}}
backends:
  xnnpack: {{}}
  portable: {{}}
quantization: [fp32, 8da4w]
targets: false
quantization_options:
  8da4w: {{group_size: 32, embedding: 4, embedding_group_size: 32}}
"""
CKPT_PIPELINE = """\
name: t
version: 0.0.1
models:
  ckpt_llm:
    transformers:
      task: text-generation
      checkpoint: {path: ckpt, sha256: "CKPT_SHA"}
      llm: {max_context_len: 32, prompt_len: 6, decode_steps: 4}
backends:
  portable: {}
quantization: [fp32]
"""
RUNNER_METHODS = {
    "get_max_seq_len",
    "get_max_context_len",
    "get_vocab_size",
    "get_bos_id",
    "get_eos_ids",
    "use_kv_cache",
    "use_sdpa_with_kv_cache",
    "enable_dynamic_shape",
}


def _checkpoint_sha(directory: Path) -> str:
    from etforge.config.hf_source import checkpoint_digest

    return checkpoint_digest(
        {
            p.relative_to(directory).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(directory.rglob("*"))
            if p.is_file()
        }
    )


def _save_checkpoint(directory: Path) -> None:
    """A tiny Llama checkpoint (safetensors + config.json), seeded: what a user would have on disk."""
    import torch

    from etforge.builders.loading.hf_models import import_transformers

    tf = import_transformers()
    torch.manual_seed(7)
    config = tf.LlamaConfig(
        vocab_size=512,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
        tie_word_embeddings=False,
    )
    tf.AutoModelForCausalLM.from_config(config).save_pretrained(directory)


def _write(project, sha: str) -> None:
    project.write_pipeline(CKPT_PIPELINE.replace("CKPT_SHA", sha))


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    project = make_project(tmp_path_factory.mktemp("llm") / "proj", PIPELINE)
    run = project.doit()
    assert run.returncode == 0, run.stdout + run.stderr
    return project


@pytest.fixture(scope="module")
def ckpt_built(tmp_path_factory):
    project = make_project(tmp_path_factory.mktemp("ckpt") / "proj", "name: t\n")
    _save_checkpoint(project.root / "ckpt")
    _write(project, _checkpoint_sha(project.root / "ckpt"))
    run = project.doit()
    assert run.returncode == 0, run.stdout + run.stderr
    return project


def _numerics(project, cell: str) -> dict:
    return json.loads((project.out / cell.split("/")[0] / (cell.replace("/", "_") + ".numerics.json")).read_text())


@pytest.mark.parametrize("backend", ["xnnpack", "portable"])
def test_llm_program_matches_eager_on_prefill_decode_and_greedy(built, backend):
    report = _numerics(built, f"tiny_llm/{backend}/fp32")
    llm = report["llm"]
    assert report["passed"], report["misses"]
    assert llm["decode_steps"] == 8 and len(llm["step_sqnr_db"]) == 8
    assert llm["prefill_sqnr_db"] > 100 and min(llm["step_sqnr_db"]) > 100
    assert llm["top1_agreement"] == 1.0 and llm["greedy_agreement"] == 1.0
    assert llm["program_tokens"] == llm["eager_tokens"]
    assert len(set(llm["eager_tokens"])) > 2  # an untied config: the continuation varies
    assert any("random" in note for note in report["notes"])


def test_llm_program_has_kv_cache_custom_ops_and_runner_metadata(built):
    import executorch.extension.llm.custom_ops.custom_ops  # noqa: F401  (to load forward)
    import torch
    from executorch.runtime import Runtime

    pte = built.out / "tiny_llm" / "tiny_llm_xnnpack_fp32.pte"
    program = Runtime.get().load_program(pte.read_bytes())
    assert RUNNER_METHODS <= set(program.method_names)
    values = {name: program.load_method(name).execute([]) for name in RUNNER_METHODS}
    values = {k: [x.item() if isinstance(x, torch.Tensor) else x for x in v] for k, v in values.items()}
    assert values["get_max_context_len"] == [32] and values["get_vocab_size"] == [512]
    assert values["get_eos_ids"] == [2] and values["get_bos_id"] == [1] and values["use_kv_cache"] == [True]
    assert values["use_sdpa_with_kv_cache"] == [True] and values["enable_dynamic_shape"] == [True]
    export = json.loads((built.out / "tiny_llm" / "tiny_llm_xnnpack_fp32.export.json").read_text())
    assert export["llm_metadata"]["get_max_seq_len"] == 32
    assert "llama.custom_sdpa" in check(export, "delegation")["not_delegated"]  # ExecuTorch's SDPA op
    # The KV cache lives in the program: a decode step after the prefill continues from it.
    method = program.load_method("forward")
    prompt = torch.tensor([[5, 9, 77, 300]])
    full = method.execute([prompt, torch.arange(4)])[0][0, -1].clone()
    method.execute([prompt[:, :3].contiguous(), torch.arange(3)])
    step = method.execute([prompt[:, 3:].contiguous(), torch.tensor([3])])[0][0, -1]
    assert torch.allclose(full, step, atol=1e-4)


def test_8da4w_with_quantized_embeddings_builds_smaller_and_passes_its_gates(built):
    cell = "tiny_llm/xnnpack/8da4w"
    report = _numerics(built, cell)
    assert report["passed"], report["misses"]
    assert report["thresholds"]["top1_agreement"] == 0.625 and report["thresholds"]["sqnr_db"] == 10
    assert report["llm"]["top1_agreement"] >= 0.625 and report["llm"]["sqnr_db"] >= 10
    assert report["llm"]["sqnr_db"] < 60  # really quantized: far from the fp32 program's ~130 dB
    assert state(built, "sizegate:" + cell)["status"] == "ok"
    pte = (built.out / "tiny_llm" / "tiny_llm_xnnpack_8da4w.pte").read_bytes()
    fp32 = (built.out / "tiny_llm" / "tiny_llm_xnnpack_fp32.pte").stat().st_size
    assert len(pte) < 0.3 * fp32
    assert b"embedding_4bit" in pte  # the embedding runs as ExecuTorch's quantized kernel


def test_second_run_executes_nothing(built):
    run = built.doit()
    assert run.returncode == 0 and run.started == set(), run.stdout


def test_threshold_gates_the_llm_cell_and_only_revalidates(built, tmp_path):
    from conftest import copy_project

    project = copy_project(built, tmp_path / "copy")
    text = project.pipeline.read_text().replace(
        "backends:", "thresholds:\n  fp32: {sqnr_db: 1000}\n  8da4w: {top1_agreement: 1.0}\nbackends:"
    )
    project.write_pipeline(text)
    cells = ("tiny_llm/portable/fp32", "tiny_llm/xnnpack/8da4w")
    run = project.doit(*(f"validate:{c}" for c in cells))
    assert run.returncode != 0
    assert run.started == {f"validate:{c}" for c in cells}, run.stdout
    assert "worst SQNR" in run.stdout and "< 1000 dB" in run.stdout
    assert "top-1 agreement" in run.stdout and "< 1.0" in run.stdout


@pytest.mark.slow
def test_changed_checkpoint_weight_rebuilds_only_that_model(ckpt_built, tmp_path):
    from conftest import copy_project
    from safetensors.torch import load_file, save_file

    project = copy_project(ckpt_built, tmp_path / "copy2")
    weights = project.root / "ckpt" / "model.safetensors"
    tensors = load_file(weights)
    name = sorted(tensors)[0]
    tensors[name] = tensors[name] * 1.01
    save_file(tensors, weights, metadata={"format": "pt"})
    stale = project.doit("list")
    assert stale.returncode != 0 and "checkpoint directory sha256 is" in stale.stdout + stale.stderr
    _write(project, _checkpoint_sha(project.root / "ckpt"))
    run = project.doit()
    assert run.returncode == 0, run.stdout + run.stderr
    rebuilt = {t for t in run.started if t.split(":")[0] in ("capture", "export", "validate", "benchmark")}
    assert rebuilt == {
        "capture:ckpt_llm",
        "export:ckpt_llm/portable/fp32",
        "validate:ckpt_llm/portable/fp32",
        "benchmark:ckpt_llm/portable/fp32",
    }
    assert state(project, "validate:ckpt_llm/portable/fp32")["status"] == "ok"


def test_llm_verdict_fails_on_nan():
    from etforge.builders.llm.numerics import llm_verdict

    nan = float("nan")
    metrics = {
        "sqnr_db": nan,
        "top1_agreement": nan,
        "greedy_agreement": 1.0,
        "nonfinite": {"values": 4, "nan": 0, "inf": 0},
    }
    misses = llm_verdict(metrics, {"sqnr_db": 60, "top1_agreement": 1.0, "greedy_agreement": 1.0})
    assert len(misses) == 2 and "worst SQNR nan" in misses[0]
    metrics["nonfinite"] = {"values": 4, "nan": 1, "inf": 0}
    assert "non-finite" in llm_verdict(metrics, {})[0]
