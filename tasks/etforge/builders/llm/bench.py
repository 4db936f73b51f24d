"""The LLM figures of the benchmark stage: load, prefill, decode, time to first token, peak RSS.

For a decoder-only LLM cell (ModelKind.LLM), etforge.builders.llm.stages has
etforge.builders.bench.benchmark run :func:`measure` before its generic timing: the result
becomes bench.json's ``llm`` section, and :func:`llm_figures` the BenchmarkResult's ``llm``. What is measured (as ExecuTorch's LLM runner
does, research/issue13 NOTES.md section 6, but with ``perf_counter_ns`` instead of its
millisecond clock):

    load_ms          load_program + load_method("forward"), the program loaded afresh
    prefill          one execute of the whole prompt [1, prompt_len] (token by token for a
                     program exported with static shapes): prefill_tok_s = prompt_len / time
    ttft_ms          prefill plus picking the first token (argmax of the last logits)
    decode           N greedy KV-cache steps, each one execute of [1, 1]: decode_tok_s =
                     N / their total time, and the p50 of one step
    first_*          the same of the very first generation after loading (cold caches)

The prompt is the capture's (the validation prompt). After one cold generation, whole
generations repeat up to ``iterations`` times within ``max_seconds`` (the benchmark options);
the figures are medians over them. Timings are reported, never gated.

Peak RSS is about the program, not the worker: the kernel's high-water mark (VmHWM) is reset
to the current RSS through /proc/self/clear_refs just before loading, so VmHWM after the runs
is the process's peak while the program loaded and ran, and ``peak_rss_delta_bytes`` is that
peak minus the RSS before loading (what loading and running the program added). Where the
reset is refused (not Linux, a restricted /proc) the peak is the largest VmRSS sampled after
loading, after each prefill and after each generation, and ``rss_method`` says so. The
benchmark stage measures an LLM before loading any other copy of the program; memory that
earlier work of the same process freed can still be reused by the allocator, so the delta is
a lower bound of the program's footprint and ``peak_rss_bytes`` an upper bound.
"""

from __future__ import annotations

import gc
import statistics
import time
from functools import partial
from pathlib import Path

from etforge.builders.runtime.proc_status import proc_status_bytes

DECODE_STEPS = 32  # KV-cache steps per generation (fewer when the context is shorter)
NS_PER_MS = 1e6


def _reset_peak() -> bool:
    """Reset VmHWM to the current RSS (Linux >= 4.0); False when refused."""
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as f:
            f.write("5")
        return True
    except OSError:
        return False


def decode_steps(llm: dict) -> int:
    return max(1, min(DECODE_STEPS, llm["max_context_len"] - llm["prompt_len"]))


def _generate(method, prompt, steps: int, dynamic: bool, samples: list) -> dict:
    """One greedy generation; only ``method.execute`` sits between the clock reads of a step."""
    import torch

    clock = time.perf_counter_ns
    length = prompt.shape[1]
    start = clock()
    if dynamic:
        logits = method.execute([prompt, torch.arange(length)])[0]
    else:  # a static program takes one token per call
        for i in range(length):
            logits = method.execute([prompt[:, i : i + 1].contiguous(), torch.tensor([i])])[0]
    prefill = clock()
    token = int(logits[0, -1].argmax())
    first_token = clock()
    samples.append(proc_status_bytes("VmRSS").get("VmRSS", 0))
    step_ns = []
    for i in range(steps):
        ids, pos = torch.tensor([[token]], dtype=torch.long), torch.tensor([length + i], dtype=torch.long)
        t0 = clock()
        out = method.execute([ids, pos])
        t1 = clock()
        step_ns.append(t1 - t0)
        token = int(out[0][0, -1].argmax())
    samples.append(proc_status_bytes("VmRSS").get("VmRSS", 0))
    return {"prefill_ns": prefill - start, "ttft_ns": first_token - start, "step_ns": step_ns}


def measure(pte: Path, prompt, llm: dict, opts: dict) -> dict:
    """The ``llm`` section of bench.json for the program ``pte`` (see the module docstring).

    ``prompt``: the capture's prompt ids [1, prompt_len] (int64); ``llm``: the model's ``llm:``
    options (max_context_len, prompt_len, dynamic_shapes); ``opts``: the resolved benchmark options.
    """
    from etforge.builders.llm.export import register_custom_ops
    from etforge.builders.runtime.determinism import runtime

    register_custom_ops()
    steps, dynamic = decode_steps(llm), llm["dynamic_shapes"]
    length = int(prompt.shape[1])
    gc.collect()
    before = proc_status_bytes("VmRSS").get("VmRSS")
    reset = _reset_peak()
    t0 = time.perf_counter_ns()
    program = runtime().load_program(str(pte))
    method = program.load_method("forward")
    t1 = time.perf_counter_ns()
    samples = [proc_status_bytes("VmRSS").get("VmRSS", 0)]
    try:
        first, runs = timed_generations(partial(_generate, method, prompt, steps, dynamic, samples), opts)
    finally:
        del method, program
    hwm = proc_status_bytes("VmHWM").get("VmHWM") if reset else None
    return generation_section(
        runs,
        first,
        length,
        steps,
        dynamic,
        load_ns=t1 - t0,
        memory=(before, hwm, samples, "after loading, each prefill and each generation"),
        timer="time.perf_counter_ns around method.execute (prefill, each decode step); ttft adds the argmax",
    )


def timed_generations(generate, opts: dict) -> tuple[dict, list]:
    """(the first generation, then up to ``opts["iterations"]`` more within ``opts["max_seconds"]``),
    each ``generate()``'s timings, with the garbage collector off so that no pause lands in one."""
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        first = generate()
        runs: list = []
        deadline = time.perf_counter_ns() + int(opts["max_seconds"] * 1e9) if opts["max_seconds"] else None
        while len(runs) < opts["iterations"]:
            runs.append(generate())
            if deadline is not None and time.perf_counter_ns() > deadline:
                break
    finally:
        if gc_was_enabled:
            gc.enable()
    return first, runs


def generation_section(
    runs: list, first: dict, length: int, steps: int, dynamic: bool, load_ns: int, memory: tuple, timer: str
) -> dict:
    """bench.json's ``llm`` section from timed generations (each: ``prefill_ns``, ``ttft_ns``, ``step_ns``):
    medians over ``runs``, the very ``first`` generation apart; ``memory``: (RSS before loading, VmHWM
    after the runs or None, RSS samples, when they were sampled). LLMs and encoder-decoders alike."""
    before, hwm, samples, sampled = memory
    rss_method = (
        "VmHWM after the runs, reset through /proc/self/clear_refs just before loading"
        if hwm is not None
        else f"largest VmRSS sampled {sampled}"
    )
    # the kernel's RSS counters lag by a few pages per thread: a sample may read above VmHWM
    peak = max([hwm or 0, *samples]) or None
    prefill_ms = statistics.median(r["prefill_ns"] for r in runs) / NS_PER_MS
    decode_ms = statistics.median(sum(r["step_ns"]) for r in runs) / NS_PER_MS
    steps_ms = sorted(s / NS_PER_MS for r in runs for s in r["step_ns"])
    return {
        "prompt_len": length,
        "decode_steps": steps,
        "dynamic_shapes": dynamic,
        "generations": len(runs),
        "load_ms": _r(load_ns / NS_PER_MS),
        "prefill_ms": _r(prefill_ms),
        "prefill_tok_s": _r(length / (prefill_ms / 1e3)),
        "ttft_ms": _r(statistics.median(r["ttft_ns"] for r in runs) / NS_PER_MS),
        "decode_ms": _r(decode_ms),
        "decode_tok_s": _r(steps / (decode_ms / 1e3)),
        "decode_step_ms": {"p50": _r(statistics.median(steps_ms)), "min": _r(steps_ms[0]), "max": _r(steps_ms[-1])},
        "first_generation": {
            "ttft_ms": _r(first["ttft_ns"] / NS_PER_MS),
            "prefill_tok_s": _r(length / (first["prefill_ns"] / 1e9)),
            "decode_tok_s": _r(steps / (sum(first["step_ns"]) / 1e9)),
        },
        "memory": {
            "rss_before_load_bytes": before,
            "peak_rss_bytes": peak,
            "peak_rss_delta_bytes": peak - before if peak is not None and before is not None else None,
            "rss_after_load_bytes": samples[0] or None,
            "rss_method": rss_method,
        },
        "timer": timer,
    }


def _r(value: float) -> float:
    return round(value, 4)


def llm_figures(section: dict) -> dict:
    """The figures of bench.json's ``llm`` section a BenchmarkResult carries (the report reads them)."""
    memory = section["memory"]

    def mb(n):
        return None if n is None else round(n / (1 << 20), 2)

    return {
        "load_ms": section["load_ms"],
        "prompt_len": section["prompt_len"],
        "prefill_tok_s": section["prefill_tok_s"],
        "ttft_ms": section["ttft_ms"],
        "decode_steps": section["decode_steps"],
        "decode_tok_s": section["decode_tok_s"],
        "decode_step_p50_ms": section["decode_step_ms"]["p50"],
        "peak_rss_mb": mb(memory["peak_rss_bytes"]),
        "peak_rss_delta_mb": mb(memory["peak_rss_delta_bytes"]),
    }
