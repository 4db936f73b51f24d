"""Decoders whose KV cache has one head (multi-query attention) or wide heads (head_dim 128).

With one KV head, the [B,S,H,D] cache buffer that etforge swaps in for ``llama::update_cache``
had an H stride of S*D (``.contiguous()`` is a no-op on a size-1 dim): ExecuTorch read it as a
permuted dim order and the runtime refused the cache at the first decode step, after a clean
lowering (issue 34). Here, in process: the cache buffers are row-major, and a kernel that fails
in the runtime is named in one line. The real pipeline's check, one Llama-3.2-shaped cell on
XNNPACK fp32 (4 query heads, one KV head, head_dim 128 as Llama 3.2 3B, llama3 rope) validated
per decode step, is built beside the Gemma-3-style cell in tests/test_llm_families.py (one build
for both). The Llama 3.2 1B and Granite 3.x shapes, GQA 4:1 and 8:1, on fp32 and 8da4w, are in
examples/llm_families (slow).
"""

from __future__ import annotations

import pytest


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
