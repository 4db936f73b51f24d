"""What a loader needs to know of an LLM variant, for every manifest (index.json, Dart, C++, CMake).

A decoder-only LLM cell's program holds ``forward`` (the static-KV-cache step, whose inputs
and outputs etforge.publish.manifests.interface describes as for any model) and the constant
metadata methods ExecuTorch's LLM runner reads (etforge.builders.llm.export runner_metadata,
recorded by the export as ``llm_metadata``). :func:`llm_spec` gives, from that record:

    methods     every method of the program: forward, then the metadata methods (sorted)
    metadata    name -> value (an int, a bool, or a list of ints for get_eos_ids)
    kv_cache    the cache the program holds: bytes (2 x layers x batch x max_context_len x
                kv_heads x head_dim x dtype size), dtype, layout (BSHD for ExecuTorch's
                llama::update_cache, BHSD for transformers' StaticCache), the shape of one
                K or V tensor, and the whole ``shape`` [2, layers, *tensor_shape]

None for any other cell (and for an LLM whose export record predates ``llm_metadata``).
This module must not import torch or executorch.
"""

from __future__ import annotations

from etforge.config.model import ModelKind

DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}
FORWARD = "forward"


def cache_dtype(cell) -> str:
    """The cache's element type: the model's (a dtype scheme casts it), float32 otherwise."""
    transform = cell.transform
    if transform is not None and transform.method == "dtype" and transform.ref in DTYPE_BYTES:
        return transform.ref
    return "float32"


def kv_cache(metadata: dict, dtype: str) -> dict:
    layers, heads = int(metadata["get_n_layers"]), int(metadata["get_n_kv_heads"])
    head_dim, context = int(metadata["get_head_dim"]), int(metadata["get_max_context_len"])
    batch = int(metadata.get("get_max_batch_size", 1))
    custom = bool(metadata.get("use_sdpa_with_kv_cache"))
    tensor = [batch, context, heads, head_dim] if custom else [batch, heads, context, head_dim]
    return {
        "bytes": 2 * layers * batch * context * heads * head_dim * DTYPE_BYTES[dtype],
        "dtype": dtype,
        "layout": "BSHD" if custom else "BHSD",
        "layers": layers,
        "tensor_shape": tensor,
        "shape": [2, layers, *tensor],
    }


def llm_spec(cell, program) -> dict | None:
    """``{"methods", "metadata", "kv_cache"}`` of an LLM variant (``program``: its export's result),
    else None (see the module docstring)."""
    metadata = program.llm_metadata
    if cell.model.kind != ModelKind.LLM or not isinstance(metadata, dict) or not metadata:
        return None
    names = sorted(metadata)
    return {
        "methods": [FORWARD, *names],
        "metadata": {name: metadata[name] for name in names},
        "kv_cache": kv_cache(metadata, cache_dtype(cell)),
    }


def metadata_ints(value) -> list:
    """A metadata value as the int64 list the C++ header and CMake carry (bools as 0/1)."""
    values = value if isinstance(value, list) else [value]
    return [int(v) for v in values]
