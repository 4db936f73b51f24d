"""Decoders whose KV cache has one head (multi-query attention) or wide heads (head_dim 128).

With one KV head, the [B,S,H,D] cache buffer that etforge swaps in for ``llama::update_cache``
had an H stride of S*D (``.contiguous()`` is a no-op on a size-1 dim): ExecuTorch read it as a
permuted dim order and the runtime refused the cache at the first decode step, after a clean
lowering (issue 34). Default run: one Llama-3.2-shaped cell on XNNPACK fp32 (4 query heads, one
KV head, head_dim 128 as Llama 3.2 3B, llama3 rope), validated per decode step through the real
pipeline. The Llama 3.2 1B and Granite 3.x shapes, GQA 4:1 and 8:1, on fp32 and 8da4w, are in
examples/llm_families (slow).
"""

from __future__ import annotations

import json

import pytest
from conftest import make_project

LLAMA_MQA = (
    "{model_type: llama, vocab_size: 512, hidden_size: 256, intermediate_size: 512, num_hidden_layers: 2, "
    "num_attention_heads: 4, num_key_value_heads: 1, head_dim: 128, max_position_embeddings: 131072, "
    "rms_norm_eps: 1.0e-5, tie_word_embeddings: false, bos_token_id: 1, eos_token_id: 2, "
    "rope_parameters: {rope_type: llama3, rope_theta: 500000.0, factor: 32.0, low_freq_factor: 1.0, "
    "high_freq_factor: 4.0, original_max_position_embeddings: 8192}}"
)
PIPELINE = f"""\
name: t
version: 0.0.1
models:
  llama_mqa:
    transformers:
      task: text-generation
      config: {LLAMA_MQA}
      llm: {{max_context_len: 32, prompt_len: 8, decode_steps: 8}}
backends:
  xnnpack: {{}}
quantization: [fp32]
targets: false  # aarch64 verdicts: tests/test_aarch64_targets.py
"""


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    project = make_project(tmp_path_factory.mktemp("kv_heads") / "proj", PIPELINE)
    run = project.doit("validate")
    assert run.returncode == 0, run.stdout + run.stderr
    return project


def test_one_kv_head_with_head_dim_128_validates_per_decode_step(built):
    report = json.loads((built.out / "llama_mqa" / "llama_mqa_xnnpack_fp32.numerics.json").read_text())
    llm = report["llm"]
    assert report["passed"], report["misses"]
    assert len(llm["step_sqnr_db"]) == 8 and min(llm["step_sqnr_db"]) > 60
    assert llm["program_tokens"] == llm["eager_tokens"]


def test_one_kv_head_cache_is_row_major():
    """The cache buffers of a one-KV-head model have row-major strides, which ExecuTorch reads as
    the contiguous dim order llama::update_cache requires (the regression, in process)."""
    import torch

    from etforge.builders.llm.export import _dense

    view = torch.zeros(1, 1, 32, 16).transpose(1, 2)  # [B,S,H=1,D]: a view with H stride 512
    assert view.contiguous().stride() == (512, 16, 512, 1)  # why .contiguous() was not enough
    assert _dense(view).stride() == (512, 16, 16, 1)


RUNTIME_LOG = """\
E 00:00:01.052314 executorch:op_update_cache.cpp:77] Check failed (is_contiguous_dim_order( \
quantized_cache.dim_order().data(), quantized_cache.dim())): quantized cache must be in contiguous dim order
E 00:00:01.052320 executorch:op_update_cache.cpp:218] Check failed (validate_cache_params(value, cache, \
start_pos, seq_len)):
E 00:00:01.052331 executorch:method.cpp:1483] KernelCall failed at instruction 0:42 in operator \
llama::update_cache.out: 0x12
"""


def test_a_failed_kernel_is_named_in_one_line():
    """The runtime's log (issue 34's, verbatim) becomes one line naming the operator and its check."""
    from etforge.builders.runtime.kernel_log import failure_line

    line = failure_line("method->execute() failed with error 0x12", RUNTIME_LOG)
    assert "\n" not in line
    assert "operator llama::update_cache.out (instruction 0:42)" in line
    assert "quantized cache must be in contiguous dim order" in line and "0x12" in line
    assert "named no operator" in failure_line("boom", "unrelated\n")


def test_the_runtime_log_is_kept_while_a_program_fails(tmp_path):
    """A method that fails in the real runtime raises the one line; its log still reaches stderr."""
    import torch
    from executorch.exir import to_edge

    from etforge.builders.runtime.kernel_log import kernel_failures
    from etforge.builders.runtime.program_io import load_method
    from etforge.core.errors import BuildError

    class Index(torch.nn.Module):
        def forward(self, x, i):
            return x[i]

    program = to_edge(torch.export.export(Index(), (torch.ones(4), torch.tensor([1])))).to_executorch()
    _, method = load_method(program.buffer)
    with pytest.raises(BuildError, match=r"^the ExecuTorch runtime failed in operator \S+index"):
        with kernel_failures():
            method.execute([torch.ones(4), torch.tensor([9])])  # out of range: the kernel refuses it
