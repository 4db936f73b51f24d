"""Every default etforge applies when pipeline.yaml (or a caller) leaves a value out: one place.

Imports nothing. A builder that reads one of these has it in its stage's key
through the code closure (etforge.pipeline.keys), so changing a default rebuilds
what it decides.

Benchmark options were defined twice before (10/100/20 s in the builder,
5/50/10 s in the plan); the plan's values are the ones every ``doit`` run used,
so they are the defaults now, for a direct call of the builder too.
"""

from __future__ import annotations

# ---------------------------------------------------------------- models and data
INPUT_DTYPE = "float32"  # models.<m>.inputs[i].dtype
# models.<m>.inputs[i].range for an integer input that declares none: [lo, hi), hi exclusive.
# Small and non-negative, so an index input (nn.Embedding, gather) stays valid; the cell's note says so.
INT_INPUT_RANGE = (0, 2)
SEED = 0  # validation.seed: seeded random inputs and calibration data
SAMPLES = 16  # at most this many samples of a model's calibration or validation data (its `samples:`)
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp")  # the files an `images:` folder is read for

# ---------------------------------------------------------------- benchmarks (pipeline.yaml `benchmark:`)
# Small enough that `doit` benchmarks every host-runnable cell in seconds.
BENCHMARK = {"warmup": 5, "iterations": 50, "threads": None, "max_seconds": 10.0, "method": "forward"}
REGRESSION_PCT = 10.0  # benchmark.regression_pct: slower than the baseline by more than this is flagged

# ---------------------------------------------------------------- etforge diff (pipeline.yaml `diff:`)
# What counts as a regression against a baseline release (etforge.publish.diff). Timings also get
# noise_sigma times the spread both runs measured (the root of the sum of their latency variances)
# on top of latency_pct, and a change under etforge.publish.diff TIMER_FLOOR_MS (0.1 ms) is never judged.
DIFF_TOLERANCES = {
    "size_pct": 2.0,  # a program (or its external weights, or planned memory) this much larger
    "sqnr_db": 1.0,  # SQNR this many dB lower (the worst output, and each output)
    "top_k": 0.01,  # top-1/top-5 agreement this much lower (a fraction)
    "coverage_pct": 1.0,  # delegation coverage this many percentage points lower
    "latency_pct": 10.0,  # p50 or p90 this much slower, or tokens per second this much fewer
    "memory_pct": 10.0,  # peak RSS this much higher
    "noise_sigma": 2.0,
}

# ---------------------------------------------------------------- gates
# Bytes a scheme may add for its own bookkeeping (quantization parameters, quantize and
# dequantize nodes, casts) before its saving shows; a recipe's size_gate.overhead_bytes wins.
# Measured with executorch 1.5.1: up to ~3 KB for static int8 of a 4-layer CNN with 7 KB of
# weights (XNNPACK, portable), ~1.2 KB for linreg; OpenVINO int8 declares ~30 KB.
SIZE_GATE_OVERHEAD_BYTES = 6144

# ---------------------------------------------------------------- verdicts
DIVERGENCE_SQNR_DB = 40.0  # first-divergence search of an fp32 cell without an sqnr_db threshold
# A .bpte's tolerances for a cell with neither max_abs_error nor sqnr_db (etforge.builders.numerics.bundle)
BUNDLE_RTOL = 1e-3
BUNDLE_ATOL_PER_PEAK = 1e-5  # atol = this * max(1, largest |expected|)

# ---------------------------------------------------------------- manifests (pipeline.yaml `manifests:`)
MANIFEST_OPTIONS = {"assets_dir": "assets/models", "base_url": "", "install_dir": "share/etforge/models"}
# Each platform's fallback order comes from the backend recipes (their manifest: platforms, rank).
