"""Quantize a captured model once per (model, quantizer config); every cell using it lowers from it.

``pt2e``: prepare the captured graph with the backend's quantizer, calibrate,
convert, re-export. ``torchao``: ``quantize_`` the eager module with a torchao
config, then export. ``dtype``: cast the module and its inputs (fp16).
"""

from __future__ import annotations

import time
from pathlib import Path

from tasks.engine.cached_run import BuildResult

PROGRAM = "model.pt2"


def build_quantized(cell, root: Path, seed: int, capture_program: Path, reference: Path,
                    workdir: Path) -> BuildResult:
    import torch

    from tasks.build.samples import calibration_batches
    from tasks.build.capture import load_reference
    from tasks.build.model_loading import build_model
    from tasks.core.dotted_path import load_callable

    transform = cell.transform
    start = time.monotonic()
    inputs = tuple(torch.from_numpy(x) for x in load_reference(reference)[0])
    info = {"method": transform.method, "quantizer": transform.ref}
    if transform.method == "pt2e":
        from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

        # check_guards=False: the Arm quantizer's passes fail on the guard nodes.
        graph = torch.export.load(capture_program).module(check_guards=False)
        factory = load_callable(transform.ref)
        prepared = prepare_pt2e(graph, factory(dict(transform.options)))
        batches, source = calibration_batches(cell.model, root, seed)
        with torch.no_grad():
            for batch in batches:
                prepared(*(torch.from_numpy(x) for x in batch))
        # OpenVINO wants float weights followed by quantize/dequantize (no folding).
        model = convert_pt2e(prepared, fold_quantize=getattr(factory, "fold_quantize", True))
        info.update(calibration=source, calibration_samples=len(batches))
    elif transform.method == "torchao":
        from torchao.quantization import quantize_

        model = build_model(cell.model, root)
        quantize_(model, load_callable(transform.ref)(dict(transform.options)))
    elif transform.method == "dtype":
        dtype = getattr(torch, transform.ref)
        model = build_model(cell.model, root).to(dtype)
        inputs = tuple(x.to(dtype) if x.is_floating_point() else x for x in inputs)
    else:
        raise ValueError(f"unknown quantization method {transform.method!r}")
    program = torch.export.export(model, inputs, strict=False)
    torch.export.save(program, workdir / PROGRAM)
    info["quantize_s"] = round(time.monotonic() - start, 3)
    return BuildResult(files={PROGRAM: workdir / PROGRAM}, info=info)
