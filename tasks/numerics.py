"""Numerical comparison of a program's outputs against eager PyTorch.

A cell is validated on N samples (the model's ``validation`` data, or one
seeded random input). Every metric of an output is computed over all N
samples together; see :func:`compare_samples` for the exact definitions.
"""

from __future__ import annotations

import math

import numpy as np

TOP_K = 5
# Threshold name -> (metric key in an output's metrics, "min" if the metric must be at least
# the threshold, "max" if at most).
THRESHOLDS = {
    "sqnr_db": ("sqnr_db", "min"),
    "cosine": ("cosine", "min"),
    "max_abs_error": ("max_abs_error", "max"),
    "top1_agreement": ("top1_agreement", "min"),
    "top5_agreement": ("top5_agreement", "min"),
}


def sqnr_db(reference, actual) -> float | None:
    """10·log10(Σ ref² / Σ (ref − act)²); None when identical (infinite), −inf for a zero reference."""
    ref = np.asarray(reference, dtype=np.float64).ravel()
    err = ref - np.asarray(actual, dtype=np.float64).ravel()
    noise = float(np.dot(err, err))
    if noise == 0.0:
        return None
    signal = float(np.dot(ref, ref))
    if signal == 0.0:
        return -math.inf
    return 10.0 * math.log10(signal / noise)


def compare(reference: np.ndarray, actual: np.ndarray) -> dict:
    """SQNR (dB), cosine similarity, max and mean abs error of one output (all elements pooled).

    SQNR is None when the outputs are identical (infinite SQNR).
    """
    ref = np.asarray(reference, dtype=np.float64).ravel()
    act = np.asarray(actual, dtype=np.float64).ravel()
    if ref.shape != act.shape:
        raise ValueError(f"output shape mismatch: eager {np.shape(reference)} vs program {np.shape(actual)}")
    err = ref - act
    sqnr = sqnr_db(ref, act)
    ref_norm, act_norm = float(np.linalg.norm(ref)), float(np.linalg.norm(act))
    if ref_norm == 0.0 and act_norm == 0.0:
        cosine = 1.0
    elif ref_norm == 0.0 or act_norm == 0.0:
        cosine = 0.0
    else:
        cosine = float(np.dot(ref, act) / (ref_norm * act_norm))
    return {
        "sqnr_db": None if sqnr is None else round(sqnr, 3),
        "cosine": cosine,
        "max_abs_error": float(np.max(np.abs(err))) if err.size else 0.0,
        "mean_abs_error": float(np.mean(np.abs(err))) if err.size else 0.0,
        "shape": list(np.shape(reference)),
    }


def compare_samples(reference: np.ndarray, actual: np.ndarray, classification: bool = False) -> dict:
    """Metrics of one output over N samples; ``reference``/``actual`` are ``[N, *output_shape]``.

    - ``sqnr_db``: pooled over all samples, 10·log10(Σ ref² / Σ (ref − act)²) with both sums
      over every element of every sample (None: identical).
    - ``cosine``: cosine similarity of the two flattened ``[N, ...]`` arrays (pooled).
    - ``max_abs_error`` / ``mean_abs_error``: max / mean of |ref − act| over every element.
    - ``worst_sample`` / ``worst_sample_sqnr_db``: the sample with the lowest SQNR of its own,
      and that SQNR (None when every sample is identical).
    - ``shape``: the output's shape for one sample.

    With ``classification``, for an output whose last axis has at least 2 entries (the class
    logits or probabilities), every row ``[..., C]`` of every sample is one prediction:

    - ``top1_agreement``: the fraction of predictions whose program argmax equals eager's argmax.
    - ``top5_agreement``: the fraction of predictions where eager's top-1 class is among the
      program's top-5 classes (top-min(5, C)); so top5_agreement >= top1_agreement.
    - ``predictions``: how many predictions the two fractions count.

    Ties in an argmax resolve to the lowest class index, on both sides alike.
    """
    reference = np.asarray(reference)
    actual = np.asarray(actual)
    if reference.shape != actual.shape:
        raise ValueError(f"output shape mismatch: eager {reference.shape[1:]} vs program {actual.shape[1:]} "
                         f"(over {reference.shape[0]} samples)")
    metrics = compare(reference, actual)
    metrics["shape"] = list(reference.shape[1:])
    per_sample = [sqnr_db(r, a) for r, a in zip(reference, actual)]
    finite = [(s, i) for i, s in enumerate(per_sample) if s is not None]
    worst_sqnr, worst = min(finite) if finite else (None, 0)
    metrics["worst_sample"] = worst
    metrics["worst_sample_sqnr_db"] = None if worst_sqnr is None else round(worst_sqnr, 3)
    if classification and reference.ndim >= 2 and reference.shape[-1] >= 2:
        metrics.update(topk_agreement(reference, actual))
    return metrics


def topk_agreement(reference: np.ndarray, actual: np.ndarray, k: int = TOP_K) -> dict:
    """Top-1 and top-k agreement of ``actual`` with ``reference`` over rows of the last axis."""
    classes = reference.shape[-1]
    ref = np.asarray(reference, dtype=np.float64).reshape(-1, classes)
    act = np.asarray(actual, dtype=np.float64).reshape(-1, classes)
    eager_top1 = np.argmax(ref, axis=1)
    program_top1 = np.argmax(act, axis=1)
    k = min(k, classes)
    # Stable sort on the negated scores: ties keep the lowest index first, as argmax does.
    program_topk = np.argsort(-act, axis=1, kind="stable")[:, :k]
    in_topk = np.any(program_topk == eager_top1[:, None], axis=1)
    return {"top1_agreement": float(np.mean(program_top1 == eager_top1)),
            "top5_agreement": float(np.mean(in_topk)),
            "predictions": int(ref.shape[0])}


def verdict(metrics: list, thresholds: dict) -> list:
    """Messages for every threshold an output misses (empty: passed).

    A metric an output does not have (top-k of a non-classifier output, SQNR of identical
    outputs) cannot miss.
    """
    misses = []
    for i, m in enumerate(metrics):
        for name, (key, kind) in THRESHOLDS.items():
            if name not in thresholds or m.get(key) is None:
                continue
            value, bound = m[key], thresholds[name]
            if kind == "min" and value < bound:
                misses.append(f"output {i}: {_label(name)} {_fmt(name, value)} < {bound}{_unit(name)}")
            elif kind == "max" and value > bound:
                misses.append(f"output {i}: {_label(name)} {_fmt(name, value)} > {bound}{_unit(name)}")
    return misses


def _label(name: str) -> str:
    return {"sqnr_db": "SQNR", "cosine": "cosine", "max_abs_error": "max abs error",
            "top1_agreement": "top-1 agreement", "top5_agreement": "top-5 agreement"}[name]


def _unit(name: str) -> str:
    return " dB" if name == "sqnr_db" else ""


def _fmt(name: str, value: float) -> str:
    if name == "sqnr_db":
        return f"{value:.1f} dB"
    if name == "cosine":
        return f"{value:.5f}"
    if name == "max_abs_error":
        return f"{value:.3g}"
    return f"{value:.3f}"
