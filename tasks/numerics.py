"""Numerical comparison of a program's outputs against eager PyTorch."""

from __future__ import annotations

import math

import numpy as np


def compare(reference: np.ndarray, actual: np.ndarray) -> dict:
    """SQNR (dB), cosine similarity, max and mean abs error of one output.

    SQNR is None when the outputs are identical (infinite SQNR).
    """
    ref = np.asarray(reference, dtype=np.float64).ravel()
    act = np.asarray(actual, dtype=np.float64).ravel()
    if ref.shape != act.shape:
        raise ValueError(f"output shape mismatch: eager {reference.shape} vs program {actual.shape}")
    err = ref - act
    noise = float(np.sum(err * err))
    signal = float(np.sum(ref * ref))
    if noise == 0.0:
        sqnr = None
    elif signal == 0.0:
        sqnr = -math.inf
    else:
        sqnr = 10.0 * math.log10(signal / noise)
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
        "shape": list(reference.shape),
    }


def verdict(metrics: list, thresholds: dict) -> list:
    """Messages for every threshold an output misses (empty: passed)."""
    misses = []
    for i, m in enumerate(metrics):
        if "sqnr_db" in thresholds and m["sqnr_db"] is not None and m["sqnr_db"] < thresholds["sqnr_db"]:
            misses.append(f"output {i}: SQNR {m['sqnr_db']:.1f} dB < {thresholds['sqnr_db']} dB")
        if "cosine" in thresholds and m["cosine"] < thresholds["cosine"]:
            misses.append(f"output {i}: cosine {m['cosine']:.5f} < {thresholds['cosine']}")
        if "max_abs_error" in thresholds and m["max_abs_error"] > thresholds["max_abs_error"]:
            misses.append(f"output {i}: max abs error {m['max_abs_error']:.3g} > {thresholds['max_abs_error']}")
    return misses
