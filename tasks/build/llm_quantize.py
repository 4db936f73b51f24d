"""Quantize a decoder-only LLM: torchao configs on the eager model, then the static-KV-cache export.

The graph an LLM cell lowers must come from tasks/build/llm_export.py's wrapper (a plain
``torch.export`` of the HF model has no cache), so the quantize stage of an LLM rebuilds
the eager model, applies the scheme's torchao configs (linear layers, and embeddings for
``8da4w_emb``) with the generic flow's ``torchao_quantize`` (handed in by tasks/build/quantize.py), and
exports through :func:`tasks.build.llm_export.export_llm`.

Embedding configs follow ExecuTorch's LLM flow (``extension/llm/export/quantize.py``):
``IntxWeightOnlyConfig`` per row (group 0) or per group, applied to ``nn.Embedding`` only;
lowering then fuses dequantize + embedding into ``quantized_decomposed::embedding_{4,8}bit``
(``do_quant_fusion_and_const_prop``, tasks/build/llm_export.py lowering_options).
"""

from __future__ import annotations

import time
from pathlib import Path

from tasks.store.results import BuildResult

PROGRAM = "model.pt2"


def torchao_8da4w_embedding(options: dict) -> list:
    """[(config, filter_fn)] of the 8da4w_emb scheme: embeddings first, then linear layers."""
    import torch
    from torchao.quantization.granularity import PerAxis, PerGroup
    from torchao.quantization.quant_api import IntxWeightOnlyConfig

    from tasks.build.quantizers import torchao_8da4w

    group = int(options.get("embedding_group_size", 0))
    embedding = IntxWeightOnlyConfig(weight_dtype={4: torch.int4, 8: torch.int8}[int(options.get("embedding_bits", 8))],
                                     granularity=PerGroup(group) if group else PerAxis(0))
    return [(embedding, lambda module, fqn: isinstance(module, torch.nn.Embedding)),
            (torchao_8da4w(options), _linear_dividing(int(options.get("group_size", 32))))]


def _linear_dividing(group_size: int):
    """Linear layers whose in_features the group size divides (the others stay fp32)."""
    import torch

    return lambda module, fqn: isinstance(module, torch.nn.Linear) and module.in_features % group_size == 0


def as_config_list(made) -> list:
    """A factory's result as [(config, filter_fn or None)]: one config (8da4w) or a list."""
    return list(made) if isinstance(made, (list, tuple)) else [(made, None)]


def build_llm_quantized(cell, root: Path, workdir: Path, torchao_quantize) -> BuildResult:
    """``torchao_quantize``: the generic flow's (tasks/build/quantize.py hands it in: no import circle)."""
    from tasks.build.llm_export import export_llm
    from tasks.build.model_loading import build_model
    from tasks.core.dotted_path import load_callable
    import torch

    transform = cell.transform
    if transform.method != "torchao":
        raise ValueError(f"LLM cells are quantized with torchao configs, not {transform.method!r}")
    start = time.monotonic()
    model = build_model(cell.model, root)
    for config, filter_fn in as_config_list(load_callable(transform.ref)(dict(transform.options))):
        torchao_quantize(model, config, filter_fn)
    program = export_llm(model, cell.model.source["transformers"]["llm"])
    torch.export.save(program, workdir / PROGRAM)
    info = {"method": transform.method, "quantizer": transform.ref, "quantize_s": round(time.monotonic() - start, 3)}
    return BuildResult(files={PROGRAM: workdir / PROGRAM}, info=info)
