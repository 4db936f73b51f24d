"""Encoder-decoder ``transformers:`` tasks: ``automatic-speech-recognition`` (Whisper) and
``text2text-generation`` (T5), planned without importing transformers.

::

    models:
      tiny_whisper:
        transformers:
          task: automatic-speech-recognition
          config: {model_type: whisper, d_model: 32, ...}
          seq2seq: {max_cache_len: 32, decode_steps: 8}   # text2text-generation also: encoder_len

One program, two methods, as optimum-executorch exports them and ExecuTorch's ASR runner
reads them: ``encoder`` (Whisper: ``input_features [1, num_mel_bins, 2 * max_source_positions]``
float32; T5: ``input_ids [1, encoder_len]`` int64 -> the encoder's last hidden state) and
``text_decoder`` (``decoder_input_ids [1, 1]``, ``encoder_hidden_states [1, S, d_model]``,
``cache_position [1]`` -> logits ``[1, 1, vocab]``, with a static self-attention KV cache).
The encoder input is the only difference between the tasks (:data:`ENCODER_INPUTS`).
The methods are implied from the config (values it leaves out: its class's defaults, read
from transformers' source); a user gives no ``inputs``.

Which backends and schemes a seq2seq cell takes is what each backend recipe's
``llm.seq2seq`` block says (measured), like an LLM's (hf_source.llm_rejection).
"""

from __future__ import annotations

from etforge.config import recipes
from etforge.config.hf_config_keys import default_value
from etforge.config.model import InputSpec

ENCODER_INPUTS = {"automatic-speech-recognition": "input_features", "text2text-generation": "input_ids"}
SEQ2SEQ_DEFAULTS = {"max_cache_len": 64, "decode_steps": 8}
ENCODER_LEN_DEFAULT = 16  # text2text-generation's encoder input_ids length
ENCODER, DECODER = "encoder", "text_decoder"  # the method names ExecuTorch's ASR runner loads


def config_value(config: dict, key: str):
    """``key`` of a config dict, else its class's default (None when neither says)."""
    value = config.get(key)
    return default_value(config["model_type"], key) if value is None else value


def _int(r, config: dict, key: str, path: tuple) -> int:
    value = config_value(config, key)
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise r.doc.error(path, f"cannot tell the config's {key} (set it in the config)")
    return value


def resolve_seq2seq(r, task: str, node: dict, spec: dict, config: dict, path: tuple, name: str) -> tuple:
    """(the ``seq2seq`` options, the implied methods) of a seq2seq model ``models.<name>``."""
    opts = {**SEQ2SEQ_DEFAULTS, **(node.get("seq2seq") or {})}
    where = path + ("seq2seq",)
    for key in ("inputs", "methods"):
        if key in spec:
            raise r.doc.error(
                ("models", name, key),
                f"a {task} model's methods are implied (encoder: {ENCODER_INPUTS[task]}; text_decoder: "
                "decoder_input_ids, encoder_hidden_states, cache_position); set transformers.seq2seq instead",
            )
    if opts["decode_steps"] > opts["max_cache_len"]:
        raise r.doc.error(where, f"decode_steps {opts['decode_steps']} exceeds max_cache_len {opts['max_cache_len']}")
    targets = config_value(config, "max_target_positions")
    if isinstance(targets, int) and opts["max_cache_len"] > targets:
        raise r.doc.error(
            where + ("max_cache_len",),
            f"max_cache_len {opts['max_cache_len']} exceeds the config's max_target_positions {targets}",
        )
    cpath = path + ("config",)
    vocab, width = _int(r, config, "vocab_size", cpath), _int(r, config, "d_model", cpath)
    if task == "automatic-speech-recognition":
        if "encoder_len" in opts:
            raise r.doc.error(
                where + ("encoder_len",),
                "Whisper's encoder length follows from its config (2 * max_source_positions frames)",
            )
        mels, frames = _int(r, config, "num_mel_bins", cpath), _int(r, config, "max_source_positions", cpath)
        encoder_input = InputSpec("input_features", (1, mels, 2 * frames), "float32")
        states = frames  # the encoder's two convolutions halve the frames
    else:
        opts.setdefault("encoder_len", ENCODER_LEN_DEFAULT)
        states = opts["encoder_len"]
        encoder_input = InputSpec("input_ids", (1, states), "int64", (0, vocab))
    methods = (
        (ENCODER, (encoder_input,)),
        (
            DECODER,
            (
                InputSpec("decoder_input_ids", (1, 1), "int64", (0, vocab)),
                InputSpec("encoder_hidden_states", (1, states, width), "float32"),
                InputSpec("cache_position", (1,), "int64", (0, opts["max_cache_len"])),
            ),
        ),
    )
    return opts, methods


def seq2seq_rejection(cell, recipe_path: recipes.RecipePath = recipes.DEFAULT_PATH) -> str | None:
    """Why etforge refuses this encoder-decoder cell at plan time, or None: what each backend recipe's
    ``llm.seq2seq`` block says (the schemes measured to work, the reasons the others fail)."""
    members = cell.backend.members
    outside = [m.recipe for m in members if not m.llm.get("seq2seq")]
    if outside:
        able = ", ".join(
            n
            for n in recipe_path.available("backend")
            if (recipe_path.load_data("backend", n).get("llm") or {}).get("seq2seq")
        )
        return f"encoder-decoder export (Whisper, T5; static KV cache) is measured on {able}, not {', '.join(outside)}"
    scheme = cell.quant.name
    for member in members:
        block = member.llm["seq2seq"]
        rejected = block.get("rejected") or {}
        if scheme in rejected:
            return rejected[scheme]
        if scheme not in (block.get("schemes") or []):
            return (
                f"encoder-decoder cells on {member.recipe} take {', '.join(sorted(block.get('schemes') or []))} "
                f"here, not {scheme!r}"
            )
    return None
