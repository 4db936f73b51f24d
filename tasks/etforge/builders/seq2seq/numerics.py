"""Numerics of an encoder-decoder program (Whisper, T5): the encoder once, then the decoder step by step.

The capture's reference (etforge.builders.seq2seq.export) holds, per sample, an encoder input x (the
encoder's validation data, else one seeded input), eager PyTorch's encoder output, its greedy
continuation g[0..N-1] from the decoder start token s and eager logits (no cache) at every step.
The program, in the ExecuTorch runtime, on each sample:

- ``encoder`` once on x: ``encoder_sqnr_db`` against eager's encoder output;
- ``text_decoder`` teacher-forced on the program's own encoder output: step i feeds s (i = 0) or
  *eager's* token g[i-1] at cache position i, so both sides see the same tokens, and its logits are
  compared with eager's at that step (``step_sqnr_db``; ``top1_agreement``: steps whose argmax is g[i]);
- free-running greedy from s: ``greedy_agreement``, the tokens equal to g before the first
  divergence, over N.

``sqnr_db`` is the worst of the encoder and every step; the gates and their per-scheme defaults are
an LLM's (etforge.builders.llm.numerics), including the same-scheme comparison of a quantized
cell with its quantized eager model. Every comparison fails on NaN. Several samples
(:func:`merge_samples`): the worst SQNR and cosine, the largest error, agreements over every step
of every sample; ``numerics.json`` keeps each sample's figures under ``seq2seq.samples``.
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

    from etforge.builders.capture.reference import load_reference_samples
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
    from etforge.config.hf_seq2seq import DECODER, ENCODER

    source = load_reference_samples(reference, ENCODER).source
    with np.load(reference) as data:  # one row per sample (etforge.builders.seq2seq.export extra_arrays)
        xs, rows = torch.from_numpy(data["s2s_input"]), data["s2s_tokens"].tolist()
        ref_logits, ref_states = data["s2s_logits"], data["s2s_states"]
    same_logits = np.load(same_scheme) if same_scheme is not None else None  # [N, steps, V]
    pte_bytes = pte.read_bytes()
    dtypes = program_io_dtypes(pte_bytes, ENCODER)[0]  # an fp16 program takes fp16 features
    with deterministic(runtime=True):  # loaded, run and released on one thread: the verdict ships
        program = load_program(pte_bytes)
        with kernel_failures():  # a failed kernel is named, not just its error code
            runs = [run_seq2seq(program, cast_inputs([x], dtypes)[0], tokens) for x, tokens in zip(xs, rows)]
        del program
    per_sample = []
    for n, (run, tokens) in enumerate(zip(runs, rows)):
        # the decoder's steps read as an LLM's with a one-token prompt (the start token)
        metrics = compare_llm(ref_logits[n], tokens[1:], 1, run)
        states = run["states"].numpy()
        encoder_sqnr = sqnr_db(ref_states[n], states)
        encoder_sqnr = float("inf") if encoder_sqnr is None else encoder_sqnr  # identical
        bad = nonfinite(states.ravel())
        for key in ("nan", "inf", "values"):
            metrics["nonfinite"][key] += bad[key]
        metrics.pop("prefill_sqnr_db")
        metrics.pop("prompt_len")
        metrics["encoder_sqnr_db"] = encoder_sqnr
        metrics["start_token"] = tokens[0]
        metrics["sqnr_db"] = _worst([metrics["sqnr_db"], encoder_sqnr])
        if same_logits is not None:
            metrics["same_scheme"] = compare_same_scheme(same_logits[n], tokens[1:], 1, run)
        per_sample.append(metrics)
    metrics = merge_samples(per_sample)
    thresholds = llm_thresholds(cell)
    misses = llm_verdict(metrics, thresholds)
    report = {
        "cell": cell.canonical(),
        "program_sha256": program_sha256 or _sha256(pte),
        "inputs": source,
        "samples": len(per_sample),
        "task": cell.model.source["transformers"]["task"],
        "methods": [ENCODER, DECODER],
        "thresholds": thresholds,
        "seq2seq": metrics,
        "passed": not misses,
        "misses": misses,
        "notes": [RANDOM_WEIGHTS_NOTE] if random_weights(cell.model) else [],
    }
    return generative_verdict(
        workdir,
        report,
        ("encoder_sqnr_db",),
        inputs=source,
        methods=[ENCODER, DECODER],
        samples=len(per_sample),
    )


def merge_samples(per_sample: list) -> dict:
    """One sample's metrics as they are; several samples' as one: the worst SQNR (encoder and steps) and
    cosine, the largest error, top-1 agreement over every step of every sample, the mean greedy agreement,
    the non-finite values summed, a same-scheme comparison likewise; each sample's own under ``samples``.
    A NaN is the worst of any figure."""
    if len(per_sample) == 1:
        return per_sample[0]
    first = per_sample[0]
    steps = sum(len(m["top1_steps"]) for m in per_sample)
    out = {
        "sqnr_db": _worst([m["sqnr_db"] for m in per_sample]),
        "encoder_sqnr_db": _worst([m["encoder_sqnr_db"] for m in per_sample]),
        "cosine": _worst([m["cosine"] for m in per_sample]),
        "max_abs_error": -_worst([-m["max_abs_error"] for m in per_sample]),
        "top1_agreement": sum(sum(m["top1_steps"]) for m in per_sample) / steps,
        "greedy_agreement": sum(m["greedy_agreement"] for m in per_sample) / len(per_sample),
        "decode_steps": first["decode_steps"],
        "start_token": first["start_token"],
        "nonfinite": {k: sum(m["nonfinite"][k] for m in per_sample) for k in first["nonfinite"]},
        "samples": per_sample,
    }
    if "same_scheme" in first:
        same = [m["same_scheme"] for m in per_sample]
        out["same_scheme"] = {
            "sqnr_db": _worst([s["sqnr_db"] for s in same]),
            "top1_agreement": sum(s["top1_agreement"] for s in same) / len(same),
        }
    return out


def _worst(values: list) -> float:
    """The least of ``values``, a NaN before any number (min alone would depend on the order)."""
    return min(values, key=lambda v: float("-inf") if v != v else v)


def _sha256(path: Path) -> str:
    from etforge.core.digest import sha256_file

    return sha256_file(path)
