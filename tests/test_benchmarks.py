"""etforge.builders.bench.benchmark: structure and sanity of the measurement, never its speed.

Timing on these small shared machines is noisy, so nothing here asserts how fast
anything is; benchmarks/bench_agreement.py is run once to show it works.
"""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import numpy as np
import pytest

from etforge.builders.bench.benchmark import (
    BENCH,
    build_benchmark,
    current_thread_count,
    prepare_inputs,
    resolve_options,
)
from etforge.builders.runtime.timing_stats import summarize
from etforge.publish.baseline import BASELINE_FORMAT, compare_with_baseline, load_baseline, write_baseline

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "benchmarks" / "bench_agreement.py"
SHAPE = (1, 3, 16, 16)


class FakeCell:
    name = "cnn/xnnpack/fp32"

    def canonical(self) -> dict:
        return {"model": "cnn", "backend": "xnnpack", "quantization": "fp32"}


@pytest.fixture(scope="module")
def program(tmp_path_factory):
    """A small XNNPACK .pte and a reference.npz holding its example input."""
    spec = importlib.util.spec_from_file_location("bench_agreement", SCRIPT)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    out = tmp_path_factory.mktemp("bench")
    pte = script.build_small_cnn_pte(out, SHAPE)
    reference = out / "reference.npz"
    np.savez(
        reference,
        input_0=np.random.default_rng(0).standard_normal(SHAPE).astype("float32"),
        output_0=np.zeros((1, 10), "float32"),
    )
    return pte, reference


def test_bench_json_and_info(program, tmp_path):
    pte, reference = program
    result = build_benchmark(FakeCell(), pte, reference, ["float32"], {"warmup": 2, "iterations": 15}, tmp_path)
    assert result.status == "ok" and set(result.files) == {BENCH, "program.etdump"}
    bench = result.files[BENCH]
    assert bench == tmp_path / BENCH and bench.is_file()
    record = json.loads(bench.read_text())
    assert record["format"] == "etforge-bench/1"
    assert record["cell"] == {"name": "cnn/xnnpack/fp32", "model": "cnn", "backend": "xnnpack", "quantization": "fp32"}
    assert record["program"]["file"] == pte.name and record["program"]["size_bytes"] == pte.stat().st_size
    assert record["inputs"] == [{"shape": list(SHAPE), "dtype": "float32"}]
    assert record["iterations"] == record["iterations_requested"] == 15 and len(record["samples_ms"]) == 15
    assert record["warmup_iterations"] == 2 and record["stopped_early"] is False and record["note"] == ""
    lat = record["latency_ms"]
    assert set(lat) == {"p50", "p90", "trimmed_mean", "mean", "min", "max", "stdev"}
    assert 0 < lat["min"] <= lat["p50"] <= lat["p90"] <= lat["max"]
    assert lat["min"] <= lat["trimmed_mean"] <= lat["max"] and lat["stdev"] >= 0
    assert min(record["samples_ms"]) == lat["min"] and max(record["samples_ms"]) == lat["max"]
    assert record["load"]["total_ms"] > 0 and record["load"]["program_ms"] >= 0
    mem = record["memory"]
    assert mem["process_peak_rss_bytes"] > 0 and "process" in mem["note"]
    assert mem["rss_after_load_bytes"] > 0 and isinstance(mem["load_rss_delta_bytes"], int)
    assert record["threads"]["requested"] is None and record["threads"]["used"] == current_thread_count()
    host = record["host"]
    assert host["cpu_model"] and host["logical_cores"] >= 1 and host["python"] and host["os"]
    assert len(record["load_average"]["before"]) == 3 and "load_average_1m" in result.info
    assert host["executorch_version"] == metadata.version("executorch") and len(host["host_id"]) == 12

    info = result.info
    assert info["latency_p50_ms"] == lat["p50"] and info["latency_p90_ms"] == lat["p90"]
    assert info["latency_min_ms"] <= info["latency_p50_ms"] <= info["latency_p90_ms"]
    for key in (
        "latency_trimmed_mean_ms",
        "latency_max_ms",
        "latency_stdev_ms",
        "load_ms",
        "peak_rss_mb",
        "load_rss_delta_mb",
        "host",
        "host_id",
    ):
        assert key in info, key
    assert info["iterations"] == 15 and info["stopped_early"] is False and info["threads"] >= 1
    json.dumps(info)  # the runner stores it as JSON


def test_threads_option_recorded_and_restored(program, tmp_path):
    pte, reference = program
    before = current_thread_count()
    result = build_benchmark(
        "cnn/xnnpack/fp32", pte, reference, [], {"warmup": 1, "iterations": 5, "threads": 1}, tmp_path
    )
    record = json.loads(result.files[BENCH].read_text())
    assert record["threads"] == {"requested": 1, "used": 1, "runtime_default": before}
    assert result.info["threads"] == 1 and record["cell"] == {"name": "cnn/xnnpack/fp32"}
    assert current_thread_count() == before  # the process's pool is put back


def test_time_budget_stops_early_and_says_so(program, tmp_path):
    pte, reference = program
    result = build_benchmark(
        None, pte, reference, [], {"warmup": 0, "iterations": 10**7, "max_seconds": 0.05}, tmp_path
    )
    assert result.status == "ok" and result.info["stopped_early"] is True
    assert 1 <= result.info["iterations"] < 10**7 and result.info["iterations_requested"] == 10**7
    assert "time budget" in result.info["note"]
    record = json.loads(result.files[BENCH].read_text())
    assert len(record["samples_ms"]) == record["iterations"] == result.info["iterations"]


def test_inputs_cast_like_validation(program):
    _, reference = program
    import torch

    (x,) = prepare_inputs(reference, ["float16"])
    assert x.dtype == torch.float16 and x.is_contiguous() and tuple(x.shape) == SHAPE
    (y,) = prepare_inputs(reference, [])
    assert y.dtype == torch.float32
    (z,) = prepare_inputs(reference, ["bfloat16"])
    assert z.dtype == torch.bfloat16


def test_options_are_checked():
    assert resolve_options(None) == {
        "warmup": 5,
        "iterations": 50,
        "threads": None,
        "max_seconds": 10.0,
        "method": "forward",
    }
    for bad in (
        {"iterations": 0},
        {"warmup": -1},
        {"threads": 0},
        {"max_seconds": 0},
        {"iterations": "100"},
        {"iterationz": 5},
        {"threads": True},
    ):
        with pytest.raises(ValueError, match="benchmark option"):
            resolve_options(bad)


def test_summary_statistics():
    stats = summarize([i * 1_000_000 for i in range(1, 11)])  # 1..10 ms
    assert stats["p50"] == 5.5 and stats["min"] == 1 and stats["max"] == 10
    assert stats["p90"] == pytest.approx(9.1) and stats["trimmed_mean"] == 5.5  # middle 80%: 2..9
    skewed = summarize([1_000_000] * 9 + [100_000_000])
    assert skewed["trimmed_mean"] == 1.0 and skewed["mean"] > 10
    assert summarize([2_000_000])["stdev"] == 0.0


def test_baseline_flags_real_regressions_only():
    baseline = {
        "a/xnnpack/fp32": {"latency_p50_ms": 1.0},
        "b/xnnpack/fp32": {"latency_p50_ms": 2.0},
        "c/xnnpack/fp32": {"latency_p50_ms": 3.0},
        "gone/xnnpack/fp32": {"latency_p50_ms": 1.0},
    }
    current = {
        "a/xnnpack/fp32": {"latency_p50_ms": 2.0},  # 2x slower
        "b/xnnpack/fp32": {"latency_p50_ms": 2.1},  # 5% slower
        "c/xnnpack/fp32": {"latency_ms": {"p50": 1.5}},  # faster, a whole bench.json
        "new/xnnpack/fp32": {"latency_p50_ms": 9.0},
    }
    flagged = compare_with_baseline(current, baseline, 10)
    assert [row["cell"] for row in flagged] == ["a/xnnpack/fp32"]
    assert flagged[0]["change_pct"] == 100.0 and flagged[0]["regression"] is True
    assert flagged[0]["baseline_p50_ms"] == 1.0 and flagged[0]["current_p50_ms"] == 2.0
    assert [r["cell"] for r in compare_with_baseline(current, baseline, 4)] == ["a/xnnpack/fp32", "b/xnnpack/fp32"]
    assert compare_with_baseline({}, baseline, 10) == []
    with pytest.raises(ValueError):
        compare_with_baseline(current, baseline, -1)


def test_baseline_file_round_trip(tmp_path):
    results = {"a/xnnpack/fp32": {"latency_p50_ms": 1.25, "host_id": "abc"}, "a/portable/fp32": {"status": "skipped"}}
    path = tmp_path / "baseline.json"
    write_baseline(path, results, pipeline="etforge-demo", version="0.1.0")
    doc = json.loads(path.read_text())
    assert doc["format"] == BASELINE_FORMAT and doc["pipeline"] == "etforge-demo"
    assert load_baseline(path) == results
    bare = tmp_path / "bare.json"
    bare.write_text(json.dumps(results))
    assert load_baseline(bare) == results
    for text, message in (
        ("[]", "JSON object"),
        ('{"format": "other/9", "cells": {}}', "format"),
        ('{"x": {"latency_p50_ms": -1}}', "positive"),
        ("{", "not JSON"),
    ):
        bare.write_text(text)
        with pytest.raises(ValueError, match=message):
            load_baseline(bare)


def test_agreement_script_prints_both_figures_and_ratio(program):
    # Given the fixture's program (the no-argument path builds the same one, as the fixture did),
    # with inputs made from the program's own metadata.
    pte, _ = program
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), str(pte), "--rounds", "2", "--iterations", "20", "--warmup", "3"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    # Exit 1 only means the two figures differed by >10% this time (noise); never a crash.
    assert proc.returncode in (0, 1), proc.stderr[-3000:]
    assert re.search(r"^benchmark p50: \d+\.\d+ ms", proc.stdout, re.M), proc.stdout
    assert re.search(r"^plain p50: \d+\.\d+ ms", proc.stdout, re.M), proc.stdout
    assert re.search(r"^ratio \(benchmark / plain\): \d+\.\d+", proc.stdout, re.M), proc.stdout
