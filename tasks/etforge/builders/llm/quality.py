"""Perplexity and KL divergence of an LLM cell on a validation token file (``validation.tokens``).

The validated window is the file's first ``P + N`` ids (prompt_len + decode_steps): the program's
prefill predicts ids 1..P-1 and its N teacher-forced decode steps predict ids P..P+N-1, the very
run etforge.builders.llm.numerics makes (one run of the program). So P+N-1 positions, each judged
against the id that follows it in the file:

- perplexity: exp(mean over positions of -log softmax(logits)[next id]), for eager fp32, the
  eager model after the cell's scheme (the quantize stage's same-scheme logits) and the program;
- KL(P_fp32 || P_program) per position over the vocabulary, its mean and 99th percentile, as
  llama.cpp's ``--kl-divergence`` measures a quantized model against the full-precision one.

Gates: ``max_ppl_ratio`` (program / eager fp32 perplexity) and ``max_kl`` (on the mean KL).
Every figure that is not finite fails its gate.
"""

from __future__ import annotations

import numpy as np

from etforge.config.llm_tokens import token_source


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """Row-wise log-softmax in float64 (a large logit does not overflow)."""
    x = np.asarray(logits, dtype=np.float64)
    shifted = x - x.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def perplexity(logits: np.ndarray, targets) -> float:
    """exp of the mean negative log-likelihood of ``targets`` [T] under ``logits`` [T, V]."""
    logp = log_softmax(logits)
    nll = -logp[np.arange(len(targets)), np.asarray(targets)]
    return float(np.exp(nll.mean()))


def kl_per_position(reference: np.ndarray, actual: np.ndarray) -> np.ndarray:
    """KL(softmax(reference) || softmax(actual)) per row, in nats."""
    p_log, q_log = log_softmax(reference), log_softmax(actual)
    return (np.exp(p_log) * (p_log - q_log)).sum(axis=-1)


def quality(eager: np.ndarray, program: np.ndarray, targets, same_scheme: np.ndarray | None = None) -> dict:
    """The figures of one window: ``eager``/``program``/``same_scheme`` logits [T, V] at the same
    T positions, ``targets`` [T] the ids that follow them."""
    ppl_eager, ppl_program = perplexity(eager, targets), perplexity(program, targets)
    kl = kl_per_position(eager, program)
    with np.errstate(invalid="ignore", divide="ignore"):
        ratio = float(np.float64(ppl_program) / np.float64(ppl_eager))
    return {
        "positions": len(targets),
        "ppl_eager": ppl_eager,
        "ppl_same_scheme": None if same_scheme is None else perplexity(same_scheme, targets),
        "ppl_program": ppl_program,
        "ppl_ratio": ratio,
        # a NaN anywhere must surface: np.percentile of a NaN row is NaN, max() would hide nothing either
        "kl_mean": float(kl.mean()),
        "kl_p99": float(np.percentile(kl, 99)),
    }


def quality_misses(figures: dict, thresholds: dict) -> list:
    """One line per gate missed (a non-finite figure misses whatever the bound)."""
    misses = []
    bound = thresholds.get("max_ppl_ratio")
    if bound is not None and not figures["ppl_ratio"] <= bound:  # NaN misses
        misses.append(
            f"perplexity ratio {figures['ppl_ratio']:.4g} > max_ppl_ratio {bound} "
            f"(program {figures['ppl_program']:.4g}, eager fp32 {figures['ppl_eager']:.4g})"
        )
    bound = thresholds.get("max_kl")
    if bound is not None and not figures["kl_mean"] <= bound:
        misses.append(
            f"mean KL from eager fp32 {figures['kl_mean']:.4g} > max_kl {bound} (p99 {figures['kl_p99']:.4g})"
        )
    if not all(np.isfinite(v) for k, v in figures.items() if k.startswith(("ppl_", "kl_")) and v is not None):
        if not misses:  # no gate set: a non-finite figure still fails the cell
            misses.append(f"non-finite perplexity or KL ({_show(figures)})")
    return misses


def _show(figures: dict) -> str:
    return ", ".join(f"{k} {v}" for k, v in figures.items() if k != "positions")


def untested_gates(thresholds: dict, model_name: str) -> list:
    """A perplexity/KL gate on a cell without a token file: nothing measured it, so it misses."""
    return [
        f"{key}: no validation tokens to measure it (models.{model_name}.validation.tokens or .text)"
        for key in ("max_ppl_ratio", "max_kl")
        if key in thresholds
    ]


def quality_check(cell, window, ref_logits, run: dict, same_logits, thresholds: dict):
    """The cell's LlmQuality check from the LLM validation run (etforge.builders.llm.numerics), or None
    when there is neither a token file nor a perplexity/KL gate. ``window``: the token file's first
    P + N ids (None without one); ``ref_logits``/``same_logits`` [P + N - 1, V] eager fp32's and the
    same-scheme eager model's on that window; ``run``: the program's prefill and teacher-forced steps."""
    from etforge.checks.base import finite
    from etforge.checks.llm_quality import LlmQuality

    gates = {k: thresholds[k] for k in ("max_ppl_ratio", "max_kl") if k in thresholds}
    if window is None:
        if not gates:
            return None
        return LlmQuality(passed=False, misses=tuple(untested_gates(gates, cell.model.name)), **gates)
    P = len(window) - run["steps"].shape[0]
    program = np.concatenate([run["prefill"].numpy()[: P - 1], run["steps"].numpy()])
    figures = quality(ref_logits, program, window[1:], same_logits)
    misses = quality_misses(figures, gates)
    return LlmQuality(
        passed=not misses,
        inputs=token_source(cell.model.validation),
        positions=figures["positions"],
        misses=tuple(misses),
        **{k: finite(v) for k, v in figures.items() if k != "positions"},
        **gates,
    )
