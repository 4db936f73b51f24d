"""Numerical comparison of a program's outputs against eager PyTorch.

A cell is validated on N samples (the model's ``validation`` data, or one
seeded random input). Every metric of an output is computed over all N
samples together; see :func:`compare_samples` for the exact definitions.

Every measured number is stored at the precision it means, by the functions below and nowhere
else, so that float noise never reaches a shipped file (two clean builds give the same bytes):
SQNR to 0.01 dB, absolute errors to 3 significant digits, cosine to 6 decimals.

Non-finite values never pass: NaN or inf anywhere in a program's output fails
the cell whatever its thresholds, and every threshold comparison is written so
that a NaN metric misses (``not value >= bound``): NaN compares false against
any bound.
"""

from __future__ import annotations

import math

import numpy as np

from etforge.core.errors import BadValue

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


SQNR_DECIMALS = 2  # 0.01 dB
ERROR_DIGITS = 3  # significant digits of an absolute error
COSINE_DECIMALS = 6


def measured_sqnr(value: float) -> float:
    return round(value, SQNR_DECIMALS) if math.isfinite(value) else value


def measured_error(value: float) -> float:
    return float(f"{value:.{ERROR_DIGITS}g}") if math.isfinite(value) else value


def measured_cosine(value: float) -> float:
    return round(value, COSINE_DECIMALS) if math.isfinite(value) else value


def sqnr_db(reference, actual) -> float | None:
    """10·log10(Σ ref² / Σ (ref − act)²) to 0.01 dB; None when identical (infinite), −inf for a zero reference."""
    ref = np.asarray(reference, dtype=np.float64).ravel()
    err = ref - np.asarray(actual, dtype=np.float64).ravel()
    noise = float(np.dot(err, err))
    if noise == 0.0:
        return None
    signal = float(np.dot(ref, ref))
    if signal == 0.0 or signal / noise == 0.0:  # an infinite error (an fp16 overflow to inf) included
        return -math.inf
    return measured_sqnr(10.0 * math.log10(signal / noise))


def nonfinite(values) -> dict:
    """{"values": how many, "nan": how many NaN, "inf": how many +-inf} of an array."""
    arr = np.asarray(values)
    if arr.dtype.kind not in "fc":
        return {"values": int(arr.size), "nan": 0, "inf": 0}
    return {
        "values": int(arr.size),
        "nan": int(np.count_nonzero(np.isnan(arr))),
        "inf": int(np.count_nonzero(np.isinf(arr))),
    }


def nonfinite_count(values) -> int:
    bad = nonfinite(values)
    return bad["nan"] + bad["inf"]


def compare(reference: np.ndarray, actual: np.ndarray) -> dict:
    """SQNR (dB), cosine similarity, max and mean abs error of one output (all elements pooled),
    and ``nonfinite``: the NaN/inf counts of the program's values (see :func:`nonfinite`).

    SQNR is None when the outputs are identical (infinite SQNR). With a non-finite program
    value every metric is NaN (inf - inf is NaN anyway; say it outright).
    """
    ref = np.asarray(reference, dtype=np.float64).ravel()
    act = np.asarray(actual, dtype=np.float64).ravel()
    if ref.shape != act.shape:
        raise BadValue(f"output shape mismatch: eager {np.shape(reference)} vs program {np.shape(actual)}")
    bad = nonfinite(actual)
    if bad["nan"] or bad["inf"]:
        return {
            "sqnr_db": math.nan,
            "cosine": math.nan,
            "max_abs_error": math.nan,
            "mean_abs_error": math.nan,
            "shape": list(np.shape(reference)),
            "nonfinite": bad,
        }
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
        "sqnr_db": sqnr,
        "cosine": measured_cosine(cosine),
        "max_abs_error": measured_error(float(np.max(np.abs(err)))) if err.size else 0.0,
        "mean_abs_error": measured_error(float(np.mean(np.abs(err)))) if err.size else 0.0,
        "shape": list(np.shape(reference)),
        "nonfinite": bad,
    }


def compare_samples(reference: np.ndarray, actual: np.ndarray, classification: bool = False) -> dict:
    """Metrics of one output over N samples; ``reference``/``actual`` are ``[N, *output_shape]``.

    - ``sqnr_db``: pooled over all samples, 10·log10(Σ ref² / Σ (ref − act)²) with both sums
      over every element of every sample (None: identical).
    - ``cosine``: cosine similarity of the two flattened ``[N, ...]`` arrays (pooled).
    - ``max_abs_error`` / ``mean_abs_error``: max / mean of |ref − act| over every element.
    - ``worst_sample`` / ``worst_sample_sqnr_db``: the sample with the lowest SQNR of its own,
      and that SQNR (None when every sample is identical); a sample with a non-finite value
      is the worst (its SQNR NaN).
    - ``shape``: the output's shape for one sample.
    - ``nonfinite``: ``{"values", "nan", "inf"}`` counts over the program's values of every sample.

    With ``classification``, for an output whose last axis has at least 2 entries (the class
    logits or probabilities), every row ``[..., C]`` of every sample is one prediction:

    - ``top1_agreement``: the fraction of predictions whose program argmax equals eager's argmax.
    - ``top5_agreement``: the fraction of predictions where eager's top-1 class is among the
      program's top-5 classes (top-min(5, C)); so top5_agreement >= top1_agreement.
      A prediction with a non-finite program score agrees on neither.
    - ``predictions``: how many predictions the two fractions count.

    Ties in an argmax resolve to the lowest class index, on both sides alike.
    """
    reference = np.asarray(reference)
    actual = np.asarray(actual)
    if reference.shape != actual.shape:
        raise BadValue(
            f"output shape mismatch: eager {reference.shape[1:]} vs program {actual.shape[1:]} "
            f"(over {reference.shape[0]} samples)"
        )
    metrics = compare(reference, actual)
    metrics["shape"] = list(reference.shape[1:])
    per_sample = [math.nan if nonfinite_count(a) else sqnr_db(r, a) for r, a in zip(reference, actual)]
    judged = [(-math.inf if math.isnan(s) else s, i) for i, s in enumerate(per_sample) if s is not None]
    worst = min(judged)[1] if judged else 0
    worst_sqnr = per_sample[worst] if judged else None
    metrics["worst_sample"] = worst
    metrics["worst_sample_sqnr_db"] = worst_sqnr
    if classification and reference.ndim >= 2 and reference.shape[-1] >= 2:
        metrics.update(topk_agreement(reference, actual))
    return metrics


def in_top_k(scores: np.ndarray, targets: np.ndarray, k: int) -> np.ndarray:
    """Per row of ``scores`` [rows, classes]: whether its ``targets`` class is among its ``k`` highest.
    A stable sort on the negated scores: ties keep the lowest index first, as argmax does."""
    top = np.argsort(-scores, axis=1, kind="stable")[:, :k]
    return np.any(top == targets[:, None], axis=1)


def topk_agreement(reference: np.ndarray, actual: np.ndarray, k: int = TOP_K) -> dict:
    """Top-1 and top-k agreement of ``actual`` with ``reference`` over rows of the last axis.

    A row with a non-finite program score agrees on neither (argmax would pick the NaN)."""
    classes = reference.shape[-1]
    ref = np.asarray(reference, dtype=np.float64).reshape(-1, classes)
    act = np.asarray(actual, dtype=np.float64).reshape(-1, classes)
    finite_rows = np.all(np.isfinite(act), axis=1)
    eager_top1 = np.argmax(ref, axis=1)
    program_top1 = np.argmax(act, axis=1)
    in_topk = in_top_k(act, eager_top1, min(k, classes)) & finite_rows
    return {
        "top1_agreement": float(np.mean((program_top1 == eager_top1) & finite_rows)),
        "top5_agreement": float(np.mean(in_topk)),
        "predictions": int(ref.shape[0]),
    }


def verdict(metrics: list, thresholds: dict, names: list | None = None, labels: list | None = None) -> list:
    """Messages for every threshold an output misses (empty: passed).

    An output with a non-finite value misses with one message saying how many, whatever
    the thresholds (its other metrics are NaN and not judged). A metric an output does not
    have (top-k of a non-classifier output, SQNR of identical outputs) cannot miss; a NaN
    metric always misses. ``names``: the outputs' names where the model gives them; ``labels``:
    each entry's whole label instead (per output and size, for a model with dynamic dims).
    """
    misses = []
    for i, m in enumerate(metrics):
        label = (
            labels[i] if labels else f"output {i}" + (f" ({names[i]})" if names and i < len(names) and names[i] else "")
        )
        bad = m.get("nonfinite") or {}
        if bad.get("nan") or bad.get("inf"):
            misses.append(
                f"{label}: {bad['nan'] + bad['inf']} of {bad['values']} values are non-finite "
                f"({bad['nan']} NaN, {bad['inf']} inf)"
            )
            continue
        for name, (key, kind) in THRESHOLDS.items():
            if name not in thresholds or m.get(key) is None:
                continue
            value, bound = m[key], thresholds[name]
            # Written so that NaN misses: NaN >= bound and NaN <= bound are both False.
            if kind == "min" and not value >= bound:
                misses.append(f"{label}: {_label(name)} {_fmt(name, value)} < {bound}{_unit(name)}")
            elif kind == "max" and not value <= bound:
                misses.append(f"{label}: {_label(name)} {_fmt(name, value)} > {bound}{_unit(name)}")
    return misses


def _label(name: str) -> str:
    return {
        "sqnr_db": "SQNR",
        "cosine": "cosine",
        "max_abs_error": "max abs error",
        "top1_agreement": "top-1 agreement",
        "top5_agreement": "top-5 agreement",
    }[name]


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


def finite_json(value):
    """``value`` with every non-finite float as a string ("-inf"), so the file stays strict JSON."""
    import math

    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: finite_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite_json(v) for v in value]
    return value
