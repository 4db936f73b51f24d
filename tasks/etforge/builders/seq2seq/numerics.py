"""Numerics of an encoder-decoder program (Whisper, T5): the encoder once, then the decoder step by step.

The capture's reference (etforge.builders.seq2seq.export) holds a seeded encoder input x, eager
PyTorch's encoder output, its greedy continuation g[0..N-1] from the decoder start token s and
eager logits (no cache) at every step. The program, in the ExecuTorch runtime:

- ``encoder`` once on x: ``encoder_sqnr_db`` against eager's encoder output;
- ``text_decoder`` teacher-forced on the program's own encoder output: step i feeds s (i = 0) or
  *eager's* token g[i-1] at cache position i, so both sides see the same tokens, and its logits are
  compared with eager's at that step (``step_sqnr_db``; ``top1_agreement``: steps whose argmax is g[i]);
- free-running greedy from s: ``greedy_agreement``, the tokens equal to g before the first
  divergence, over N.

``sqnr_db`` is the worst of the encoder and every step; the gates and their per-scheme defaults are
an LLM's (etforge.builders.llm.numerics), including the same-scheme comparison of a quantized
cell with its quantized eager model. Every comparison fails on NaN.
"""

from __future__ import annotations

from pathlib import Path

from etforge.pipeline.results import BuildResult


def run_seq2seq(program, encoder_input, tokens: list) -> dict:
    """The program's encoder output, its teacher-forced logits per step and its free greedy tokens."""
    import torch

    from etforge.config.hf_seq2seq import DECODER, ENCODER

    encoder, decoder = program.load_method(ENCODER), program.load_method(DECODER)
    states = encoder.execute([encoder_input.contiguous()])[0]

    def step(token: int, position: int):
        out = decoder.execute([torch.tensor([[token]]), states, torch.tensor([position])])[0]
        return out.reshape(-1, out.shape[-1])[-1].float()

    steps = torch.stack([step(tokens[i], i) for i in range(len(tokens) - 1)])
    greedy, token = [], tokens[0]
    for i in range(len(tokens) - 1):
        token = int(step(token, i).argmax())
        greedy.append(token)
    return {"states": states.float(), "prefill": steps[:1], "steps": steps, "greedy": greedy}


def build_seq2seq_validate(
    cell, pte: Path, reference: Path, workdir: Path, same_scheme: Path | None = None, program_sha256: str | None = None
) -> BuildResult:
    """Validate an encoder-decoder program against the capture's reference (see the module doc)."""
    import numpy as np
    import torch

    from etforge.builders.llm.numerics import (
        compare_llm,
        compare_same_scheme,
        generative_verdict,
        llm_thresholds,
        llm_verdict,
    )
    from etforge.builders.loading.hf_models import RANDOM_WEIGHTS_NOTE, random_weights
    from etforge.builders.numerics.compare import nonfinite, sqnr_db
    from etforge.builders.runtime.determinism import deterministic
    from etforge.builders.runtime.kernel_log import kernel_failures
    from etforge.builders.runtime.program_io import cast_inputs, load_program, program_io_dtypes
    from etforge.builders.seq2seq.export import REFERENCE_SOURCE
    from etforge.config.hf_seq2seq import DECODER, ENCODER

    with np.load(reference) as data:
        x, tokens = torch.from_numpy(data["s2s_input"]), [int(t) for t in data["s2s_tokens"]]
        ref_logits, ref_states = data["s2s_logits"], data["s2s_states"]
    pte_bytes = pte.read_bytes()
    (x,) = cast_inputs([x], program_io_dtypes(pte_bytes, ENCODER)[0])  # an fp16 program takes fp16 features
    with deterministic(runtime=True):  # loaded, run and released on one thread: the verdict ships
        program = load_program(pte_bytes)
        with kernel_failures():  # a failed kernel is named, not just its error code
            run = run_seq2seq(program, x, tokens)
        del program
    # the decoder's steps read as an LLM's with a one-token prompt (the start token)
    metrics = compare_llm(ref_logits, tokens[1:], 1, run)
    states = run["states"].numpy()
    encoder_sqnr = sqnr_db(ref_states, states)
    encoder_sqnr = float("inf") if encoder_sqnr is None else encoder_sqnr  # identical
    bad = nonfinite(states.ravel())
    for key in ("nan", "inf", "values"):
        metrics["nonfinite"][key] += bad[key]
    metrics.pop("prefill_sqnr_db")
    metrics.pop("prompt_len")
    metrics["encoder_sqnr_db"] = encoder_sqnr
    metrics["start_token"] = tokens[0]
    metrics["sqnr_db"] = min(metrics["sqnr_db"], encoder_sqnr, key=lambda v: float("-inf") if v != v else v)
    if same_scheme is not None:
        metrics["same_scheme"] = compare_same_scheme(np.load(same_scheme), tokens[1:], 1, run)
    thresholds = llm_thresholds(cell)
    misses = llm_verdict(metrics, thresholds)
    report = {
        "cell": cell.canonical(),
        "program_sha256": program_sha256 or _sha256(pte),
        "inputs": REFERENCE_SOURCE,
        "task": cell.model.source["transformers"]["task"],
        "methods": [ENCODER, DECODER],
        "thresholds": thresholds,
        "seq2seq": metrics,
        "passed": not misses,
        "misses": misses,
        "notes": [RANDOM_WEIGHTS_NOTE] if random_weights(cell.model) else [],
    }
    return generative_verdict(
        workdir, report, ("encoder_sqnr_db",), inputs=REFERENCE_SOURCE, methods=[ENCODER, DECODER]
    )


def _sha256(path: Path) -> str:
    from etforge.core.digest import sha256_file

    return sha256_file(path)
