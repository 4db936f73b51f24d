"""The generation figures of an encoder-decoder program (Whisper, T5), in an LLM's terms.

bench.json's ``llm`` section, as etforge.builders.llm.bench measures an LLM's, so the report's LLM
table shows both alike. ExecuTorch's ASR runner (extension/asr/runner/seq2seq_runner.cpp) counts
the encoder's output length as the "prompt tokens"; so does this:

    load_ms          load_program + load_method of encoder and text_decoder, the program loaded afresh
    prefill          one execute of ``encoder`` on the capture's input: prefill_tok_s = S / time
    ttft_ms          the encoder, the decoder's first step (start token) and its argmax
    decode           N greedy decoder steps, each one execute: decode_tok_s = N / their time, and the
                     p50 of one step (N = the cache length - 1, at most llm_bench.DECODE_STEPS)
    first_*          the same of the very first generation after loading

Peak RSS as llm_bench measures it (VmHWM reset just before loading). Timings are reported, never gated.
"""

from __future__ import annotations

import gc
import time
from functools import partial
from pathlib import Path

from etforge.builders.llm.bench import DECODE_STEPS, _reset_peak, generation_section, timed_generations
from etforge.builders.runtime.proc_status import proc_status_bytes


def _generate(encoder, decoder, features, start: int, steps: int, samples: list) -> dict:
    import torch

    clock = time.perf_counter_ns
    t0 = clock()
    states = encoder.execute([features])[0]
    t1 = clock()
    logits = decoder.execute([torch.tensor([[start]]), states, torch.tensor([0])])[0]
    token = int(logits.reshape(-1)[-logits.shape[-1] :].argmax())
    t2 = clock()
    samples.append(proc_status_bytes("VmRSS").get("VmRSS", 0))
    step_ns = []
    for i in range(1, steps + 1):
        ids, pos = torch.tensor([[token]]), torch.tensor([i])
        s0 = clock()
        out = decoder.execute([ids, states, pos])[0]
        step_ns.append(clock() - s0)
        token = int(out.reshape(-1)[-out.shape[-1] :].argmax())
    samples.append(proc_status_bytes("VmRSS").get("VmRSS", 0))
    return {"prefill_ns": t1 - t0, "ttft_ns": t2 - t0, "step_ns": step_ns, "length": int(states.shape[1])}


def measure(pte: Path, features, start: int, max_cache_len: int, opts: dict) -> dict:
    """The ``llm`` section of bench.json for the encoder-decoder program ``pte``; ``features``: the
    capture's encoder input; ``start``: the decoder start token."""
    from etforge.builders.runtime.determinism import runtime
    from etforge.config.hf_seq2seq import DECODER, ENCODER

    steps = max(1, min(DECODE_STEPS, max_cache_len - 1))
    features = features.contiguous()
    gc.collect()
    before = proc_status_bytes("VmRSS").get("VmRSS")
    reset = _reset_peak()
    t0 = time.perf_counter_ns()
    program = runtime().load_program(str(pte))
    encoder, decoder = program.load_method(ENCODER), program.load_method(DECODER)
    t1 = time.perf_counter_ns()
    samples = [proc_status_bytes("VmRSS").get("VmRSS", 0)]
    try:
        first, runs = timed_generations(partial(_generate, encoder, decoder, features, start, steps, samples), opts)
    finally:
        del encoder, decoder, program
    hwm = proc_status_bytes("VmHWM").get("VmHWM") if reset else None
    return generation_section(
        runs,
        first,
        first["length"],
        steps,
        False,
        load_ns=t1 - t0,
        memory=(before, hwm, samples, "after loading and after each generation"),
        timer="time.perf_counter_ns around method.execute (encoder = prefill, each decoder step); "
        "ttft adds the first decoder step and its argmax; prompt_len = the encoder's output length",
    )
