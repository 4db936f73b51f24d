"""Time a cell's .pte in the ExecuTorch runtime on this host, and compare with a baseline.

``build_benchmark`` loads the program (timed: ``load_program`` + ``load_method``),
runs ``warmup`` untimed iterations, then up to ``iterations`` timed ones, each
timed with ``time.perf_counter_ns`` around ``method.execute`` and nothing else,
and writes ``bench.json``. A time budget (``max_seconds``) stops a slow
(portable, large) program early; the record says how many iterations ran.

Options (``pipeline.yaml`` ``benchmark:`` section, all optional):

    warmup       5      untimed iterations first (capped at a quarter of the budget)
    iterations   50     timed iterations
    threads      null   runtime threadpool size; null keeps the runtime's default
    max_seconds  10     wall-clock budget for warm-up plus timed iterations; null: none
    method       forward

(the defaults are etforge.config.defaults BENCHMARK, the same for a pipeline and a direct call)

Comparing results with a baseline is publishing, not measuring: it lives in
etforge.publish.baseline, so editing it never invalidates a benchmark.

torch and executorch are imported only inside the functions that run programs.
"""

from __future__ import annotations

import contextlib
import gc
import json
import math
import os
import resource
import sys
import time
from pathlib import Path

from etforge.builders.bench.profile import ETDUMP, ETRECORD, record_profile
from etforge.builders.capture.reference import REFERENCE
from etforge.builders.runtime.proc_status import proc_status_bytes
from etforge.builders.runtime.timing_stats import NS_PER_MS, summarize
from etforge.config import defaults
from etforge.core.errors import BadValue
from etforge.pipeline.results import BuildRequest, BuildResult
from etforge.pipeline.stage_results import BenchmarkResult, ExportResult

BENCH = "bench.json"
FORMAT = "etforge-bench/1"
DEFAULTS = defaults.BENCHMARK
WARMUP_BUDGET_SHARE = 0.25  # warm-up may use at most this share of max_seconds
MEMORY_NOTE = (
    "process_peak_rss_bytes is the peak of the whole process (ru_maxrss: imports, "
    "earlier tasks, this benchmark); load_rss_delta_bytes and run_rss_delta_bytes are "
    "VmRSS differences across loading and across the runs; peak_set_by_benchmark says "
    "whether the process peak (VmHWM) rose while this benchmark ran"
)


# ---------------------------------------------------------------- options


def resolve_options(options: dict | None) -> dict:
    """``options`` over DEFAULTS, checked; a ValueError names the bad option."""
    options = dict(options or {})
    unknown = sorted(set(options) - set(DEFAULTS))
    if unknown:
        raise BadValue(f"unknown benchmark option(s) {', '.join(unknown)}; known: {', '.join(DEFAULTS)}")
    out = {**DEFAULTS, **options}

    def integer(name: str, minimum: int) -> None:
        value = out[name]
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise BadValue(f"benchmark option {name}: expected an integer >= {minimum}, got {value!r}")

    integer("warmup", 0)
    integer("iterations", 1)
    if out["threads"] is not None:
        integer("threads", 1)
    budget = out["max_seconds"]
    if budget is not None and (
        isinstance(budget, bool) or not isinstance(budget, (int, float)) or not budget > 0 or not math.isfinite(budget)
    ):
        raise BadValue(f"benchmark option max_seconds: expected a positive number or null, got {budget!r}")
    if not isinstance(out["method"], str) or not out["method"]:
        raise BadValue(f"benchmark option method: expected a method name, got {out['method']!r}")
    return out


# ---------------------------------------------------------------- statistics


def process_peak_rss_bytes() -> int:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024  # bytes on macOS, KiB on Linux


def _portable_lib():
    from executorch.extension.pybindings import portable_lib

    return portable_lib


def current_thread_count() -> int | None:
    getter = getattr(_portable_lib(), "_threadpool_get_thread_count", None)
    return int(getter()) if getter else None


@contextlib.contextmanager
def threadpool(threads: int | None):
    """Run with ``threads`` runtime threads (None: as is); yields the count in use.

    The old size is restored on exit. Resetting the pool while a loaded XNNPACK
    method still holds it is unsafe, so load and release programs inside.
    """
    before = current_thread_count()
    if threads is None or threads == before:
        yield before
        return
    _portable_lib()._unsafe_reset_threadpool(threads)
    try:
        yield current_thread_count() if before is not None else threads
    finally:
        if before is not None:
            _portable_lib()._unsafe_reset_threadpool(before)


def prepare_inputs(reference: Path, input_dtypes: list | None) -> list:
    """The capture's first validation sample as the program takes it (etforge.builders.runtime.program_io cast_inputs)."""
    from etforge.builders.capture.reference import load_reference
    from etforge.builders.runtime.program_io import cast_inputs

    inputs, _ = load_reference(reference)  # the first sample, shaped as the program's inputs
    return cast_inputs(inputs, input_dtypes)


def sizes_inputs(reference: Path, input_dtypes: list | None) -> list:
    """One sample per distinct input shape of a ragged reference (a model with dynamic dims: one per
    measured size, or per shape of its validation data), as the program takes it; [] for a
    fixed-shape model (its first sample is the benchmark's input)."""
    from etforge.builders.capture.reference import load_reference_samples
    from etforge.builders.runtime.program_io import cast_inputs

    ref = load_reference_samples(reference)
    if not ref.ragged:
        return []
    per_shape: dict = {}  # a validation file's samples share a shape: time it once, not per sample
    for n in range(ref.count):
        inputs = ref.sample_inputs(n)
        per_shape.setdefault(tuple(tuple(x.shape) for x in inputs), inputs)
    return [cast_inputs(inputs, input_dtypes) for inputs in per_shape.values()]


def time_sizes(method, per_size: list, opts: dict) -> list:
    """Latency at each measured size of a dynamic model: ``[{"input_shapes", "latency_ms"}]``."""
    out = []
    for inputs in per_size:
        timing = time_execute(method, inputs, opts["warmup"], opts["iterations"], opts["max_seconds"])
        out.append(
            {
                "input_shapes": [list(x.shape) for x in inputs],
                "iterations": len(timing["samples_ns"]),
                "latency_ms": {k: _ms(v) for k, v in summarize(timing["samples_ns"]).items()},
            }
        )
    return out


def time_methods(program, reference: Path, methods: list, opts: dict) -> dict:
    """method -> {"inputs", "latency_ms"} for each further method of a multi-method program, on its
    first reference sample."""
    from etforge.builders.capture.reference import load_reference_samples
    from etforge.builders.runtime.program_io import cast_inputs

    out = {}
    for name in methods:
        inputs = cast_inputs(load_reference_samples(reference, name).sample_inputs(0), None)
        method = program.load_method(name)
        timing = time_execute(method, inputs, opts["warmup"], opts["iterations"], opts["max_seconds"])
        out[name] = {
            "inputs": [list(x.shape) for x in inputs],
            "iterations": len(timing["samples_ns"]),
            "latency_ms": {k: _ms(v) for k, v in summarize(timing["samples_ns"]).items()},
        }
        del method
    return out


def time_execute(method, inputs: list, warmup: int, iterations: int, max_seconds: float | None) -> dict:
    """Warm up, then time ``iterations`` calls of ``method.execute(inputs)``.

    Only ``method.execute`` sits between the two clock reads. At least one
    warm-up (when asked for) and one timed iteration always run, whatever the budget.
    """
    clock = time.perf_counter_ns
    execute = method.execute
    # Collect before warming up (a full collection over a large heap evicts the caches
    # the warm-up then refills), and keep the collector off until the timed loop ends,
    # as timeit does.
    gc.collect()
    gc_was_enabled = gc.isenabled()
    gc.disable()
    start = clock()
    deadline = start + int(max_seconds * 1e9) if max_seconds else None
    warmup_deadline = start + int(max_seconds * 1e9 * WARMUP_BUDGET_SHARE) if max_seconds else None
    first_ns = None
    warmup_done = 0
    samples = []
    try:
        for _ in range(warmup):
            t0 = clock()
            execute(inputs)
            t1 = clock()
            first_ns = t1 - t0 if first_ns is None else first_ns
            warmup_done += 1
            if warmup_deadline is not None and t1 > warmup_deadline:
                break
        for _ in range(iterations):
            t0 = clock()
            execute(inputs)
            t1 = clock()
            samples.append(t1 - t0)
            if deadline is not None and t1 > deadline:
                break
    finally:
        if gc_was_enabled:
            gc.enable()
    if first_ns is None:
        first_ns = samples[0]
    return {
        "samples_ns": samples,
        "warmup_done": warmup_done,
        "first_run_ns": first_ns,
        "wall_s": (clock() - start) / 1e9,
    }


def _loadavg() -> list | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except (AttributeError, OSError):
        return None


def _cell_record(cell, pte: Path) -> dict:
    if cell is None:
        return {"name": pte.stem}
    if isinstance(cell, str):
        return {"name": cell}
    return {"name": cell.name, **cell.canonical()}


def _ms(value: float) -> float:
    return round(value, 4)


def _mb(n: int | None) -> float | None:
    return None if n is None else round(n / (1 << 20), 2)


# ---------------------------------------------------------------- the builder


def benchmark_stage(request: BuildRequest, llm_timing=None) -> BuildResult:
    """The benchmark stage's builder for a module, with the plan's options (every default filled in).
    An LLM's and an encoder-decoder's stages (etforge.builders.llm.stages, seq2seq_stages) call it with
    their ``llm_timing`` (build_benchmark)."""
    export, capture = request.upstream["export"], request.upstream["capture"]
    return build_benchmark(
        request.cell,
        export.files["program.pte"],
        capture.files[REFERENCE],
        list(export.result(ExportResult).input_dtypes),
        request.plan.benchmark.options,
        request.workdir,
        llm_timing=llm_timing,
        program_sha256=export.sha256.get("program.pte"),  # as the store verified it
        etrecord=export.files.get(ETRECORD),
    )


def build_benchmark(
    cell,
    pte: Path,
    reference: Path,
    input_dtypes: list,
    options: dict,
    workdir: Path,
    llm_timing=None,
    program_sha256: str | None = None,
    etrecord: Path | None = None,
) -> BuildResult:
    """Benchmark ``pte`` on the capture's example inputs; writes ``workdir/bench.json``.

    ``llm_timing(pte, inputs, opts) -> dict``: bench.json's ``llm`` section (an LLM's generation
    figures, etforge.builders.llm.bench), measured first, before this process loads another copy.

    ``cell``: a plan Cell (or a plain name, or None); ``reference``: the capture's
    reference.npz; ``input_dtypes``: from the export info (fp16 programs take fp16);
    ``options``: see DEFAULTS; ``etrecord``: the export's, for the per-operator profile (etforge.builders.bench.profile,
    run after the timed loop). Returns BuildResult(files={"bench.json": ..., "program.etdump": ...}, info=summary).
    """
    import executorch.kernels.quantized  # noqa: F401  (quantized out-variants a program may call)

    from etforge.builders.capture.reference import reference_methods
    from etforge.builders.runtime.determinism import runtime as runtime_of_host
    from etforge.builders.runtime.program_io import checked_data_path
    from etforge.config.machine import host_info, host_label
    from etforge.core.digest import sha256_file

    pte = Path(pte)
    data = checked_data_path(pte)  # before the clock starts: it hashes the .ptd
    opts = resolve_options(options)
    methods = reference_methods(Path(reference))
    if methods != ["forward"] and opts["method"] == "forward":  # several methods: the first is the headline
        opts["method"] = methods[0]
    inputs = prepare_inputs(Path(reference), input_dtypes)
    runtime = runtime_of_host()
    default_threads = current_thread_count()
    load_before = _loadavg()
    with threadpool(opts["threads"]) as threads_used:
        # an LLM first: its program's RSS is measured before this process loads any other copy
        llm = llm_timing(pte, inputs, opts) if llm_timing is not None else None
        gc.collect()
        status0 = proc_status_bytes("VmRSS", "VmHWM")
        t0 = time.perf_counter_ns()
        program = runtime.load_program(str(pte), **({"data_path": str(data)} if data else {}))
        t1 = time.perf_counter_ns()
        method = program.load_method(opts["method"])  # `program` stays alive while `method` runs
        t2 = time.perf_counter_ns()
        status1 = proc_status_bytes("VmRSS", "VmHWM")
        try:
            timing = time_execute(method, inputs, opts["warmup"], opts["iterations"], opts["max_seconds"])
            status2 = proc_status_bytes("VmRSS", "VmHWM")
            per_size = time_sizes(method, sizes_inputs(Path(reference), input_dtypes), opts)
            per_method = time_methods(program, Path(reference), [m for m in methods if m != opts["method"]], opts)
        finally:
            del method, program  # release before the thread pool is restored
        peak = process_peak_rss_bytes()  # before the profile's copy of the program
        etdump, profile = record_profile(pte, data, opts["method"], inputs, Path(workdir), etrecord)

    samples = timing["samples_ns"]
    stats = summarize(samples)
    n = len(samples)
    stopped_early = n < opts["iterations"] or timing["warmup_done"] < opts["warmup"]
    note = (
        f"time budget of {opts['max_seconds']} s reached: {timing['warmup_done']}/{opts['warmup']} "
        f"warm-up and {n}/{opts['iterations']} timed iterations"
        if stopped_early
        else ""
    )

    def delta(after: dict, field: str = "VmRSS"):
        return after[field] - status0[field] if field in after and field in status0 else None

    memory = {
        "process_peak_rss_bytes": peak,
        "rss_before_load_bytes": status0.get("VmRSS"),
        "rss_after_load_bytes": status1.get("VmRSS"),
        "rss_after_runs_bytes": status2.get("VmRSS"),
        "load_rss_delta_bytes": delta(status1),
        "run_rss_delta_bytes": delta(status2),
        "peak_set_by_benchmark": (
            status2["VmHWM"] > status0["VmHWM"] if "VmHWM" in status0 and "VmHWM" in status2 else None
        ),
        "note": MEMORY_NOTE,
    }
    host = host_info()
    load = {
        "program_ms": _ms((t1 - t0) / NS_PER_MS),
        "method_ms": _ms((t2 - t1) / NS_PER_MS),
        "total_ms": _ms((t2 - t0) / NS_PER_MS),
    }
    record = {
        "format": FORMAT,
        "cell": _cell_record(cell, pte),
        "program": {"file": pte.name, "size_bytes": pte.stat().st_size, "sha256": program_sha256 or sha256_file(pte)},
        "inputs": [{"shape": list(x.shape), "dtype": str(x.dtype).removeprefix("torch.")} for x in inputs],
        "options": opts,
        "threads": {"requested": opts["threads"], "used": threads_used, "runtime_default": default_threads},
        "load": load,
        "warmup_iterations": timing["warmup_done"],
        "first_run_ms": _ms(timing["first_run_ns"] / NS_PER_MS),
        "iterations": n,
        "iterations_requested": opts["iterations"],
        "stopped_early": stopped_early,
        "note": note,
        "wall_s": round(timing["wall_s"], 3),
        "latency_ms": {k: _ms(v) for k, v in stats.items()},
        "samples_ms": [_ms(s / NS_PER_MS) for s in samples],
        # a model with dynamic dims: the latency at each measured size (min, interior, max);
        # the figures above are at the first (the minimum)
        "per_size": per_size,
        # a program with several methods: the others' latency (the figures above are the first's)
        "per_method": per_method,
        "memory": memory,
        # a decoder-only LLM: load, prefill, decode, time to first token, the program's peak RSS
        "llm": llm,
        # per-operator times of PROFILE_RUNS traced runs after the timed loop (never a gate)
        "profile": profile.to_json(),
        "host": host,
        "load_average": {
            "before": load_before,
            "after": _loadavg(),
            "note": "1/5/15-minute system load; above the core count, other work competed",
        },
        "timer": "time.perf_counter_ns around method.execute only; gc collected before warm-up, disabled until the timed loop ends",
    }
    out = Path(workdir) / BENCH
    out.write_text(json.dumps(record, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    figures = {}
    if llm:
        from etforge.builders.llm.bench import llm_figures

        figures = llm_figures(llm)
    result = BenchmarkResult(
        latency_p50_ms=record["latency_ms"]["p50"],
        latency_p50_ms_per_size=tuple(
            {"input_shapes": p["input_shapes"], "p50": p["latency_ms"]["p50"]} for p in per_size
        ),
        latency_p90_ms=record["latency_ms"]["p90"],
        latency_trimmed_mean_ms=record["latency_ms"]["trimmed_mean"],
        latency_min_ms=record["latency_ms"]["min"],
        latency_max_ms=record["latency_ms"]["max"],
        latency_stdev_ms=record["latency_ms"]["stdev"],
        iterations=n,
        iterations_requested=opts["iterations"],
        stopped_early=stopped_early,
        load_ms=load["total_ms"],
        peak_rss_mb=_mb(peak),
        load_rss_delta_mb=_mb(memory["load_rss_delta_bytes"]),
        threads=threads_used,
        host=host_label(host),
        host_id=host["host_id"],
        load_average_1m=(record["load_average"]["after"] or [None])[0],
        program_sha256=record["program"]["sha256"],  # the bytes timed (the result counts only for them)
        llm=figures,
        note=note or None,
        profile=profile,
    )
    return BuildResult(files={BENCH: out, ETDUMP: etdump}, result=result)
