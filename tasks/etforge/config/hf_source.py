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
forward of etforge.builders.llm.export); encoders declare theirs.
"""

from __future__ import annotations

import difflib
import json
from pathlib import Path

from etforge.config import recipes
from etforge.config.hf_config_keys import accepted_keys, known_model_types, task_model_types
from etforge.config.hf_seq2seq import ENCODER_INPUTS, resolve_seq2seq, seq2seq_rejection
from etforge.config.model import InputSpec, ModelKind
from etforge.core.digest import digest

TEXT_GENERATION = "text-generation"
# task -> (its Auto class, the name of transformers' mapping of the model_types that class takes).
TASKS = {
    "text-generation": ("AutoModelForCausalLM", "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES"),
    "text-classification": ("AutoModelForSequenceClassification", "MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES"),
    "feature-extraction": ("AutoModel", "MODEL_MAPPING_NAMES"),
    "image-classification": ("AutoModelForImageClassification", "MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES"),
    "fill-mask": ("AutoModelForMaskedLM", "MODEL_FOR_MASKED_LM_MAPPING_NAMES"),
    "object-detection": ("AutoModelForObjectDetection", "MODEL_FOR_OBJECT_DETECTION_MAPPING_NAMES"),
    # encoder-decoder programs (encoder + text_decoder methods): etforge.config.hf_seq2seq
    "automatic-speech-recognition": ("AutoModelForSpeechSeq2Seq", "MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING_NAMES"),
    "text2text-generation": ("AutoModelForSeq2SeqLM", "MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES"),
}
# Defaults of the `llm:` block (a text-generation model's export and validation).
LLM_DEFAULTS = {"max_context_len": 128, "prompt_len": 8, "decode_steps": 8, "dynamic_shapes": True}
DISTRIBUTION = "transformers"


def llm_rejection(cell, recipe_path: recipes.RecipePath = recipes.DEFAULT_PATH) -> str | None:
    """Why etforge refuses this LLM cell at plan time, or None: what each backend recipe's ``llm:``
    block says (the schemes measured to work, the reasons the others fail)."""
    members = cell.backend.members
    outside = [m.recipe for m in members if not m.llm]
    if outside:
        able = ", ".join(n for n in recipe_path.available("backend") if recipe_path.load_data("backend", n).get("llm"))
        return f"LLM export (static KV cache) supports {able}, not {', '.join(outside)}"
    if len({bool(m.llm.get("custom_ops")) for m in members}) > 1:
        return (
            f"a chain of {', '.join(m.recipe for m in members)} cannot lower an LLM: some need a capture "
            "without ExecuTorch's llama:: custom ops, the others use them"
        )
    scheme = cell.quant.name
    for member in members:
        rejected = member.llm.get("rejected") or {}
        if scheme in rejected:
            return rejected[scheme]
        schemes = member.llm.get("schemes") or []
        if scheme not in schemes:
            return f"LLM cells on {member.recipe} take {', '.join(sorted(schemes))} here, not {scheme!r}"
    static = next((m.llm["static_shapes"] for m in members if m.llm.get("static_shapes")), None)
    if static and cell.model.source["transformers"]["llm"]["dynamic_shapes"]:
        return static
    return None


def uses_custom_ops(members) -> bool:
    """Whether an LLM program for these backend members holds ExecuTorch's llama:: custom ops."""
    return all(m.llm.get("custom_ops") for m in members)


def model_kind(source: dict) -> ModelKind:
    """A transformers text-generation model is an LLM: exported with a static KV cache and
    validated step by step; an encoder-decoder task (Whisper, T5) likewise, as two methods; every
    other source is a module."""
    transformers = source.get("transformers")
    if transformers and transformers["task"] in ENCODER_INPUTS:
        return ModelKind.SEQ2SEQ
    return ModelKind.LLM if transformers and transformers["task"] == TEXT_GENERATION else ModelKind.MODULE


def resolve_transformers(r, name: str, spec: dict) -> tuple[dict, tuple | None]:
    """(source, implied methods or None) of ``models.<name>`` (``r``: etforge.config.resolve's resolver):
    ``(("forward", inputs),)`` for an LLM, ``encoder`` and ``text_decoder`` for a seq2seq model."""
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
    if not node.get("model_class"):
        _check_task(r, task, config["model_type"], path)
    source["config"] = config
    if "seq2seq" in node and task not in ENCODER_INPUTS:
        raise r.doc.error(
            path + ("seq2seq",), f"'seq2seq' options apply to tasks {', '.join(ENCODER_INPUTS)}, not {task!r}"
        )
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
            (
                "forward",
                (
                    InputSpec("input_ids", (1, llm["prompt_len"]), "int64", (0, config["vocab_size"])),
                    InputSpec("cache_position", (llm["prompt_len"],), "int64", (0, llm["max_context_len"])),
                ),
            ),
        )
    elif "llm" in node:
        raise r.doc.error(path + ("llm",), f"'llm' options apply to task {TEXT_GENERATION!r}, not {task!r}")
    elif task in ENCODER_INPUTS:
        source["seq2seq"], methods = resolve_seq2seq(r, task, node, spec, config, path, name)
        return {"transformers": source, "packages": {DISTRIBUTION: version}}, methods
    elif "inputs" not in spec:
        raise r.doc.error(
            ("models", name),
            f"missing required key 'inputs' (a {task} model's "
            + (
                "pixel_values [1, channels, H, W], float32)"
                if task in ("image-classification", "object-detection")
                else "token inputs, e.g. input_ids and attention_mask, int64)"
            ),
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
    """Raise a file:line error for a config transformers would not take as written. A pass is
    remembered by the config (r.memo, whose salt holds transformers' version and this code): reading
    transformers' sources with ``ast`` cost a no-op run about 8 ms per model."""
    r.memo.once(("transformers config", config), lambda: _config_problem(r, config, path, prefix))


def _config_problem(r, config: dict, path: tuple, prefix: str) -> None:
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


def _check_task(r, task: str, model_type: str, path: tuple) -> None:
    r.memo.once(("transformers task", task, model_type), lambda: _task_problem(r, task, model_type, path))


def _task_problem(r, task: str, model_type: str, path: tuple) -> None:
    """A model_type the task's Auto class has no class for (a config or checkpoint of another task)."""
    auto, mapping = TASKS[task]
    able = task_model_types(mapping)
    if able is None or model_type in able:
        return
    shown = ", ".join(sorted(able)[:12]) + (", ..." if len(able) > 12 else "")
    raise r.doc.error(
        path + ("task",),
        f"{auto} (task {task!r}) has no class for model_type {model_type!r}; it takes {len(able)} model types: "
        f"{shown} (or name a model_class)",
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


def _seq2seq_refuses(member, rejected) -> bool:
    return rejected.quantization in ((member.llm.get("seq2seq") or {}).get("rejected") or {})


def reject_llm_cells(
    cells: tuple, rejected: tuple, models: dict, backends: dict, recipe_path: recipes.RecipePath = recipes.DEFAULT_PATH
) -> tuple[tuple, tuple]:
    """The matrix's cells without the LLM cells etforge cannot build, which join ``rejected``; an LLM
    cell a recipe already refused gets the LLM reason where one is known (it says why and what to use)."""
    from dataclasses import replace

    from etforge.config.model import RejectedCell

    kept, refused = [], []
    for r in rejected:
        model = models.get(r.model)
        members = backends[r.backend].members if r.backend in backends else ()
        known = [m.llm["rejected"][r.quantization] for m in members if r.quantization in (m.llm.get("rejected") or {})]
        if model is not None and model.kind == ModelKind.SEQ2SEQ:  # the recipe's measured seq2seq reason
            known = [m.llm["seq2seq"]["rejected"][r.quantization] for m in members if _seq2seq_refuses(m, r)]
        refused.append(
            replace(r, reason=known[0]) if model is not None and model.kind != ModelKind.MODULE and known else r
        )
    for cell in cells:
        reason = llm_rejection(cell, recipe_path) if cell.model.kind == ModelKind.LLM else None
        if cell.model.kind == ModelKind.SEQ2SEQ:
            reason = seq2seq_rejection(cell, recipe_path)
        if reason:
            refused.append(RejectedCell(cell.model.name, cell.backend.name, cell.quant.name, reason))
        else:
            kept.append(cell)
    return tuple(kept), tuple(refused)


def task_rejection(cell) -> str | None:
    """Why a non-LLM ``transformers:`` cell cannot be built on its backend, or None: what each member
    recipe's ``hf_tasks`` block says was measured to fail (task, optionally model types and schemes)."""
    source = (cell.model.source or {}).get("transformers")
    if not source or source["task"] == TEXT_GENERATION:
        return None
    model_type = source["config"].get("model_type")
    for member in cell.backend.members:
        block = member.hf_tasks
        for entry in block.get("rejected") or ():
            if (
                entry["task"] == source["task"]
                and model_type in entry.get("model_types", (model_type,))
                and cell.quant.name in entry.get("schemes", (cell.quant.name,))
            ):
                return f"{entry['reason']} (measured {block['measured']})"
    return None


def reject_task_cells(doc, cells: tuple, rejected: tuple) -> tuple[tuple, tuple]:
    """The matrix's cells without the Hugging Face task cells a backend recipe refuses (task_rejection),
    which join ``rejected``; a matrix left empty is one error naming pipeline.yaml's line."""
    from etforge.config.matrix import reject_refused

    return reject_refused(doc, cells, rejected, task_rejection)


def reject_llm_keep_float(doc, cells: tuple, rejected: tuple) -> tuple[tuple, tuple]:
    """``keep_float: auto`` measures each layer on the module reference; a generative model's reference
    (an LLM's or an encoder-decoder's prompt and its logits per decode step) has no such measure yet, so
    its cells of that scheme are rejected, and the option is an error where it names no other cell.
    Explicit regexes work on LLMs (torchao schemes)."""
    from etforge.config.model import RejectedCell
    from etforge.config.yamlfile import format_path

    def generative(cell) -> bool:
        return cell.model.kind in (ModelKind.LLM, ModelKind.SEQ2SEQ)

    auto = {c.quant.name for c in cells if c.transform is not None and c.transform.options.get("keep_float") == "auto"}
    refused = list(rejected)
    for scheme in sorted(auto):
        path = ("quantization_options", scheme, "keep_float")
        users = [c for c in cells if c.quant.name == scheme]
        models = sorted({c.model.name for c in users if generative(c)})
        why = (
            f"auto is not implemented for generative models ({', '.join(models)}): it measures "
            "layers on a module's reference outputs, not on decode steps; name the layers instead "
            "(keep_float: [regex, ...] works on LLM cells)"
        )
        if models and all(generative(c) for c in users):
            raise doc.error(path, why)
        if models:
            where = f"{doc.file}:{doc.line_of(path)}: {format_path(path)}"
            refused += [
                RejectedCell(c.model.name, c.backend.name, c.quant.name, f"{where}: {why}")
                for c in users
                if generative(c)
            ]
    names = {r.name for r in refused}
    return tuple(c for c in cells if c.name not in names), tuple(refused)
