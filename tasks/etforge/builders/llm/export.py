"""Decoder-only LLMs the way ExecuTorch's LLM runner expects them.

The path (measured in research/issue13 NOTES.md section 3): transformers' own
``TorchExportableModuleForDecoderOnlyLM`` (static KV cache; forward
``(input_ids [1,T], cache_position [T]) -> logits [1,T,V]``), with attention and the cache
update swapped for ExecuTorch's ``llama::custom_sdpa`` / ``llama::update_cache`` ops,
exported with ``strict=True``; lowering adds the metadata methods the runner reads
(:func:`runner_metadata`) and the settings an LLM program needs (:func:`lowering_options`).

The capture stage (etforge.builders.capture.capture) calls :func:`eager_reference` and :func:`export_llm`; its reference holds a seeded prompt,
eager PyTorch's greedy continuation and eager logits for every position (no cache), which
etforge.builders.llm.numerics compares the program with.

The swap re-implements optimum-executorch's custom SDPA / KV-cache modules for
transformers 5.23 (its interfaces moved since 5.0): re-check it when transformers moves.
"""

from __future__ import annotations

from etforge.config.llm_tokens import token_source

ATTENTION = "etforge_et_custom_sdpa"
PROMPT_SEED_OFFSET = 1  # the prompt's generator seed = plan seed + this (weights use the plan seed)
# Starts with "random": a cell validated only on it is provisional (etforge.checks.numerics); a token
# file or text (validation.tokens, validation.text) replaces it with real text.
REFERENCE_SOURCE = "random (seeded) prompt (llm)"


def register_custom_ops() -> None:
    """Register torch.ops.llama.* (needed to export, to load a saved LLM graph and to run its program)."""
    import executorch.extension.llm.custom_ops.custom_ops  # noqa: F401


def cell_uses_custom_ops(cell) -> bool:
    """Whether the cell's LLM program holds llama:: custom ops (XNNPACK, portable) or is a static
    capture without them (Core ML): its backend recipes' ``llm.custom_ops``."""
    from etforge.config.hf_source import uses_custom_ops

    return uses_custom_ops(cell.backend.members)


def cell_llm_options(cell) -> dict:
    """The cell's ``llm`` options as its program is built: Core ML's is static (hf_source rejects
    a dynamic Core ML cell at plan time; this keeps the program and its metadata consistent)."""
    llm = dict(cell.model.source["transformers"]["llm"])
    if not cell_uses_custom_ops(cell):
        llm["dynamic_shapes"] = False
    return llm


def _window_mask(start_pos, seq_len: int, cache_len: int, window):
    """[seq_len, cache_len] float mask: 0 where key k is visible to query start_pos+i (k <= q and, with a
    window, q - k < window: transformers' sliding_window_overlay), else -inf."""
    import torch

    pos_q = start_pos + torch.arange(seq_len).unsqueeze(1)
    pos_k = torch.arange(cache_len).unsqueeze(0)
    allowed = pos_k <= pos_q
    if window is not None:
        allowed = allowed & (pos_q - pos_k < window)
    return torch.where(allowed, torch.tensor(0.0), torch.tensor(float("-inf")))


def _et_custom_sdpa(
    module,
    query,
    key,
    value,
    attention_mask,
    position_ids=None,
    scaling=None,
    sliding_window=None,
    softcap=None,
    **kwargs,
):
    import torch

    # HF gives [B,H,S,D] (key/value: the whole static cache); llama::custom_sdpa takes [B,S,H,D].
    start_pos = position_ids[0][0].item()
    seq_len, cache_len = query.shape[-2], key.shape[-2]
    # A sliding layer (Gemma 2/3, Mistral, Phi-3, ...) sees only the last `sliding_window` positions;
    # custom_sdpa's causal mode knows no window, so such a layer gets an explicit mask (measured:
    # without it Mistral and Phi-3 fall to ~3 dB once the context passes the window).
    window = sliding_window if sliding_window is not None and sliding_window < cache_len else None
    if softcap is not None:  # Gemma 2's attention logit softcap: custom_sdpa has none, plain math attention
        groups = query.shape[1] // key.shape[1]
        k, v = (x.repeat_interleave(groups, dim=1).float() for x in (key, value))
        scores = torch.tanh(torch.matmul(query.float(), k.transpose(2, 3)) * scaling / softcap) * softcap
        scores = scores + _window_mask(start_pos, seq_len, cache_len, window)
        return torch.matmul(torch.softmax(scores, dim=-1), v).transpose(1, 2).to(query.dtype), None
    q, k, v = (x.transpose(1, 2).float() for x in (query, key, value))
    if window is None:  # the op masks causally from start_pos itself
        out = torch.ops.llama.custom_sdpa(q, k, v, start_pos, None, 0.0, True, scaling)
    else:
        mask = _window_mask(start_pos, seq_len, cache_len, window)
        out = torch.ops.llama.custom_sdpa(q, k, v, start_pos, mask, 0.0, False, scaling)
    return out.to(query.dtype), None


def _register_attention() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(ATTENTION, _et_custom_sdpa)
    AttentionMaskInterface.register(ATTENTION, lambda *args, **kwargs: None)  # the op masks itself


def _dense(tensor):
    """A copy with row-major strides. With one KV head, ``.contiguous()`` of the [B,S,H,D] view is a
    no-op (a size-1 dim counts as contiguous) that keeps the H stride of S*D; ExecuTorch reads that as
    a permuted dim order, and llama::update_cache refuses the cache at run time (issue 34)."""
    return tensor.new_zeros(tensor.shape).copy_(tensor)


def _swap_kv_cache(wrapper) -> None:
    """Each cache layer writes a [B,S,H,D] buffer through llama::update_cache. transformers 5.23 wraps a
    config with layer_types + sliding_window in TorchExportableModuleWithHybridCache (``.cache``), any
    other in TorchExportableModuleWithStaticCache (``.static_cache``); both replace sliding layers with
    full-length StaticLayers, so every layer is swapped the same way (the window is a mask, above)."""
    import torch

    inner = wrapper.model
    cache = inner.static_cache if hasattr(inner, "static_cache") else inner.cache
    for i, layer in enumerate(cache.layers):
        inner.register_buffer(f"et_k_cache_{i}", _dense(layer.keys.transpose(1, 2)), persistent=False)
        inner.register_buffer(f"et_v_cache_{i}", _dense(layer.values.transpose(1, 2)), persistent=False)

        def update(key_states, value_states, *args, _i=i, _layer=layer, **kwargs):
            k_cache, v_cache = getattr(inner, f"et_k_cache_{_i}"), getattr(inner, f"et_v_cache_{_i}")
            start = _layer.cumulative_length.item()
            torch.ops.llama.update_cache(key_states.transpose(1, 2), k_cache, start)
            torch.ops.llama.update_cache(value_states.transpose(1, 2), v_cache, start)
            _layer.cumulative_length.add_(key_states.shape[-2])
            return k_cache.transpose(1, 2), v_cache.transpose(1, 2)

        layer.update = update


def export_llm(model, llm: dict, custom_ops: bool = True):
    """The ExportedProgram of ``model`` (a *ForCausalLM) with a static KV cache of ``llm["max_context_len"]``."""
    import torch
    from transformers.integrations.executorch import TorchExportableModuleForDecoderOnlyLM

    max_len, dynamic = llm["max_context_len"], llm["dynamic_shapes"]
    model.generation_config.use_cache = True
    model.generation_config.cache_implementation = "static"
    wrapper = TorchExportableModuleForDecoderOnlyLM(model, batch_size=1, max_cache_len=max_len)
    if custom_ops:
        register_custom_ops()
        _register_attention()
        model.config._attn_implementation = ATTENTION
        _swap_kv_cache(wrapper)
    length = 3 if dynamic else 1  # a static program takes one token per call (prefill token by token)
    ids, pos = torch.zeros((1, length), dtype=torch.long), torch.arange(length)
    shapes = None
    if dynamic:
        seq = torch.export.Dim("seq", max=max_len - 1)
        shapes = {"input_ids": {1: seq}, "cache_position": {0: seq}}
    with torch.no_grad():
        # strict=False exports but then fails in run_decompositions (NOTES.md section 1).
        program = wrapper.export(input_ids=ids, cache_position=pos, dynamic_shapes=shapes, strict=True)
        if custom_ops:
            from executorch.extension.llm.export.export_passes import RemoveRedundantTransposes

            graph = RemoveRedundantTransposes()(program.module())[0]
            program = torch.export.export(
                graph, args=(), kwargs={"input_ids": ids, "cache_position": pos}, dynamic_shapes=shapes, strict=True
            )
    return program


def runner_metadata(model_spec, custom_ops: bool, llm: dict | None = None) -> dict:
    """The constant methods ExecuTorch's LLM runner reads (extension/llm/runner/constants.h), plus
    informative shape facts; values from the config (built, never downloaded) and the llm options."""
    from etforge.builders.loading.hf_models import build_config

    source = model_spec.source["transformers"]
    config, llm = build_config(source), llm or source["llm"]
    eos = config.eos_token_id
    metadata = {
        "get_max_seq_len": llm["max_context_len"],
        "get_max_context_len": llm["max_context_len"],
        "get_vocab_size": config.vocab_size,
        "use_kv_cache": True,
        "use_sdpa_with_kv_cache": custom_ops,
        "enable_dynamic_shape": llm["dynamic_shapes"],
        "get_n_layers": config.num_hidden_layers,
        "get_max_batch_size": 1,
        "get_n_kv_heads": getattr(config, "num_key_value_heads", None) or config.num_attention_heads,
        "get_head_dim": getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads,
    }
    # A config without BOS/EOS leaves them to the tokenizer (the runner's fallback).
    if config.bos_token_id is not None:
        metadata["get_bos_id"] = config.bos_token_id
    if eos is not None:
        metadata["get_eos_ids"] = list(eos) if isinstance(eos, (list, tuple)) else [eos]
    return metadata


def lowering_options(cell) -> tuple[dict, dict]:
    """(to_edge_transform_and_lower kwargs, ExecutorchBackendConfig kwargs) of an LLM cell."""
    from executorch.exir import EdgeCompileConfig
    from executorch.exir.passes import MemoryPlanningPass

    register_custom_ops()
    custom = cell_uses_custom_ops(cell)
    edge = {
        "compile_config": EdgeCompileConfig(_check_ir_validity=False, _skip_dim_order=True),
        "constant_methods": runner_metadata(cell.model, custom, cell_llm_options(cell)),
        "transform_passes": [_drop_embedding_padding_idx()],
    }
    if not custom:
        edge["partitioner"] = coreml_llm_partitioners(cell)
    # const-prop fuses torchao's dequantize_affine + embedding into quantized embedding ops.
    backend = {
        "extract_delegate_segments": True,
        "do_quant_fusion_and_const_prop": True,
        "memory_planning_pass": MemoryPlanningPass(alloc_graph_input=False),
    }
    return edge, backend


def coreml_llm_partitioners(cell) -> list:
    """Core ML's partitioner with the settings an LLM lowers with (NOTES.md section 4 "Core ML settings
    that lowered"): iOS18 and the cell's compute precision; the KV cache and its position counter stay
    outside the delegate (take_over_mutable_buffer=True fails in coremltools'
    canonicalize_inplace_pattern on the cache's position state)."""
    import coremltools as ct
    from executorch.backends.apple.coreml.compiler import CoreMLBackend
    from executorch.backends.apple.coreml.partition import CoreMLPartitioner

    from etforge.builders.lowering.partitioners import _COREML_UNITS

    options = dict(cell.backend.members[0].options)
    specs = CoreMLBackend.generate_compile_specs(
        compute_unit=getattr(ct.ComputeUnit, _COREML_UNITS[options.get("compute_units", "all")]),
        minimum_deployment_target=ct.target.iOS18,
        compute_precision=getattr(ct.precision, options.get("compute_precision", "float16").upper()),
    )
    return [CoreMLPartitioner(compile_specs=specs, take_over_mutable_buffer=False)]


def static_capture(cell, root):
    """The graph a Core ML fp32 LLM cell lowers: the eager model exported again with transformers'
    static cache and plain SDPA (no llama:: ops) and static shapes (the capture's graph has both)."""
    from etforge.builders.loading.model_loading import build_model

    return export_llm(build_model(cell.model, root), cell_llm_options(cell), custom_ops=False)


def same_scheme_logits(model, reference):
    """Logits [P + N - 1, V] (float32) of ``model`` (the eager model after the cell's quantization or
    cast) on the capture's prompt followed by eager's greedy tokens, without a cache: the same
    positions as the reference's ``llm_logits``. Call before export_llm (which swaps attention)."""
    import numpy as np
    import torch

    from etforge.builders.runtime.determinism import deterministic

    with np.load(reference) as data:
        prompt, tokens = torch.from_numpy(data["input_0"][0]), torch.from_numpy(data["llm_tokens"])
        window = torch.from_numpy(data["llm_window"])[None] if "llm_window" in data else None
    ids = torch.cat([prompt, tokens[None, :-1]], 1) if window is None else window[:, :-1]
    with torch.no_grad(), deterministic():
        return model(input_ids=ids, use_cache=False).logits[0].float().numpy()


def _drop_embedding_padding_idx():
    from executorch.exir.dialects._ops import ops as exir_ops
    from executorch.exir.pass_base import ExportPass, PassResult

    class DropEmbeddingPaddingIdx(ExportPass):
        """embedding's padding_idx argument has no out-variant use (as optimum-executorch's pass)."""

        def call(self, graph_module):
            for node in graph_module.graph.nodes:
                if (
                    node.op == "call_function"
                    and node.target == exir_ops.edge.aten.embedding.default
                    and len(node.args) == 3
                ):
                    node.args = node.args[:2]
            graph_module.recompile()
            return PassResult(graph_module, True)

    return DropEmbeddingPaddingIdx()


def prompt_ids(model_spec, seed: int):
    """The seeded validation prompt [1, prompt_len] (ids above the special tokens 0-2)."""
    import torch

    source = model_spec.source["transformers"]
    vocab = source["config"].get("vocab_size") or 32000
    generator = torch.Generator().manual_seed(seed + PROMPT_SEED_OFFSET)
    return torch.randint(3, vocab, (1, source["llm"]["prompt_len"]), generator=generator)


def token_window(model_spec, root):
    """The validation tokens' first window [1, prompt_len + decode_steps] (int64), or None without
    any (etforge.config.llm_tokens checked their length and ids when the plan was built)."""
    import torch

    from etforge.config.llm_tokens import TEXT, TOKENS, read_token_ids

    validation = model_spec.validation or {}
    if TOKENS not in validation and TEXT not in validation:
        return None
    llm = model_spec.source["transformers"]["llm"]
    ids = read_token_ids(root, validation)[: llm["prompt_len"] + llm["decode_steps"]]
    return torch.from_numpy(ids)[None]


def eager_reference(model, model_spec, seed: int, root=None) -> tuple:
    """(samples, eager outputs, names, source, extra arrays) for reference.npz (etforge.builders.capture.capture).

    The one sample is the prompt (input_ids, cache_position) and its output the prefill logits;
    ``extra`` holds eager's greedy continuation ``llm_tokens`` [N] and, without a cache, the
    logits ``llm_logits`` [P + N - 1, V]: position P-1+i predicts token i. With a validation token
    file, the prompt is its first P ids, ``llm_window`` [P + N] its first window, and ``llm_logits``
    are eager's on that window (the decode steps are fed the file's ids, not the greedy tokens).
    """
    import numpy as np
    import torch

    from etforge.builders.runtime.determinism import deterministic

    window = token_window(model_spec, root) if root is not None else None
    P = model_spec.source["transformers"]["llm"]["prompt_len"]
    prompt = prompt_ids(model_spec, seed) if window is None else window[:, :P]
    steps = model_spec.source["transformers"]["llm"]["decode_steps"]
    ids, tokens = prompt.clone(), []
    with torch.no_grad(), deterministic():  # the reference every verdict is measured against
        for _ in range(steps):
            token = int(model(input_ids=ids, use_cache=False).logits[0, -1].argmax())
            tokens.append(token)
            ids = torch.cat([ids, torch.tensor([[token]])], 1)
        fed = ids if window is None else window
        logits = model(input_ids=fed[:, :-1], use_cache=False).logits[0].float()
    extra = {"llm_tokens": np.array(tokens, dtype=np.int64), "llm_logits": logits.numpy()}
    source = REFERENCE_SOURCE
    if window is not None:
        extra["llm_window"] = window[0].numpy()
        source = f"{token_source(model_spec.validation)} (llm)"
    # Non-finite eager decode logits need no check of their own: they make every SQNR NaN, which fails.
    return [(prompt, torch.arange(P))], [[logits[None, :P]]], ["logits"], source, extra


def capture_notes(model_spec, extra: dict) -> dict:
    """What the capture info says of an LLM: its continuation and whether its weights are random."""
    from etforge.builders.loading.hf_models import RANDOM_WEIGHTS_NOTE, random_weights

    llm = model_spec.source["transformers"]["llm"]
    notes: dict = {
        "llm": {
            "prompt_len": llm["prompt_len"],
            "decode_steps": llm["decode_steps"],
            "eager_tokens": extra["llm_tokens"].tolist(),
            "custom_ops": True,
        }
    }
    if random_weights(model_spec):
        notes["note"] = RANDOM_WEIGHTS_NOTE
    return notes
