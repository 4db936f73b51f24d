"""The text of a repro script: plain torch, torchao and ExecuTorch calls with a cell's options written out.

Only the metric is etforge's own code, written out in the script (the formula of
etforge.builders.numerics.compare ``compare``: pooled over every element of every sample, in float64,
SQNR rounded to 0.01 dB); everything else is upstream API, so the script is a bug report as it stands.
"""

from __future__ import annotations

from dataclasses import dataclass

INPUTS = "inputs.npz"  # samples (input_<i>: [N, ...]), eager outputs (output_<i>), calibration (calib_<b>_<i>)
PROGRAM = "model.pt2"  # the capture's torch.export program, as etforge lowered or quantized it
WEIGHTS = "weights.pt"  # the eager model's state_dict, for the flows that start from the nn.Module
SOURCE_DIR = "model_source"  # the model's Python source (its top-level package)
SCRIPT = "repro.py"


@dataclass(frozen=True)
class ReproScript:
    """Everything the script writes out, decided from the cell and its recorded artifacts."""

    cell: str
    flow: str  # fp32 | dtype | pt2e | torchao
    model_code: str  # how the script gets its eager nn.Module ("" for the flows that load model.pt2)
    quantizer_code: str  # the PT2E quantizer or the torchao config, as a Python expression ("" for none)
    quantized_layers: tuple  # torchao: the layers etforge quantized (its filter), by fully qualified name
    dtype: str  # the inputs' dtype in the program (float32, float16)
    partitioner: str  # "xnnpack" or "" (portable: no partitioner)
    partitioner_options: dict
    built_with: dict  # package -> the version etforge built the cell with
    thresholds: dict  # sqnr_db, cosine, max_abs_error: the cell's thresholds the script judges
    recorded: tuple  # per output: (label, etforge's SQNR in dB or None)
    runtime: str  # what judged the cell's verdict (numerics.json)


def render(spec: ReproScript) -> str:
    """The whole script."""
    return "\n".join(
        [
            _header(spec),
            _DATA,
            _model(spec),
            _graph(spec),
            _lower(spec),
            _RUN,
            _METRIC,
            _MAIN,
        ]
    )


def _header(spec: ReproScript) -> str:
    packages = ["torch", "executorch", "numpy"] + (["torchao"] if spec.flow in ("pt2e", "torchao") else [])
    return f'''#!/usr/bin/env python3
"""Standalone repro of the etforge cell {spec.cell}: rebuild its program with plain torch, torchao and
ExecuTorch calls, run it in the ExecuTorch runtime (executorch.runtime) on the validation samples in
{INPUTS}, and print the figure etforge's verdict was made of (SQNR per output against eager PyTorch).

Needs {", ".join(packages)}; not etforge. Run: python {SCRIPT}
Exit status: 0 when every output meets the thresholds, 1 when one misses (the failure reproduced).
Written by `etforge repro {spec.cell}`.
"""

import importlib.metadata
import math
import sys
from pathlib import Path

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
CELL = {spec.cell!r}
# The versions etforge built and judged the cell with; a difference is printed as a warning.
BUILT_WITH = {spec.built_with!r}
# The cell's thresholds (pipeline.yaml and its scheme's recipe), and what etforge measured (numerics.json,
# judged by {spec.runtime}).
THRESHOLDS = {spec.thresholds!r}
ETFORGE_SQNR_DB = {dict(spec.recorded)!r}
INPUT_DTYPE = torch.{spec.dtype}


def check_versions():
    for name, built in BUILT_WITH.items():
        try:
            here = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            here = "not installed"
        print(f"{{name}} {{here}} (etforge built with {{built}})")
        if here != built:
            print(f"warning: {{name}} is {{here}} here, etforge built with {{built}}: the figure may differ", file=sys.stderr)
'''


_DATA = '''
def load_data():
    """(samples: input tuples, eager: per output [N, ...] arrays, calibration: input tuples)."""
    data = np.load(HERE / "inputs.npz")
    count = int(data["samples"])
    inputs = sorted((k for k in data.files if k.startswith("input_")), key=lambda k: int(k[6:]))
    outputs = sorted((k for k in data.files if k.startswith("output_")), key=lambda k: int(k[7:]))
    samples = [tuple(torch.from_numpy(data[k][n]) for k in inputs) for n in range(count)]
    batches = sorted({k.split("_")[1] for k in data.files if k.startswith("calib_")}, key=int)
    calibration = [tuple(torch.from_numpy(data[f"calib_{b}_{i}"]) for i in range(len(inputs))) for b in batches]
    return samples, [data[k] for k in outputs], calibration
'''


def _model(spec: ReproScript) -> str:
    if not spec.model_code:
        return ""
    return f'''
def eager_model():
    """The eager model: its source, with the weights etforge built it with (state_dict in {WEIGHTS})."""
{spec.model_code}
    model.load_state_dict(torch.load(HERE / "{WEIGHTS}", map_location="cpu", weights_only=True))
    return model.eval()
'''


def _graph(spec: ReproScript) -> str:
    example = "    example = samples[len(samples) // 2]  # the sample etforge exported with\n"
    if spec.flow == "fp32":
        body = f'    return torch.export.load(HERE / "{PROGRAM}")  # the capture\'s program, lowered as is\n'
    elif spec.flow == "pt2e":
        body = (
            example + "    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (\n"
            "        XNNPACKQuantizer,\n        get_symmetric_quantization_config,\n    )\n"
            "    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e\n\n"
            f'    captured = torch.export.load(HERE / "{PROGRAM}")  # the capture\'s program\n'
            "    # etforge's quantizer is this one, except that it leaves integer scalars of add/mul alone\n"
            f"    quantizer = {spec.quantizer_code}\n"
            "    prepared = prepare_pt2e(captured.module(check_guards=False), quantizer)\n"
            "    with torch.no_grad():\n        for batch in calibration:\n            prepared(*batch)\n"
            "    converted = convert_pt2e(prepared, fold_quantize=True)\n"
            "    return torch.export.export(converted, example, strict=False)\n"
        )
    elif spec.flow == "torchao":
        body = (
            example + "    from torchao.quantization import quantize_\n"
            "    from torchao.quantization.granularity import PerAxis, PerGroup  # noqa: F401\n"
            "    from torchao.quantization.quant_api import Int8DynamicActivationIntxWeightConfig  # noqa: F401\n"
            "    from torchao.utils import unwrap_tensor_subclass\n\n"
            f"    config = {spec.quantizer_code}\n"
            f"    layers = frozenset({list(spec.quantized_layers)!r})  # the layers etforge quantized\n"
            "    model = eager_model()\n"
            "    quantize_(model, config, lambda module, fqn: fqn in layers)\n"
            "    unwrap_tensor_subclass(model)\n"
            "    return torch.export.export(model, example, strict=False)\n"
        )
    else:  # dtype
        body = (
            example + "    model = eager_model().to(INPUT_DTYPE)\n"
            "    example = tuple(x.to(INPUT_DTYPE) if x.is_floating_point() else x for x in example)\n"
            "    return torch.export.export(model, example, strict=False)\n"
        )
    return f'''
def build_graph(samples, calibration):
    """The graph etforge lowered ({spec.flow})."""
{body}'''


def _lower(spec: ReproScript) -> str:
    if spec.partitioner:
        imports = "    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner\n"
        options = ", ".join(f"{k}={v!r}" for k, v in sorted(spec.partitioner_options.items()))
        partitioners = f"[XnnpackPartitioner({options})]"
    else:
        imports, partitioners = "", "[]  # portable: no delegate, ExecuTorch's portable kernels"
    return f'''
def lower(program):
    """The .pte bytes, lowered with the backend's partitioners."""
    import executorch.kernels.quantized  # noqa: F401  (out-variants of quantize ops left outside a delegate)
    from executorch.exir import to_edge_transform_and_lower
{imports}
    partitioners = {partitioners}
    return to_edge_transform_and_lower(program, partitioner=partitioners).to_executorch().buffer
'''


_RUN = '''
def run(buffer, samples):
    """Each sample's outputs from the ExecuTorch runtime, on one runtime thread (as etforge judges)."""
    from executorch.extension.pybindings import portable_lib
    import executorch.kernels.quantized  # noqa: F401
    from executorch.runtime import Runtime

    if hasattr(portable_lib, "_unsafe_reset_threadpool"):
        portable_lib._unsafe_reset_threadpool(1)
    program = Runtime.get().load_program(buffer)
    method = program.load_method("forward")
    results = []
    for sample in samples:
        inputs = [x.to(INPUT_DTYPE) if x.is_floating_point() else x for x in sample]
        results.append([o.detach().float().numpy() if o.dtype == torch.bfloat16 else o.detach().numpy()
                        for o in method.execute(inputs)])
    return results
'''

_METRIC = '''
def metrics(reference, actual):
    """SQNR, cosine and max abs error of one output, pooled over every element of every sample.

    SQNR = 10*log10(sum(ref**2) / sum((ref - act)**2)) in float64, rounded to 0.01 dB (None: identical);
    any NaN or inf in the program's values makes every metric NaN (a miss)."""
    ref = np.asarray(reference, dtype=np.float64).ravel()
    act = np.asarray(actual, dtype=np.float64).ravel()
    if not np.all(np.isfinite(act)):
        return {"sqnr_db": math.nan, "cosine": math.nan, "max_abs_error": math.nan}
    err = ref - act
    noise, signal = float(np.dot(err, err)), float(np.dot(ref, ref))
    if noise == 0.0:
        sqnr = None
    elif signal == 0.0 or signal / noise == 0.0:
        sqnr = -math.inf
    else:
        sqnr = round(10.0 * math.log10(signal / noise), 2)
    norms = float(np.linalg.norm(ref)) * float(np.linalg.norm(act))
    cosine = float(np.dot(ref, act) / norms) if norms else float(not np.any(ref) and not np.any(act))
    return {"sqnr_db": sqnr, "cosine": round(cosine, 6), "max_abs_error": float(np.max(np.abs(err)))}


def misses(label, m):
    out = []
    for name, value in m.items():
        bound = THRESHOLDS.get(name)
        if bound is None or value is None:
            continue
        # written so that NaN misses: NaN compares false against any bound
        if (name == "max_abs_error" and not value <= bound) or (name != "max_abs_error" and not value >= bound):
            out.append(f"{label}: {name} {value} misses {bound}")
    return out
'''

_MAIN = """
def main():
    check_versions()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    samples, eager, calibration = load_data()
    buffer = lower(build_graph(samples, calibration))
    results = run(buffer, samples)
    failed = []
    for i, (label, expected) in enumerate(ETFORGE_SQNR_DB.items()):
        m = metrics(eager[i], np.stack([r[i] for r in results]))
        sqnr = "inf (identical)" if m["sqnr_db"] is None else f"{m['sqnr_db']:.2f} dB"
        print(f"{label}: SQNR {sqnr} (etforge measured {expected} dB), cosine {m['cosine']}, "
              f"max abs error {m['max_abs_error']:.3g}")
        failed += misses(label, m)
    for line in failed:
        print(f"FAIL {line}")
    print(f"{CELL}: " + ("reproduced: below threshold" if failed else "meets its thresholds"))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
"""
