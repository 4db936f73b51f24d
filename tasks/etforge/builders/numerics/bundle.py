"""A BundledProgram (.bpte) for a cell this host cannot run: the device checks itself.

``program.bpte`` wraps the cell's .pte with one MethodTestCase per validation
sample of the capture's reference.npz: the sample's inputs (cast to the
program's input dtypes) and eager PyTorch's outputs (cast to the program's
output dtypes). On the device, ExecuTorch's bundled-program support loads
test case ``i`` and checks every output element with
``|actual - expected| <= atol + rtol * |expected|``; in Python:
``portable_lib._load_bundled_program_from_buffer(b).verify_result_with_bundled_expected_output("forward", i, rtol, atol)``.

The .bpte format carries no tolerance, so ``bundled.json`` beside it records
the (rtol, atol) the device must pass, derived from the cell's thresholds
(one pair for every test case and output):

- ``max_abs_error: E`` given: atol = E, rtol = 0 (the same elementwise bound).
- else ``sqnr_db: S``: per output, atol = peak · 10^(-S/20), where peak is the
  largest |expected| of that output over all samples; the largest over the
  outputs is used, rtol = 0. An element error below this bound everywhere
  keeps the SQNR at or above S minus the output's crest factor
  (20·log10(peak / rms)); it is an elementwise stand-in for SQNR, not SQNR.
- neither: rtol = 1e-3, atol = 1e-5 · max(1, peak) (etforge.config.defaults BUNDLE_RTOL, BUNDLE_ATOL_PER_PEAK).

``cosine``, ``top1_agreement`` and ``top5_agreement`` have no elementwise
form; bundled.json lists them under ``not_checked_on_device`` so a device
harness that computes them can apply them to the outputs it gets.
"""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path

from etforge.builders.runtime.program_io import METHOD
from etforge.checks.numerics import OnDevice
from etforge.config.defaults import BUNDLE_ATOL_PER_PEAK, BUNDLE_RTOL
from etforge.core.errors import BadValue
from etforge.pipeline.results import BuildResult, TaskStatus
from etforge.pipeline.stage_results import Verdict

BPTE = "program.bpte"
INFO = "bundled.json"
ELEMENTWISE = ("max_abs_error", "sqnr_db")


def tolerances(thresholds: dict, expected_outputs: list) -> dict:
    """{"rtol", "atol", "rule"} from a cell's thresholds and the eager outputs ([N, ...] each)."""
    # Only finite values make a peak (capture refuses non-finite eager outputs anyway): a NaN
    # peak would make a NaN tolerance. Thresholds are finite (the schemas refuse .nan/.inf).
    # a ragged reference (dynamic dims) holds a list of differently shaped samples per output
    peaks = [
        max((_finite_peak(s) for s in y), default=0.0) if isinstance(y, list) else _finite_peak(y)
        for y in expected_outputs
    ]
    if "max_abs_error" in thresholds:
        return {"rtol": 0.0, "atol": float(thresholds["max_abs_error"]), "rule": "max_abs_error"}
    if "sqnr_db" in thresholds:
        ratio = 10.0 ** (-float(thresholds["sqnr_db"]) / 20.0)
        atol = max(peak * ratio for peak in peaks) if peaks else 0.0
        if not (atol > 0.0 and math.isfinite(atol)):  # NaN-safe
            atol = 1e-8
        return {"rtol": 0.0, "atol": atol, "rule": "sqnr_db: peak |expected| * 10^(-sqnr_db/20)"}
    return {"rtol": BUNDLE_RTOL, "atol": BUNDLE_ATOL_PER_PEAK * max([1.0] + peaks), "rule": "default"}


def _finite_peak(values) -> float:
    import numpy as np

    arr = np.abs(np.asarray(values, dtype=np.float64))
    arr = arr[np.isfinite(arr)]
    return float(np.max(arr)) if arr.size else 0.0


def build_bundled(
    cell, pte: Path, reference: Path, input_dtypes: list, workdir: Path, program_sha256: str | None = None
) -> BuildResult:
    """Write program.bpte (the .pte plus one test case per validation sample) and bundled.json.

    ``input_dtypes``: from the export info, used when the program's own cannot be read.
    Status ``not-runnable``: nothing ran here; the device runs the test cases.
    """
    from executorch.devtools import BundledProgram
    from executorch.devtools.bundled_program.serialize import serialize_from_bundled_program_to_flatbuffer

    from etforge.builders.capture.reference import reference_methods

    pte_bytes = Path(pte).read_bytes()
    suites, per_method = [], {}
    for method in reference_methods(reference):  # one test suite per method (its own samples)
        suite, per_method[method] = _method_suite(cell, method, pte_bytes, reference, input_dtypes)
        suites.append(suite)
    bundle = BundledProgram(None, suites, pte_file_path=str(pte))
    out = workdir / BPTE
    out.write_bytes(serialize_from_bundled_program_to_flatbuffer(bundle))
    first = next(iter(per_method))
    info = {
        # the first method's suite at the top (all of a one-method program); every method's under "methods"
        "method": first,
        **per_method[first],
        "thresholds": cell.thresholds,
        "not_checked_on_device": sorted(
            k
            for k in cell.thresholds
            if k not in ELEMENTWISE or (k == "sqnr_db" and "max_abs_error" in cell.thresholds)
        ),
        "delegates": list(cell.backend.delegates),
        "size_bytes": out.stat().st_size,
        # the program bundled and judged (as the store verified it, else hashed)
        "program_sha256": program_sha256 or hashlib.sha256(pte_bytes).hexdigest(),
    }
    if len(per_method) > 1:
        info["methods"] = per_method
    (workdir / INFO).write_text(
        json.dumps({"cell": cell.canonical(), **info}, indent=2, sort_keys=True) + "\n", encoding="utf-8"
    )
    cases = sum(m["test_cases"] for m in per_method.values())
    where = f" over {len(per_method)} methods" if len(per_method) > 1 else ""
    reason = (
        f"not runnable on this host (no {'/'.join(cell.backend.delegates) or cell.backend.name} runtime); "
        f"{BPTE} carries {cases} test case(s){where}, check on device with rtol={info['rtol']:g}, "
        f"atol={info['atol']:.3g}" + (" (per method: bundled.json methods)" if where else "")
    )
    return BuildResult(
        files={BPTE: out, INFO: workdir / INFO},
        result=bundled_verdict(info),
        status=TaskStatus.NOT_RUNNABLE,
        reason=reason,
    )


def _method_suite(cell, method: str, pte_bytes: bytes, reference: Path, input_dtypes: list) -> tuple:
    """(MethodTestSuite, its bundled.json facts) of one method: a test case per reference sample."""
    from executorch.devtools.bundled_program.config import MethodTestCase, MethodTestSuite

    from etforge.builders.capture.reference import load_reference_samples
    from etforge.builders.runtime.program_io import cast_inputs, program_io_dtypes

    ref = load_reference_samples(reference, method)
    try:
        in_dtypes, out_dtypes = program_io_dtypes(pte_bytes, method)
    except Exception:  # noqa: BLE001  (an unreadable header: fall back to the export info)
        in_dtypes = list(input_dtypes or []) if method == METHOD else []
        out_dtypes = []
    if len(in_dtypes) not in (0, len(ref.inputs)):
        raise BadValue(f"{method}: the program takes {len(in_dtypes)} inputs, the reference has {len(ref.inputs)}")
    if out_dtypes and len(out_dtypes) != len(ref.outputs):
        raise BadValue(f"{method}: the program returns {len(out_dtypes)} outputs, eager returned {len(ref.outputs)}")
    cases = []
    for n in range(ref.count):
        inputs = cast_inputs(ref.sample_inputs(n), in_dtypes)
        expected = [_tensor(y, _at(out_dtypes, i)) for i, y in enumerate(ref.sample_outputs(n))]
        cases.append(MethodTestCase(inputs=inputs, expected_outputs=expected))
    tol = tolerances(cell.thresholds, ref.outputs)
    facts = {
        "test_cases": ref.count,
        # expected output i of each test case is the output at this pytree path (etforge.config.io_spec)
        "output_paths": list(ref.output_names),
        "inputs": ref.source,
        "rtol": tol["rtol"],
        "atol": tol["atol"],
        "tolerance_rule": tol["rule"],
    }
    return MethodTestSuite(method_name=method, test_cases=cases), facts


def verify_bundled(bpte: Path | bytes, rtol: float, atol: float, cases: int, method: str = METHOD) -> int:
    """Run test cases 0..cases-1 of one method of a .bpte in this host's runtime (host-runnable
    programs only); raise RuntimeError on the first mismatch. ``cases``: bundled.json's ``test_cases``."""
    import executorch.kernels.quantized  # noqa: F401  (quantized out-variants a program may call)
    from executorch.extension.pybindings import portable_lib

    from etforge.builders.runtime.determinism import runtime

    runtime()  # the runtime's threadpool first, as for every program this process runs
    data = bpte if isinstance(bpte, bytes) else Path(bpte).read_bytes()
    module = portable_lib._load_bundled_program_from_buffer(data)
    for i in range(cases):
        module.verify_result_with_bundled_expected_output(method, i, rtol, atol)
    return cases


def _at(items: list, i: int):
    return items[i] if i < len(items) else None


def _tensor(array, dtype):
    """An expected output as the program returns it (any dtype: outputs are compared as given)."""
    import torch

    tensor = torch.from_numpy(array).contiguous()
    return tensor.to(dtype) if dtype is not None and tensor.dtype != dtype else tensor


def bundled_verdict(info: dict) -> Verdict:
    """bundled.json's facts as the verdict's OnDevice check (its ``methods`` are the suites of each method)."""
    fields = {k: v for k, v in info.items() if k not in ("methods", "program_sha256", "delegates", "size_bytes")}
    fields["bundle_bytes"] = info["size_bytes"]
    if "methods" in info:
        fields["method_suites"] = info["methods"]
    return Verdict(program_sha256=info["program_sha256"], checks=(OnDevice.of(fields),))
