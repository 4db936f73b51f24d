"""Encoder-decoder programs (Whisper, T5) the way optimum-executorch exports them and ExecuTorch's
ASR runner reads them: one program, two methods (etforge.config.hf_seq2seq).

    encoder        the model's encoder on its input (Whisper: ``input_features``; T5: ``input_ids``)
                   -> last_hidden_state [1, S, d_model]
    text_decoder   (decoder_input_ids [1, 1], encoder_hidden_states [1, S, d_model], cache_position [1])
                   -> logits [1, 1, vocab], with a static self-attention KV cache of ``max_cache_len``

The decoder method calls the whole model's forward with ``encoder_outputs`` given, so each
architecture's own head applies (Whisper's ``proj_out``, T5's tied-output scaling) where
transformers' ``Seq2SeqLMDecoderExportableModuleWithStaticCache`` assumes ``lm_head``. The
cross-attention keys and values are recomputed from ``encoder_hidden_states`` at every step
(a fresh cross-attention cache per call), so the program holds one mutable cache only.

The capture's reference (:func:`eager_reference`) holds, per sample, an encoder input, eager
PyTorch's greedy continuation from the decoder start token and eager logits without a cache at
every position, which etforge.builders.seq2seq.numerics compares the program with step by step.
The encoder inputs are the model's validation data for its encoder (``validation: {methods:
{encoder: {npz: ...}}}``, etforge.config.validation_data), else one seeded sample; the decoder takes
no data: it is driven from the start token on each sample's encoder output.
"""

from __future__ import annotations

from etforge.core.errors import BadValue

INPUT_SEED_OFFSET = 1  # the encoder input's generator seed = plan seed + this (weights use the plan seed)
REFERENCE_SOURCE = "random (seeded) encoder input (seq2seq)"


def _module_class():
    import torch
    from transformers import DynamicCache, EncoderDecoderCache, StaticCache
    from transformers.configuration_utils import get_head_shapes

    class Seq2SeqProgram(torch.nn.Module):
        """``encoder(x)`` and ``text_decoder(ids, states, position)`` of a *ForConditionalGeneration."""

        def __init__(self, model, encoder_input: str, max_cache_len: int):
            super().__init__()
            self.model = model
            self.encoder_input = encoder_input
            config = model.config
            self.static_cache = StaticCache(config=config, max_cache_len=max_cache_len)
            heads, head_dim = get_head_shapes(config.get_text_config(decoder=True))
            dtype = next(model.parameters()).dtype
            self.static_cache.early_initialization(1, heads, head_dim, dtype, torch.device("cpu"))
            for i, layer in enumerate(self.static_cache.layers):  # buffers: torch.export sees the cache
                self.register_buffer(f"key_cache_{i}", layer.keys, persistent=False)
                self.register_buffer(f"value_cache_{i}", layer.values, persistent=False)
                self.register_buffer(f"cumulative_length_{i}", layer.cumulative_length, persistent=False)

        def encoder(self, x):
            return self.model.get_encoder()(**{self.encoder_input: x}).last_hidden_state

        def text_decoder(self, decoder_input_ids, encoder_hidden_states, cache_position):
            # every call writes at cache_position: position 0 restarts a generation
            for layer in self.static_cache.layers:
                layer.cumulative_length.copy_(cache_position[0])
            cache = EncoderDecoderCache(self.static_cache, DynamicCache(config=self.model.config))
            return self.model(
                encoder_outputs=(encoder_hidden_states,),
                decoder_input_ids=decoder_input_ids,
                past_key_values=cache,
                cache_position=cache_position,
                use_cache=True,
            ).logits

    return Seq2SeqProgram


def _method(program, name: str):
    import torch

    class Method(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.program = program

        def forward(self, *args):
            return getattr(self.program, name)(*args)

    return Method()


def export_seq2seq(model, source: dict, example_states) -> dict:
    """``{"encoder": ExportedProgram, "text_decoder": ExportedProgram}`` of ``model`` (a
    *ForConditionalGeneration, fp32 or quantized); ``example_states``: an encoder output to trace
    the decoder with."""
    import torch
    from transformers.integrations.executorch import register_dynamic_cache_export_support

    from etforge.config.hf_seq2seq import DECODER, ENCODER, ENCODER_INPUTS

    register_dynamic_cache_export_support()
    program = _module_class()(model, ENCODER_INPUTS[source["task"]], source["seq2seq"]["max_cache_len"]).eval()
    encoder_input = encoder_sample(model, source, 0)
    if encoder_input.is_floating_point():  # a dtype scheme's model (fp16) takes its features in its dtype
        encoder_input = encoder_input.to(next(model.parameters()).dtype)
    with torch.no_grad():
        encoder = torch.export.export(_method(program, ENCODER), (encoder_input,), strict=True)
        decoder = torch.export.export(
            _method(program, DECODER),
            (torch.tensor([[start_token(model)]]), example_states, torch.tensor([0])),
            strict=True,
        )
    return {ENCODER: encoder, DECODER: decoder}


def start_token(model) -> int:
    """The decoder's start token: the config's, else its generation config's, else its pad token (T5's
    convention: "In T5 it is usually set to the pad_token_id"), checked against the vocabulary."""
    config = model.config
    token = getattr(config, "decoder_start_token_id", None)
    if token is None:
        token = getattr(model.generation_config, "decoder_start_token_id", None)
    if token is None:
        token = getattr(config, "pad_token_id", None)
    vocab = config.get_text_config(decoder=True).vocab_size
    if not isinstance(token, int) or not 0 <= token < vocab:
        raise BadValue(
            f"the config's decoder_start_token_id {token!r} is not a token of its vocabulary ({vocab}): "
            "set decoder_start_token_id in the config"
        )
    return token


def encoder_sample(model, source: dict, seed: int):
    """The seeded encoder input: Whisper's log-mel-like features (standard normal), T5's ids above the
    special tokens 0-2."""
    import torch

    config = model.config
    generator = torch.Generator().manual_seed(seed + INPUT_SEED_OFFSET)
    if source["task"] == "automatic-speech-recognition":
        frames = 2 * config.max_source_positions
        return torch.randn((1, config.num_mel_bins, frames), generator=generator)
    return torch.randint(3, config.vocab_size, (1, source["seq2seq"]["encoder_len"]), generator=generator)


def eager_logits(model, source: dict, encoder_input, tokens):
    """Logits [len(tokens), V] (float32) of the whole model on ``tokens`` (start token first) without a
    cache: row i predicts token i + 1."""
    import torch

    from etforge.builders.runtime.determinism import deterministic
    from etforge.config.hf_seq2seq import ENCODER_INPUTS

    ids = torch.tensor([list(tokens)], dtype=torch.long)
    with torch.no_grad(), deterministic():
        out = model(**{ENCODER_INPUTS[source["task"]]: encoder_input}, decoder_input_ids=ids, use_cache=False)
    return out.logits[0].float()


def encoder_inputs(model, model_spec, root, seed: int) -> tuple[list, str]:
    """(the encoder inputs the reference is built on, where they came from): the encoder's validation
    data, else one seeded sample (:func:`encoder_sample`)."""
    import torch

    from etforge.builders.capture.samples import load_samples, method_data
    from etforge.config.hf_seq2seq import ENCODER

    entry = method_data(model_spec, ENCODER)
    if entry is None:
        return [encoder_sample(model, model_spec.source["transformers"], seed)], REFERENCE_SOURCE
    inputs = dict(model_spec.methods)[ENCODER]
    batches, source = load_samples(model_spec, entry, root, seed, inputs=inputs)
    return [torch.from_numpy(batch[0]) for batch in batches], f"{ENCODER}: {source} (seq2seq)"


def eager_reference(model, model_spec, seed: int, root=None) -> dict:
    """Per encoder input (:func:`encoder_inputs`), in lists: the input, the eager encoder output, the greedy
    continuation (``tokens``: the start token, then ``decode_steps`` greedy tokens) and the eager logits of
    every step; ``source``: where the inputs came from."""
    import torch

    from etforge.builders.runtime.determinism import deterministic

    source = model_spec.source["transformers"]
    xs, said = encoder_inputs(model, model_spec, root, seed)
    out: dict = {"input": xs, "states": [], "tokens": [], "logits": [], "source": said}
    for x in xs:
        tokens = [start_token(model)]
        for _ in range(source["seq2seq"]["decode_steps"]):
            tokens.append(int(eager_logits(model, source, x, tokens)[-1].argmax()))
        with torch.no_grad(), deterministic():
            states = model.get_encoder()(**{_encoder_input(source): x}).last_hidden_state
        out["states"].append(states)
        out["tokens"].append(tokens)
        out["logits"].append(eager_logits(model, source, x, tokens[:-1]))
    return out


def _encoder_input(source: dict) -> str:
    from etforge.config.hf_seq2seq import ENCODER_INPUTS

    return ENCODER_INPUTS[source["task"]]


def reference_methods(eager: dict) -> dict:
    """method -> (samples, eager outputs, names, source) for capture.write_method_references: the encoder on
    each input, the decoder's first step (start token at position 0) on each eager encoder output."""
    import torch

    from etforge.config.hf_seq2seq import DECODER, ENCODER

    firsts = [
        (torch.tensor([[tokens[0]]]), states, torch.tensor([0]))
        for tokens, states in zip(eager["tokens"], eager["states"])
    ]
    return {
        ENCODER: (
            [(x,) for x in eager["input"]],
            [[s] for s in eager["states"]],
            ["last_hidden_state"],
            eager["source"],
        ),
        DECODER: (firsts, [[logits[None, :1]] for logits in eager["logits"]], ["logits"], eager["source"]),
    }


def runner_metadata(model_spec, capture) -> dict:
    """The constant methods ExecuTorch's LLM runners read (extension/llm/runner/constants.h; the ASR
    runner reads ``get_eos_ids``), from the config (built, never downloaded) and the seq2seq options."""
    from etforge.builders.loading.hf_models import build_config

    source = model_spec.source["transformers"]
    config = build_config(source)
    metadata = {
        "get_max_seq_len": source["seq2seq"]["max_cache_len"],
        "get_vocab_size": config.get_text_config(decoder=True).vocab_size,
        "use_kv_cache": True,
        "decoder_start_token_id": capture.llm["start_token"],
    }
    eos = getattr(config, "eos_token_id", None)
    if eos is not None:
        metadata["get_eos_ids"] = list(eos) if isinstance(eos, (list, tuple)) else [eos]
    return metadata


def extra_arrays(eager: dict) -> dict:
    """What the step-by-step validation reads besides the methods' samples (reference.npz), one row per
    sample: ``s2s_tokens`` [N, steps + 1], ``s2s_logits`` [N, steps, V], ``s2s_input`` [N, *encoder input],
    ``s2s_states`` [N, *encoder output]."""
    import numpy as np

    return {
        "s2s_tokens": np.array(eager["tokens"], dtype=np.int64),
        "s2s_logits": np.stack([logits.numpy() for logits in eager["logits"]]),
        "s2s_input": np.stack([x.numpy() for x in eager["input"]]),
        "s2s_states": np.stack([s.detach().numpy() for s in eager["states"]]),
    }
