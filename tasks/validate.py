"""Run a cell's .pte in the ExecuTorch runtime and compare with eager PyTorch."""

from __future__ import annotations

import json
from pathlib import Path

from tasks.runner import BuildResult

NUMERICS = "numerics.json"


def run_program(pte: Path, inputs: list) -> list:
    import executorch.kernels.quantized  # noqa: F401  (quantized out-variants a program may call)
    import torch
    from executorch.runtime import Runtime

    program = Runtime.get().load_program(pte.read_bytes())
    method = program.load_method("forward")  # keep `program` alive while the method runs
    outputs = method.execute([torch.from_numpy(x).contiguous() for x in inputs])
    return [o.detach().numpy() if isinstance(o, torch.Tensor) else o for o in outputs]


def build_validate(cell, pte: Path, reference: Path, input_dtypes: list, workdir: Path) -> BuildResult:
    from tasks.capture import load_reference
    from tasks.numerics import compare, verdict

    inputs, expected = load_reference(reference)
    # An fp16 program takes fp16 inputs; outputs are compared in float64 either way.
    inputs = [x.astype(dtype) if dtype and x.dtype.kind == "f" else x
              for x, dtype in zip(inputs, input_dtypes or [None] * len(inputs))]
    actual = run_program(pte, inputs)
    if len(actual) != len(expected):
        raise ValueError(f"program returned {len(actual)} outputs, eager returned {len(expected)}")
    metrics = [compare(e, a) for e, a in zip(expected, actual)]
    misses = verdict(metrics, cell.thresholds)
    sqnrs = [m["sqnr_db"] for m in metrics if m["sqnr_db"] is not None]
    report = {
        "cell": cell.canonical(),
        "inputs": "random (seeded)",
        "thresholds": cell.thresholds,
        "outputs": metrics,
        "passed": not misses,
        "misses": misses,
    }
    out = workdir / NUMERICS
    out.write_text(json.dumps(report, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    info = {"sqnr_db": min(sqnrs) if sqnrs else None,
            "max_abs_error": max(m["max_abs_error"] for m in metrics),
            "cosine": min(m["cosine"] for m in metrics), "passed": not misses}
    if misses:
        return BuildResult(files={NUMERICS: out}, info=info, status="failed", reason="; ".join(misses))
    return BuildResult(files={NUMERICS: out}, info=info)
