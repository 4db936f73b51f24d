"""The ``transformers:`` model source: a Hugging Face architecture named by its config.

::

    models:
      tiny_llm:
        transformers:
          task: text-generation          # | text-classification | feature-extraction
          config: {model_type: llama, vocab_size: 512, ...}   # or config_file: cfg/config.json
          model_class: LlamaForCausalLM  # optional; default: the task's AutoModelFor* class
          checkpoint: {path: ckpt/, sha256: <digest of the directory>}   # optional; else seeded random weights
          llm: {max_context_len: 64, prompt_len: 8, decode_steps: 8, dynamic_shapes: true}

Resolved here at plan time without importing transformers (or torch): config keys are
checked against the config class read from transformers' source (hf_config_keys), the
installed transformers version joins the key (package metadata), a checkpoint directory
is pinned by the digest of its files. A ``text-generation`` model's inputs are implied
(``input_ids [1, prompt_len]``, ``cache_position [prompt_len]``, int64: the static-KV-cache
forward of tasks/builders/llm_export.py); encoders declare theirs.
"""

from __future__ import annotations

import difflib
import json
from pathlib import Path

from etforge.config.hf_config_keys import accepted_keys, known_model_types
from etforge.config.model import InputSpec, ModelKind
from etforge.core.digest import digest

TEXT_GENERATION = "text-generation"
# Defaults of the `llm:` block (a text-generation model's export and validation).
LLM_DEFAULTS = {"max_context_len": 128, "prompt_len": 8, "decode_steps": 8, "dynamic_shapes": True}
DISTRIBUTION = "transformers"
# Backend recipe -> the schemes an LLM cell takes on it (measured: research/issue13 NOTES.md section 4).
# XNNPACK and portable programs hold ExecuTorch's llama:: custom SDPA / KV-cache ops; Core ML cannot
# take them and lowers a static capture with transformers' own static cache instead (llm_export.py).
LLM_SCHEMES = {
    "xnnpack": frozenset({"fp32", "fp16", "8da4w", "8da8w"}),
    "portable": frozenset({"fp32"}),
    "coreml": frozenset({"fp32", "coreml_int4w"}),
}
CUSTOM_OPS_BACKENDS = frozenset({"xnnpack", "portable"})
# Why the combinations measured to fail cannot be built; other unlisted ones: not supported here.
_NO_TORCHAO_KERNELS = (
    "portable has no kernels for torchao's dynamic-activation ops (to_executorch: Missing out "
    "variants: torchao::choose_qparams_affine, quantize_affine, dequantize_affine); use xnnpack"
)
_WEIGHT_ONLY_XNNPACK = (
    "weight-only {bits}-bit linears on XNNPACK run but compute garbage on an LLM ({db} dB "
    "vs eager, top-1 0/8) at fp32 size; use 8da4w or 8da8w"
)
LLM_REJECTIONS = {
    ("coreml", "8da4w"): "8da4w does not lower on Core ML (coremltools: KeyError: torch.int8 in "
    "_construct_ct_tensor_type_from_torch); use coreml_int4w",
    ("coreml", "8da8w"): "dynamic int8 activations do not lower on Core ML (coremltools: KeyError: torch.int8); "
    "use coreml_int4w",
    ("coreml", "fp16"): "a Core ML LLM keeps fp32 weights (model.to(float16) fails in coremltools: slice_update "
    "... update has dtype fp16 whereas x has dtype fp32); use fp32 with "
    "compute_precision: float16, or coreml_int4w (which computes in fp16)",
    ("portable", "8da4w"): _NO_TORCHAO_KERNELS,
    ("portable", "8da8w"): _NO_TORCHAO_KERNELS,
    ("xnnpack", "bf16"): (
        "XNNPACK does not delegate bf16 linears (measured: 18% of the compute ops delegated, "
        "below its 50% coverage gate; the matmuls run as portable aten::mm); use fp16"
    ),
    ("xnnpack", "coreml_int4w"): _WEIGHT_ONLY_XNNPACK.format(bits=4, db=-44.6),
    ("xnnpack", "coreml_int8w"): _WEIGHT_ONLY_XNNPACK.format(bits=8, db=-68.1),
}
CORE_ML_DYNAMIC = (
    "Core ML LLM programs need static shapes (coremltools fails on the dynamic sequence length: "
    "'Input squeeze_0 has rank 1 != other inputs rank 0'): set transformers.llm.dynamic_shapes: "
    "false (prefill then runs token by token)"
)


def llm_rejection(cell) -> str | None:
    """Why etforge refuses this LLM cell at plan time, or None."""
    recipes = [m.recipe for m in cell.backend.members]
    outside = [r for r in recipes if r not in LLM_SCHEMES]
    if outside:
        return f"LLM export (static KV cache) supports {', '.join(sorted(LLM_SCHEMES))}, not {', '.join(outside)}"
    if "coreml" in recipes and len(recipes) > 1:
        return (
            "a chain with coreml cannot lower an LLM: Core ML needs a capture without ExecuTorch's llama:: "
            "custom ops, the other members use them"
        )
    scheme = cell.quant.name
    for recipe in recipes:
        if (recipe, scheme) in LLM_REJECTIONS:
            return LLM_REJECTIONS[recipe, scheme]
        if scheme not in LLM_SCHEMES[recipe]:
            return f"LLM cells on {recipe} take {', '.join(sorted(LLM_SCHEMES[recipe]))} here, not {scheme!r}"
    if "coreml" in recipes and cell.model.source["transformers"]["llm"]["dynamic_shapes"]:
        return CORE_ML_DYNAMIC
    return None


def uses_custom_ops(recipe_names) -> bool:
    """Whether an LLM program for these backend recipes holds ExecuTorch's llama:: custom ops."""
    return all(name in CUSTOM_OPS_BACKENDS for name in recipe_names)


def model_kind(source: dict) -> ModelKind:
    """A transformers text-generation model is an LLM: exported with a static KV cache and
    validated step by step; every other source is a module."""
    transformers = source.get("transformers")
    return ModelKind.LLM if transformers and transformers["task"] == TEXT_GENERATION else ModelKind.MODULE


def resolve_transformers(r, name: str, spec: dict) -> tuple[dict, tuple | None]:
    """(source, implied inputs or None) of ``models.<name>`` (``r``: tasks/config/resolve.py's resolver)."""
    path = ("models", name, "transformers")
    node = spec["transformers"]
    version = r.versions.distribution(DISTRIBUTION)
    if version is None:
        raise r.doc.error(path, "package 'transformers' is not installed (pip install -r requirements.txt)")
    task = node["task"]
    source = {
        "task": task,
        "model_class": node.get("model_class"),
        "attn_implementation": node.get("attn_implementation", "sdpa"),
    }
    if "config_file" in node:
        cpath = path + ("config_file",)
        full = r.inside_root(node["config_file"], cpath)
        config = _read_json(r, full, cpath)
        source["config_file"] = {"path": r.rel(full), "sha256": r.file_digest(full, cpath)}
        _check_config(r, config, cpath, prefix=f"{node['config_file']}: ")
    elif "config" in node:
        config = dict(node["config"])
        _check_config(r, config, path + ("config",))
    else:
        config = None
    if "checkpoint" in node:
        source["checkpoint"] = _checkpoint(r, node["checkpoint"], path + ("checkpoint",))
        if config is None:
            config = _read_json(r, r.root / source["checkpoint"]["path"] / "config.json", path + ("checkpoint", "path"))
            _check_config(r, config, path + ("checkpoint", "path"), prefix="config.json: ")
    if config is None:
        raise r.doc.error(
            path,
            "give the architecture: 'config' (inline), 'config_file' or a 'checkpoint' directory with a config.json",
        )
    source["config"] = config
    inputs = None
    if task == TEXT_GENERATION:
        llm = {**LLM_DEFAULTS, **(node.get("llm") or {})}
        _check_llm(r, llm, config, path + ("llm",))
        source["llm"] = llm
        if "inputs" in spec:
            raise r.doc.error(
                ("models", name, "inputs"),
                "a text-generation model's inputs are implied "
                "(input_ids [1, prompt_len], cache_position [prompt_len]); "
                "set transformers.llm.prompt_len instead",
            )
        inputs = (
            InputSpec("input_ids", (1, llm["prompt_len"]), "int64", (0, config["vocab_size"])),
            InputSpec("cache_position", (llm["prompt_len"],), "int64", (0, llm["max_context_len"])),
        )
    elif "llm" in node:
        raise r.doc.error(path + ("llm",), f"'llm' options apply to task {TEXT_GENERATION!r}, not {task!r}")
    elif "inputs" not in spec:
        raise r.doc.error(
            ("models", name),
            f"missing required key 'inputs' (a {task} model's token inputs, e.g. input_ids and attention_mask, int64)",
        )
    return {"transformers": source, "packages": {DISTRIBUTION: version}}, inputs


def _read_json(r, full: Path, path: tuple) -> dict:
    try:
        data = json.loads(full.read_text(encoding="utf-8"))
    except OSError as exc:
        raise r.doc.error(path, f"cannot read {full.name}: {exc.strerror}") from None
    except ValueError as exc:
        raise r.doc.error(path, f"{full.name} is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise r.doc.error(path, f"{full.name} must hold a JSON object")
    return data


def _check_config(r, config: dict, path: tuple, prefix: str = "") -> None:
    model_type = config.get("model_type")
    if not isinstance(model_type, str):
        raise r.doc.error(path, f"{prefix}missing 'model_type' (e.g. llama, qwen3, bert)")
    keys = accepted_keys(model_type)
    known = known_model_types()
    if known is not None and model_type not in known:
        close = difflib.get_close_matches(model_type, known, n=1)
        raise r.doc.error(
            path + (("model_type",) if not prefix else ()),
            f"{prefix}unknown model_type {model_type!r}" + (f"; did you mean {close[0]!r}?" if close else ""),
        )
    if keys is None:  # layout not understood: the capture task checks against the real class
        return
    for key in config:
        if key not in keys:
            close = difflib.get_close_matches(key, sorted(keys), n=1, cutoff=0.6)
            where = path + ((key,) if not prefix else ())
            raise r.doc.error(
                where,
                f"{prefix}unknown {model_type} config key {key!r}" + (f"; did you mean {close[0]!r}?" if close else ""),
            )


def _check_llm(r, llm: dict, config: dict, path: tuple) -> None:
    if llm["prompt_len"] + llm["decode_steps"] > llm["max_context_len"]:
        raise r.doc.error(
            path,
            f"prompt_len + decode_steps ({llm['prompt_len']} + {llm['decode_steps']}) "
            f"exceeds max_context_len {llm['max_context_len']}",
        )
    positions = config.get("max_position_embeddings")
    if isinstance(positions, int) and llm["max_context_len"] > positions:
        raise r.doc.error(
            path + ("max_context_len",),
            f"max_context_len {llm['max_context_len']} exceeds the config's max_position_embeddings {positions}",
        )


def _checkpoint(r, node: dict, path: tuple) -> dict:
    full = r.inside_root(node["path"], path + ("path",))
    if not full.is_dir():
        raise r.doc.error(path + ("path",), f"checkpoint directory {node['path']!r} not found")
    files = {
        p.relative_to(full).as_posix(): r.file_digest(p, path + ("path",))
        for p in sorted(full.rglob("*"))
        if p.is_file()
    }
    actual = checkpoint_digest(files)
    if actual != node["sha256"]:
        raise r.doc.error(
            path + ("sha256",), f"checkpoint directory sha256 is {actual}, pipeline pins {node['sha256']}"
        )
    return {"path": r.rel(full), "sha256": actual}


def checkpoint_digest(files: dict) -> str:
    """The digest pinning a checkpoint directory: over (relative name, sha256) of every file."""
    return digest(sorted(files.items()))


def reject_llm_cells(cells: tuple, rejected: tuple, models: dict, backends: dict) -> tuple[tuple, tuple]:
    """The matrix's cells without the LLM cells etforge cannot build, which join ``rejected``; an LLM
    cell a recipe already refused gets the LLM reason where one is known (it says why and what to use)."""
    from dataclasses import replace

    from etforge.config.model import RejectedCell

    kept, refused = [], []
    for r in rejected:
        model = models.get(r.model)
        recipes = [m.recipe for m in backends[r.backend].members] if r.backend in backends else []
        known = [LLM_REJECTIONS[k] for k in ((rec, r.quantization) for rec in recipes) if k in LLM_REJECTIONS]
        refused.append(
            replace(r, reason=known[0]) if model is not None and model.kind == ModelKind.LLM and known else r
        )
    for cell in cells:
        reason = llm_rejection(cell) if cell.model.kind == ModelKind.LLM else None
        if reason:
            refused.append(RejectedCell(cell.model.name, cell.backend.name, cell.quant.name, reason))
        else:
            kept.append(cell)
    return tuple(kept), tuple(refused)
