"""The scripts in benchmarks/ run on a tiny matrix, so a broken import fails here instead of rotting a figure.

Each script checks what it compares before it prints a ratio (both sides built the same cells,
every program loads, a no-op started nothing) and otherwise exits 1 naming what failed.
benchmarks/bench_agreement.py runs in tests/test_benchmarks.py. benchmarks/llm_side_by_side.py
runs on a 1-layer Llama with its in-venv upstream path (``--tiny --fallback``: no PyPI), marked
slow: four LLM exports in child processes. There its upstream 8da4w export fails today, and the
test checks that the script says so and prints no ratio.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest
from conftest import REPO, copy_project

BENCHMARKS = REPO / "benchmarks"


def _script(name: str):
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run(name: str, *args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(BENCHMARKS / f"{name}.py"), *args], capture_output=True, text=True, timeout=timeout
    )


def test_etforge_vs_naive_builds_one_cell_on_both_sides_and_prints_a_ratio():
    run = _run(
        "etforge_vs_naive", "--models", "small_cnn", "--backends", "portable", "--schemes", "fp32", "--workers", "1"
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "both sides built the same 1 cells; 2 programs load in the ExecuTorch runtime" in run.stdout
    assert "etforge / naive: " in run.stdout
    assert "  export     1 tasks" in run.stdout and "outside the actions" in run.stdout  # the time breakdown


def test_etforge_vs_naive_prints_no_ratio_when_a_side_failed_a_cell():
    script = _script("etforge_vs_naive")
    cells = ["m/xnnpack/fp32", "m/portable/fp32"]
    ok = dict.fromkeys(cells, "ok")
    assert script.compare_sides(cells, ok, ok) == []
    problems = script.compare_sides(cells, ok, {"m/xnnpack/fp32": "ImportError: cannot import name 'x'"})
    assert problems == [
        "m/xnnpack/fp32: naive side: ImportError: cannot import name 'x'",
        "m/portable/fp32: naive side: not built",
    ]
    assert script.compare_sides([], {}, {}) == ["the matrix has no cell to build"]


def test_noop_run_times_a_built_project_against_bare_doit(built_linreg, tmp_path):
    project = copy_project(built_linreg, tmp_path / "proj")
    run = _run("noop_run", "--project", str(project.root), "--repeats", "2", "--max-seconds", "0", "--max-ratio", "0")
    assert run.returncode == 0, run.stdout + run.stderr
    assert "tasks up to date on both sides, 0 started" in run.stdout and "etforge / bare doit: " in run.stdout


def test_noop_run_refuses_a_run_that_does_work(built_linreg, tmp_path):
    project = copy_project(built_linreg, tmp_path / "proj")
    project.write_pipeline(project.pipeline.read_text() + "thresholds:\n  fp32: {sqnr_db: 59}\n")
    run = _run("noop_run", "--project", str(project.root), "--repeats", "1")
    assert run.returncode == 1 and "etforge / bare doit" not in run.stdout, run.stdout + run.stderr
    assert "is not a no-op: it started" in run.stderr and "validate:linreg/" in run.stderr


@pytest.mark.slow
def test_llm_side_by_side_checks_both_sides_programs_load_before_its_ratios(tmp_path):
    run = _run("llm_side_by_side", "--tiny", "--fallback", "--work", str(tmp_path / "work"), timeout=1800)
    assert "etforge no-op (both cells up to date)" in run.stdout, run.stdout[-3000:] + run.stderr[-3000:]
    if run.returncode == 0:
        assert "both sides built 8da4w and fp32; the 4 programs load in the ExecuTorch runtime" in run.stdout
        assert "ratios etforge / upstream: " in run.stdout
    else:  # measured 2026-11-25: the in-venv upstream 8da4w export of the tiny Llama fails
        # ("Missing out variants: {'torchao::dequantize_affine'}"): named, and no ratio printed
        assert run.returncode == 1 and "ratios etforge / upstream" not in run.stdout
        assert "no ratio printed: the two sides are not comparable" in run.stderr
        assert "upstream 8da4w: no program was written" in run.stderr, run.stderr[-3000:]
