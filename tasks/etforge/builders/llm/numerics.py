"""Numerics of an LLM program: prefill, KV-cache decode steps and greedy continuation vs eager.

The capture's reference (etforge.builders.llm.export) holds a seeded prompt of P ids, eager
PyTorch's greedy continuation g[0..N-1] and eager logits (no cache) for positions
0..P+N-2. The program is run twice:

- teacher-forced: prefill the prompt in one call (token by token for a static program),
  then N-1 decode steps each fed the *eager* token g[i-1], so every step is compared at the
  same context: ``prefill_sqnr_db`` (all P positions), ``step_sqnr_db`` (the logits that
  predict g[i]; step 0 is the prefill's last position), ``top1_agreement`` (steps whose
  argmax is g[i]);
- free-running greedy from the same prompt: ``greedy_agreement``, the tokens equal to g
  before the first divergence, over N.

A quantized (or cast) cell is also compared with the eager model after the same quantization
(its quantize stage stores those logits, ``same_scheme_logits.npy``, at the same positions): the
teacher-forced steps' ``same_scheme.sqnr_db`` (worst step) and ``same_scheme.top1_agreement``
(steps whose argmax is the quantized eager model's). That isolates the lowering's error from
the quantization's, which on a small random model is large and size-dependent (8da4w on the
tiny Llama: ~15 dB vs fp32 eager, ~40 dB vs the same-scheme eager model).

Gates: ``sqnr_db`` bounds the worst of prefill and every step; ``top1_agreement`` and
``greedy_agreement`` are fractions; ``same_scheme_sqnr_db`` and ``same_scheme_top1_agreement``
bound the same-scheme comparison (a quantized cell's verdict rests on them; the fp32-eager SQNR
stays reported and loosely bounded). A scheme's LLM defaults (:data:`LLM_THRESHOLDS`) apply
where pipeline.yaml and the recipe set none. Every comparison fails on NaN.
"""

from __future__ import annotations

import json
from pathlib import Path

from etforge.checks.numerics import Generation, Numerics
from etforge.config.llm_tokens import token_source
from etforge.pipeline.results import BuildResult, TaskStatus
from etforge.pipeline.stage_results import Verdict

NUMERICS = "numerics.json"
# What an LLM cell must also reach, by scheme, unless its thresholds say otherwise: an fp32
# program agrees token for token (measured 130 dB, 8/8 on the tiny Llama).
# 4-bit linears on a tiny random model (hidden 64) lose a lot against fp32 eager: top-1 6/8 (8da4w
# g32) and 7/8 (+ e4w g32) on the test prompt, and the greedy continuation diverges at its first
# token, so greedy agreement is reported, not gated, for them; the top-1 bound keeps a collapse
# (constant or garbage tokens) from passing.
# The same-scheme bounds (NOTES.md section 4: 8da4w program vs its eager model 38.7-42.6 dB, top-1
# 8/8; 8da8w 132 dB; fp16 bit-equal) catch a lowering that breaks, whatever the quantization costs.
_SAME_SCHEME = {"same_scheme_sqnr_db": 25, "same_scheme_top1_agreement": 0.75}
LLM_THRESHOLDS = {
    "fp32": {"top1_agreement": 1.0, "greedy_agreement": 1.0},
    "fp16": {"top1_agreement": 1.0, **_SAME_SCHEME},
    "bf16": {"top1_agreement": 0.75, **_SAME_SCHEME},
    "8da4w": {"top1_agreement": 0.625, **_SAME_SCHEME},
    "8da8w": {"top1_agreement": 0.75, **_SAME_SCHEME},
}
GATES = (
    ("sqnr_db", "worst SQNR", " dB"),
    ("top1_agreement", "top-1 agreement", ""),
    ("greedy_agreement", "greedy agreement", ""),
    ("same_scheme_sqnr_db", "worst SQNR vs the same-scheme eager model", " dB"),
    ("same_scheme_top1_agreement", "top-1 agreement with the same-scheme eager model", ""),
)
SAME_SCHEME = "same_scheme_logits.npy"


def llm_thresholds(cell) -> dict:
    return {**LLM_THRESHOLDS.get(cell.quant.name, {}), **cell.thresholds}


def _run(method, ids, position: int, dynamic: bool):
    """Logits [T, V] (float32) of feeding ``ids`` [1,T] at ``position``: one call, or one per token."""
    import torch

    if dynamic:
        out = method.execute([ids.contiguous(), torch.arange(position, position + ids.shape[1])])[0]
        return out.reshape(-1, out.shape[-1]).float()
    rows = []
    for t in range(ids.shape[1]):
        out = method.execute([ids[:, t : t + 1].contiguous(), torch.tensor([position + t])])[0]
        rows.append(out.reshape(-1, out.shape[-1])[-1].float())
    return torch.stack(rows)


def run_llm(method, prompt, eager_tokens: list, dynamic: bool) -> dict:
    """Teacher-forced logits per step, the prefill's logits and the program's free greedy tokens."""
    import torch

    P, N = prompt.shape[1], len(eager_tokens)
    prefill = _run(method, prompt, 0, dynamic)  # position 0 restarts the cache
    steps = [prefill[-1]]
    for i in range(1, N):
        steps.append(_run(method, torch.tensor([[eager_tokens[i - 1]]]), P + i - 1, dynamic)[-1])
    greedy = [int(_run(method, prompt, 0, dynamic)[-1].argmax())]
    for i in range(1, N):
        greedy.append(int(_run(method, torch.tensor([[greedy[-1]]]), P + i - 1, dynamic)[-1].argmax()))
    return {"prefill": prefill, "steps": torch.stack(steps), "greedy": greedy}


def compare_llm(ref_logits, eager_tokens: list, prompt_len: int, run: dict, top1_tokens: list | None = None) -> dict:
    """The program's run against eager; ``top1_tokens``: what each step's argmax must be (default
    ``eager_tokens``; a token-file window: eager's argmax at each step, as the steps are fed the file)."""
    import numpy as np

    from etforge.builders.numerics.compare import compare, nonfinite, sqnr_db

    def db(reference, actual):
        value = sqnr_db(reference, actual)
        return float("inf") if value is None else value  # identical

    P, N = prompt_len, len(eager_tokens)
    steps = run["steps"].numpy()
    step_sqnr = [db(ref_logits[P - 1 + i], steps[i]) for i in range(N)]
    prefill_sqnr = db(ref_logits[:P], run["prefill"].numpy())
    expected = eager_tokens if top1_tokens is None else top1_tokens
    top1 = [int(np.argmax(steps[i])) == expected[i] for i in range(N)]
    agree = 0
    for a, b in zip(run["greedy"], eager_tokens):
        if a != b:
            break
        agree += 1
    bad = nonfinite(np.concatenate([run["prefill"].numpy().ravel(), steps.ravel()]))
    worst = min([prefill_sqnr] + step_sqnr, key=lambda v: float("-inf") if v != v else v)
    pooled = compare(ref_logits[P - 1 : P - 1 + N], steps)  # every step's logits together
    return {
        "max_abs_error": pooled["max_abs_error"],
        "cosine": pooled["cosine"],
        "prefill_sqnr_db": prefill_sqnr,
        "step_sqnr_db": step_sqnr,
        "sqnr_db": worst,
        "top1_agreement": sum(top1) / N,
        "top1_steps": top1,
        "greedy_agreement": agree / N,
        "greedy_tokens": agree,
        "program_tokens": run["greedy"],
        "eager_tokens": list(eager_tokens),
        "decode_steps": N,
        "prompt_len": P,
        "nonfinite": bad,
    }


def llm_verdict(metrics: dict, thresholds: dict) -> list:
    """Messages for every gate missed (empty: passed); NaN and non-finite logits always miss."""
    bad = metrics["nonfinite"]
    misses = []
    if bad["nan"] or bad["inf"]:
        misses.append(
            f"logits: {bad['nan'] + bad['inf']} of {bad['values']} values are non-finite "
            f"({bad['nan']} NaN, {bad['inf']} inf)"
        )
    for key, label, unit in GATES:
        if key not in thresholds:
            continue
        value = _metric(metrics, key)
        if value is None:  # a same-scheme bound without same-scheme logits: nothing vouches for the cell
            misses.append(f"{label}: no same-scheme eager logits to compare with")
        elif not value >= thresholds[key]:  # NaN misses
            misses.append(f"{label} {value:.3g}{unit} < {thresholds[key]}{unit}")
    return misses


def _metric(metrics: dict, key: str):
    if key.startswith("same_scheme_"):
        return (metrics.get("same_scheme") or {}).get(key.removeprefix("same_scheme_"))
    return metrics[key]


def compare_same_scheme(same_logits, eager_tokens: list, prompt_len: int, run: dict) -> dict:
    """The teacher-forced steps against the quantized eager model's logits at the same positions."""
    import numpy as np

    from etforge.builders.numerics.compare import sqnr_db

    P, N = prompt_len, len(eager_tokens)
    steps = run["steps"].numpy()
    step_sqnr = []
    for i in range(N):
        value = sqnr_db(same_logits[P - 1 + i], steps[i])
        step_sqnr.append(float("inf") if value is None else value)
    top1 = [int(np.argmax(steps[i])) == int(np.argmax(same_logits[P - 1 + i])) for i in range(N)]
    if not np.isfinite(same_logits).all():  # a NaN reference must not pass as agreement
        step_sqnr = [float("nan")] * N
    return {
        "sqnr_db": min(step_sqnr, key=lambda v: float("-inf") if v != v else v),
        "step_sqnr_db": step_sqnr,
        "top1_agreement": sum(top1) / N,
        "eager_tokens": [int(np.argmax(same_logits[P - 1 + i])) for i in range(N)],
    }


def build_llm_validate(
    cell, pte: Path, reference: Path, workdir: Path, same_scheme: Path | None = None, program_sha256: str | None = None
) -> BuildResult:
    """Validate an LLM program against the capture's reference (see the module doc)."""
    import numpy as np
    import torch

    from etforge.builders.llm.export import REFERENCE_SOURCE, register_custom_ops
    from etforge.builders.llm.quality import quality_check
    from etforge.builders.runtime.determinism import deterministic
    from etforge.builders.runtime.kernel_log import kernel_failures
    from etforge.builders.runtime.program_io import load_method
    from etforge.core.digest import sha256_file

    register_custom_ops()  # the program's llama:: ops must be registered to load forward
    with np.load(reference) as data:
        prompt = torch.from_numpy(data["input_0"][0])
        tokens = [int(t) for t in data["llm_tokens"]]
        ref_logits = data["llm_logits"]
        window = [int(t) for t in data["llm_window"]] if "llm_window" in data else None
    P = prompt.shape[1]
    # the steps are fed the token file's ids when there is one (the window perplexity is judged on)
    fed = tokens if window is None else window[P:]
    dynamic = cell.model.source["transformers"]["llm"]["dynamic_shapes"]
    with deterministic(runtime=True):  # loaded, run and released on one thread: the verdict ships
        program, method = load_method(pte.read_bytes())
        with kernel_failures():  # a kernel that refuses an argument is named, not just error 0x12
            run = run_llm(method, prompt, fed, dynamic)
        del method, program
    top1_tokens = None if window is None else [int(np.argmax(ref_logits[P - 1 + i])) for i in range(len(tokens))]
    metrics = compare_llm(ref_logits, tokens, P, run, top1_tokens)
    same_logits = None if same_scheme is None else np.load(same_scheme)
    if same_logits is not None:
        metrics["same_scheme"] = compare_same_scheme(same_logits, fed, P, run)
    thresholds = llm_thresholds(cell)
    misses = llm_verdict(metrics, thresholds)
    quality = quality_check(cell, window, ref_logits, run, same_logits, thresholds)
    report = {
        "cell": cell.canonical(),
        "program_sha256": program_sha256 or sha256_file(pte),
        "inputs": REFERENCE_SOURCE if window is None else f"{token_source(cell.model.validation)} (llm)",
        "task": "text-generation",
        "thresholds": thresholds,
        "llm": metrics,
        "passed": not misses,
        "misses": misses,
        "notes": [],
    }
    if quality is not None:
        report["llm_quality"] = quality.to_json()
        report["passed"] = report["passed"] and not quality.failed
    from etforge.builders.loading.hf_models import RANDOM_WEIGHTS_NOTE, random_weights

    if random_weights(cell.model):
        report["notes"].append(RANDOM_WEIGHTS_NOTE)
    checks = () if quality is None else (quality,)
    return generative_verdict(workdir, report, ("prefill_sqnr_db",), checks=checks, inputs=report["inputs"])


def generative_verdict(workdir: Path, report: dict, own: tuple, checks: tuple = (), **extra) -> BuildResult:
    """Write ``report`` (its ``llm`` or ``seq2seq`` metrics, thresholds, misses) as numerics.json and
    return the cell's Verdict: a Numerics check with the figures every generative cell has, its
    ``own`` figures of the generation (``prefill_sqnr_db``, ``encoder_sqnr_db``) and ``extra``
    fields, then ``checks`` (an LLM's perplexity and KL). Failed when a threshold missed."""
    from etforge.builders.numerics.compare import finite_json

    metrics, misses = report.get("llm") or report["seq2seq"], report["misses"]
    out = workdir / NUMERICS
    out.write_text(json.dumps(finite_json(report), indent=2, sort_keys=True) + "\n", encoding="utf-8")
    generation = {key: metrics[key] for key in (*own, "greedy_agreement")}
    if "same_scheme" in metrics:
        generation.update(
            same_scheme_sqnr_db=metrics["same_scheme"]["sqnr_db"],
            same_scheme_top1_agreement=metrics["same_scheme"]["top1_agreement"],
        )
    check = Numerics.of(
        {
            **{key: metrics[key] for key in ("sqnr_db", "top1_agreement", "max_abs_error", "cosine")},
            "nonfinite_values": metrics["nonfinite"]["nan"] + metrics["nonfinite"]["inf"],
            "samples": 1,
            "generation": Generation.of({**generation, "decode_steps": metrics["decode_steps"]}),
            "misses": list(misses),
            "passed": not misses,
            **extra,
        }
    )
    verdict = Verdict(program_sha256=report["program_sha256"], checks=(check, *checks))
    failed = [c.reason() for c in verdict.checks if c.failed]
    if failed:
        return BuildResult(files={NUMERICS: out}, result=verdict, status=TaskStatus.FAILED, reason="; ".join(failed))
    return BuildResult(files={NUMERICS: out}, result=verdict)


def build_llm_bundled(
    cell, pte: Path, reference: Path, workdir: Path, program_sha256: str | None = None
) -> BuildResult:
    """A .bpte for an LLM this host cannot run (Core ML): its static ``forward`` ([1,1] ids at one
    position) gets one test case per prompt token, in order (test case i feeds token i at position i
    after cases 0..i-1 filled the cache; every case attends only to positions <= i), each expecting
    eager's logits at that position; tolerances as etforge.builders.numerics.bundle derives them."""
    import hashlib

    import numpy as np
    import torch
    from executorch.devtools import BundledProgram
    from executorch.devtools.bundled_program.config import MethodTestCase, MethodTestSuite
    from executorch.devtools.bundled_program.serialize import serialize_from_bundled_program_to_flatbuffer

    from etforge.builders.llm.export import REFERENCE_SOURCE
    from etforge.builders.numerics.bundle import BPTE, INFO, bundled_verdict, tolerances
    from etforge.builders.runtime.program_io import METHOD

    with np.load(reference) as data:
        prompt, logits = data["input_0"][0], data["llm_logits"]
    P = prompt.shape[1]
    expected = logits[:P]
    cases = [
        MethodTestCase(
            inputs=[torch.from_numpy(prompt[:, t : t + 1].copy()), torch.tensor([t])],
            expected_outputs=[torch.from_numpy(expected[t][None, None].copy())],
        )
        for t in range(P)
    ]
    bundle = BundledProgram(None, [MethodTestSuite(method_name=METHOD, test_cases=cases)], pte_file_path=str(pte))
    out = workdir / BPTE
    out.write_bytes(serialize_from_bundled_program_to_flatbuffer(bundle))
    thresholds = llm_thresholds(cell)
    tol = tolerances(thresholds, [expected])
    pte_bytes = Path(pte).read_bytes()
    info = {
        "method": METHOD,
        "test_cases": P,
        "ordered": True,
        "output_paths": ["logits"],
        "inputs": REFERENCE_SOURCE + ", token by token",
        "rtol": tol["rtol"],
        "atol": tol["atol"],
        "tolerance_rule": tol["rule"],
        "thresholds": thresholds,
        "not_checked_on_device": sorted(k for k in thresholds if k != "sqnr_db"),
        "delegates": list(cell.backend.delegates),
        "size_bytes": out.stat().st_size,
        "program_sha256": program_sha256 or hashlib.sha256(pte_bytes).hexdigest(),
    }
    (workdir / INFO).write_text(
        json.dumps({"cell": cell.canonical(), **info}, indent=2, sort_keys=True) + "\n", encoding="utf-8"
    )
    reason = (
        f"not runnable on this host (no {'/'.join(cell.backend.delegates) or cell.backend.name} runtime); "
        f"{BPTE} carries the {P}-token prompt as {P} ordered test cases, check on device with "
        f"rtol={tol['rtol']:g}, atol={tol['atol']:.3g}"
    )
    return BuildResult(
        files={BPTE: out, INFO: workdir / INFO},
        result=bundled_verdict(info),
        status=TaskStatus.NOT_RUNNABLE,
        reason=reason,
    )
