"""Latency statistics of a benchmark's samples: percentiles and a trimmed mean, in milliseconds."""

from __future__ import annotations

import math
import statistics

from etforge.core.errors import BadValue

TRIM = 0.10  # trimmed mean drops this share of samples from each end (middle 80%)
NS_PER_MS = 1e6


def percentile(sorted_values: list, q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default), ``q`` in [0, 100]."""
    if not sorted_values:
        raise BadValue("percentile of no samples")
    pos = (len(sorted_values) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def trimmed_mean(sorted_values: list, trim: float = TRIM) -> float:
    """Mean of the middle (1 - 2*trim) of the samples; all of them when too few to trim."""
    k = int(len(sorted_values) * trim)
    middle = sorted_values[k : len(sorted_values) - k] or sorted_values
    return statistics.fmean(middle)


def summarize(samples_ns: list) -> dict:
    """Latency statistics in milliseconds from per-iteration nanoseconds."""
    ms = sorted(s / NS_PER_MS for s in samples_ns)
    return {
        "p50": percentile(ms, 50),
        "p90": percentile(ms, 90),
        "trimmed_mean": trimmed_mean(ms),
        "mean": statistics.fmean(ms),
        "min": ms[0],
        "max": ms[-1],
        "stdev": statistics.stdev(ms) if len(ms) > 1 else 0.0,
    }


# ---------------------------------------------------------------- runtime helpers
