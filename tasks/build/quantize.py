"""Quantize a captured model once per (model, quantizer config); every cell using it lowers from it.

The two flows live here, once each (tasks/build/quantizers.py only makes the
quantizers and configs the recipes name):

``pt2e``: prepare the captured graph with the backend's quantizer, calibrate,
convert, re-export (:func:`pt2e_quantize`). ``torchao``: ``quantize_`` the eager
module with a torchao config and unwrap its tensor subclasses, then export
(:func:`torchao_quantize`; unwrapping leaves XNNPACK 8da4w and Core ML
weight-only programs byte-identical and makes a config XNNPACK cannot run fail
to lower instead of computing garbage). ``dtype``: cast the module and its
inputs (fp16).
"""

from __future__ import annotations

import time
from pathlib import Path

from tasks.build.reference import REFERENCE
from tasks.store.results import BuildRequest, BuildResult

PROGRAM = "model.pt2"


def pt2e_quantize(program, example_inputs: tuple, quantizer, calibration, fold_quantize: bool = True):
    """Prepare, calibrate (``calibration``: input tuples of tensors) and convert; returns the converted
    GraphModule, to be exported again. ``program``: the captured ExportedProgram, or an nn.Module that
    is exported here on ``example_inputs``. ``fold_quantize``: ``getattr(factory, "fold_quantize", True)``."""
    import torch
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    if not isinstance(program, torch.export.ExportedProgram):
        program = torch.export.export(program, example_inputs)
    # check_guards=False: the Arm quantizer's passes (DecomposeAdaptiveAvgPool2dPass) fail on guard nodes.
    prepared = prepare_pt2e(program.module(check_guards=False), quantizer)
    with torch.no_grad():
        for batch in calibration:
            prepared(*batch)
    return convert_pt2e(prepared, fold_quantize=fold_quantize)


def torchao_quantize(model, config, filter_fn=None):
    """Quantize ``model`` in place with a torchao config and unwrap the tensor subclasses so
    ``torch.export`` sees plain ops."""
    from torchao.quantization import quantize_
    from torchao.utils import unwrap_tensor_subclass

    quantize_(model, config, filter_fn)
    unwrap_tensor_subclass(model)
    return model


def quantize_stage(request: BuildRequest) -> BuildResult:
    """The quantize stage's builder (tasks/store/stages.py)."""
    capture = request.upstream["capture"]
    from tasks.config.hf_source import is_llm

    if is_llm(request.subject.model):  # torchao on the eager model, then the static-KV-cache export
        from tasks.build.llm_quantize import build_llm_quantized

        return build_llm_quantized(request.subject, request.plan.root, request.workdir, torchao_quantize)
    return build_quantized(request.subject, request.plan.root, request.plan.seed, capture.files[PROGRAM],
                           capture.files[REFERENCE], request.workdir)


def build_quantized(cell, root: Path, seed: int, capture_program: Path, reference: Path,
                    workdir: Path) -> BuildResult:
    import torch

    from tasks.build.model_loading import build_model
    from tasks.build.reference import load_reference
    from tasks.build.samples import calibration_batches
    from tasks.core.dotted_path import load_callable

    transform = cell.transform
    start = time.monotonic()
    inputs = tuple(torch.from_numpy(x) for x in load_reference(reference)[0])
    info = {"method": transform.method, "quantizer": transform.ref}
    if transform.method == "pt2e":
        factory = load_callable(transform.ref)
        batches, source = calibration_batches(cell.model, root, seed)
        # OpenVINO wants float weights followed by quantize/dequantize (no folding).
        model = pt2e_quantize(torch.export.load(capture_program), inputs, factory(dict(transform.options)),
                              (tuple(torch.from_numpy(x) for x in batch) for batch in batches),
                              fold_quantize=getattr(factory, "fold_quantize", True))
        info.update(calibration=source, calibration_samples=len(batches))
    elif transform.method == "torchao":
        model = torchao_quantize(build_model(cell.model, root), load_callable(transform.ref)(dict(transform.options)))
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
