"""Quantize a captured model once per (model, quantizer config); every cell using it lowers from it.

The two flows live here, once each (etforge.builders.quantization.quantizers only makes the
quantizers and configs the recipes name):

``pt2e``: prepare the captured graph with the backend's quantizer, calibrate,
convert, re-export (:func:`pt2e_quantize`). ``torchao``: ``quantize_`` the eager
module with a torchao config and unwrap its tensor subclasses, then export
(:func:`torchao_quantize`; unwrapping leaves XNNPACK 8da4w and Core ML
weight-only programs byte-identical and makes a config XNNPACK cannot run fail
to lower instead of computing garbage). ``dtype``: cast the module and its
inputs (fp16).

A torchao scheme takes only the layers it can (etforge.builders.quantization.layer_filter): the
quantize record's ``layers`` says how many it quantized and which it kept in float,
and why. One that takes no layer of the model raises Rejected before anything is
quantized: the cell is ``rejected`` with the reason, not failed. (Decided here, from
the built nn.Module, rather than at plan time: planning never imports torch, and
the module is what ``quantize_`` walks.) With ``embedding: 4|8`` the scheme first
quantizes the embedding tables (etforge.builders.quantization.quantizers ``torchao_embedding``).
"""

from __future__ import annotations

import time
from pathlib import Path

from etforge.builders.capture.reference import REFERENCE
from etforge.core.errors import BadValue
from etforge.pipeline.results import BuildRequest, BuildResult, Rejected
from etforge.pipeline.stage_results import QuantizeResult

PROGRAM = "model.pt2"
DIVERGENCE_SAMPLES = 4  # reference samples keep_float auto's per-layer reading pools


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


def torchao_quantize(model, steps):
    """Quantize ``model`` in place, one torchao config per step (``(config, LayerChoice)``, embeddings
    first as in ExecuTorch's LLM flow), each on exactly the layers its choice took, then unwrap the
    tensor subclasses so ``torch.export`` sees plain ops."""
    from torchao.quantization import quantize_
    from torchao.utils import unwrap_tensor_subclass

    for config, choice in steps:
        if not choice.empty:
            quantize_(model, config, choice.as_filter())
    unwrap_tensor_subclass(model)
    return model


def torchao_steps(scheme: str, transform, model, keep: dict | None = None) -> tuple[list, dict]:
    """([(config, LayerChoice)], the record's ``layers``) of a torchao transform on ``model``;
    ``keep``: layer -> why it stays in float (keep_float, etforge.builders.quantization.rescue); raises Rejected
    when no step takes any layer."""
    from etforge.builders.quantization.layer_filter import (
        LayerRule,
        choose_layers,
        choose_with_fallback,
        layers_info,
        rejection,
        rule_of,
        with_weight_bytes,
    )
    from etforge.builders.quantization.quantizers import torchao_embedding
    from etforge.core.dotted_path import load_callable

    options = dict(transform.options)
    minimum = int(options.get("min_weight_elements", 0))
    steps = []
    if options.get("embedding"):
        group = int(options.get("embedding_group_size", 32))
        config = torchao_embedding({"bits": options["embedding"], "group_size": group})
        steps.append(
            (config, with_weight_bytes(model, choose_layers(model, LayerRule("embedding", group or None, minimum))))
        )
    factory = load_callable(transform.ref)
    config = factory(options)
    if rule_of(config).group or transform.fallback:  # per layer: group, smaller group, fallback, float
        fallback = load_callable(transform.fallback)(options) if transform.fallback else None
        steps += choose_with_fallback(
            model,
            config,
            lambda group: factory({**options, "group_size": group}),
            transform.group_multiple,
            fallback,
            minimum,
        )
    else:
        steps.append((config, with_weight_bytes(model, choose_layers(model, rule_of(config, "linear", minimum)))))
    keep = keep or {}
    for _, choice in steps if keep else ():
        kept = [fqn for fqn in choice.quantized if fqn in keep]
        choice.quantized = [fqn for fqn in choice.quantized if fqn not in keep]
        choice.fallbacks = [e for e in choice.fallbacks if e["layer"] not in keep]
        choice.kept_float.extend({"layer": fqn, "reason": keep[fqn]} for fqn in kept)
        with_weight_bytes(model, choice)
    choices = [choice for _, choice in steps]
    if all(choice.empty for choice in choices):
        raise Rejected(rejection(scheme, choices))
    return steps, layers_info(choices)


def quantize_stage(request: BuildRequest) -> BuildResult:
    """The quantize stage's builder for a module (an LLM's: etforge.builders.llm.stages)."""
    import torch

    from etforge.builders.capture.capture import save_programs

    cell, capture, workdir = request.cell, request.upstream["capture"], request.workdir
    reference = capture.files[REFERENCE]
    start = time.monotonic()
    model, inputs, facts = quantize_model(cell, request.plan.root, request.plan.seed, capture.files[PROGRAM], reference)
    if cell.model.multi_method:  # one quantized model, each method exported from it (weights shared)
        transform = cell.transform
        assert transform is not None  # a quantize task exists only for a cell that transforms its graph
        dtype = getattr(torch, transform.ref) if transform.method == "dtype" else None
        save_programs(
            workdir / PROGRAM,
            {
                method: _export_method(model, method, method_inputs, reference, dtype)
                for method, method_inputs in cell.model.methods
            },
        )
    else:
        torch.export.save(_export_quantized(cell, model, inputs), workdir / PROGRAM)
    result = QuantizeResult(quantize_s=round(time.monotonic() - start, 3), **facts)
    return BuildResult(files={PROGRAM: workdir / PROGRAM}, result=result)


def _export_quantized(cell, model, inputs):
    """The quantized model's graph, exported the way its capture was: a model with dynamic dims
    keeps them (the same Dims its capture was exported with)."""
    import torch

    from etforge.builders.capture.capture import export_dynamic_shapes
    from etforge.builders.capture.output_select import select_outputs

    return torch.export.export(
        select_outputs(model, cell.model.outputs),  # the outputs the app consumes, as the capture
        inputs,
        strict=False,
        dynamic_shapes=export_dynamic_shapes(cell.model.inputs),
    )


def _export_method(model, method: str, method_inputs, reference: Path, dtype):
    """One method of a multi-method model, exported from its own capture sample (and Dims)."""
    import torch

    from etforge.builders.capture.capture import export_dynamic_shapes, method_module
    from etforge.builders.capture.reference import load_reference_samples

    samples = load_reference_samples(reference, method)
    inputs = [torch.from_numpy(x) for x in samples.sample_inputs(samples.count // 2)]
    if dtype is not None:
        inputs = [x.to(dtype) if x.is_floating_point() else x for x in inputs]
    return torch.export.export(
        method_module(model, method), tuple(inputs), strict=False, dynamic_shapes=export_dynamic_shapes(method_inputs)
    )


def quantize_model(cell, root: Path, seed: int, capture_program: Path, reference: Path) -> tuple:
    """(quantized model or graph, the example inputs to export it with, QuantizeResult fields)."""
    import torch

    from etforge.builders.capture.capture import export_sample
    from etforge.builders.capture.reference import load_reference_samples
    from etforge.builders.capture.samples import calibration_batches
    from etforge.builders.loading.model_loading import build_model
    from etforge.builders.quantization.rescue import without_layers
    from etforge.core.dotted_path import load_callable

    transform = cell.transform
    samples = load_reference_samples(reference)
    # the capture's export sample (a dynamic model's: one whose sizes are above 1, which torch.export specializes)
    each = [samples.sample_inputs(n) for n in range(samples.count)]
    inputs = tuple(torch.from_numpy(x) for x in each[export_sample(each, cell.model.inputs)])
    facts: dict = {"method": transform.method, "quantizer": transform.ref}
    if transform.method == "pt2e":
        factory = load_callable(transform.ref)
        batches, source = calibration_batches(cell.model, root, seed)
        program = torch.export.load(capture_program)
        calibration = [tuple(torch.from_numpy(x) for x in batch) for batch in batches]

        def convert(kept=()):
            # OpenVINO wants float weights followed by quantize/dequantize (no folding).
            quantizer = without_layers(factory(dict(transform.options)), [graph_prefix(cell) + k for k in kept])
            fold = getattr(factory, "fold_quantize", True)
            return pt2e_quantize(program, inputs, quantizer, calibration, fold_quantize=fold)

        keep, rescue, layers = pt2e_keep_float(cell, program, convert, samples)
        model = convert(tuple(keep))
        facts.update(calibration=source, calibration_samples=len(batches))
        if keep:
            facts["layers"] = layers
        if rescue is not None:
            facts["rescue"] = rescue
    elif transform.method == "torchao":
        model = build_model(cell.model, root)
        keep, rescue = keep_float(cell, model, samples, capture_program)
        steps, facts["layers"] = torchao_steps(cell.quant.name, transform, model, keep)
        if rescue is not None:
            facts["rescue"] = rescue
        model = torchao_quantize(model, steps)
    elif transform.method == "dtype":
        dtype = getattr(torch, transform.ref)
        model = build_model(cell.model, root).to(dtype)
        inputs = tuple(x.to(dtype) if x.is_floating_point() else x for x in inputs)
    else:
        raise BadValue(f"unknown quantization method {transform.method!r}")
    return model, inputs, facts


def keep_float(cell, model, reference, capture_program: Path | None = None) -> tuple[dict, dict | None]:
    """(layer -> why it stays in float, the ``auto`` rescue record or None) of the scheme's
    ``keep_float`` option (etforge.builders.quantization.rescue) for a torchao scheme on ``model`` (not
    changed); ``capture_program``: the fp32 capture, whose per-layer reading ranks the layers ``auto`` tries."""
    import copy

    import torch

    from etforge.builders.capture.output_select import select_outputs
    from etforge.builders.quantization.rescue import AUTO, auto_keep, matching, rescue_reason

    transform = cell.transform
    option = transform.options.get("keep_float")
    if not option:
        return {}, None
    steps, _ = torchao_steps(cell.quant.name, transform, model)
    taken = [fqn for _, choice in steps for fqn in choice.quantized]
    if option != AUTO:
        return matching(taken, list(option)), None
    threshold = cell.thresholds.get("sqnr_db")
    if threshold is None:
        raise BadValue(f"keep_float: auto aims at the cell's sqnr_db threshold and {cell.name} has none")

    def quantized(kept: tuple):
        trial = copy.deepcopy(model)
        trial_steps, _ = torchao_steps(cell.quant.name, transform, trial, dict.fromkeys(kept, ""))
        return select_outputs(torchao_quantize(trial, trial_steps), cell.model.outputs)  # as the reference has them

    measure, latest = measured_once(quantized, reference)

    def graph(kept: tuple):
        inputs = tuple(torch.from_numpy(x) for x in reference.sample_inputs(reference.count // 2))
        return torch.export.export(latest(kept), inputs, strict=False).module()

    limit = transform.options.get("keep_float_limit")
    divergence = divergence_of(graph, capture_program, reference) if capture_program is not None else None
    rescue = auto_keep(taken, measure, float(threshold), int(limit) if limit else None, divergence)
    return {e["layer"]: rescue_reason(e) for e in rescue["kept"]}, rescue


def measured_once(build, reference) -> tuple:
    """(``measure(kept) -> dB``, ``latest(kept) -> model``) for keep_float auto: ``measure`` builds the
    model with ``kept`` left in float and measures it against the reference; ``latest`` gives the model
    last measured for ``kept`` (the per-layer reading that follows reads it), or builds it again."""
    from etforge.builders.quantization.rescue import eager_sqnr

    last: dict = {}  # only the last one: a quantized model is as large as the model

    def measure(kept: tuple) -> float:
        last.clear()
        last[frozenset(kept)] = built = build(kept)
        return eager_sqnr(built, reference)

    def latest(kept: tuple):
        found = last.get(frozenset(kept))
        return build(kept) if found is None else found

    return measure, latest


def divergence_of(graph, fp32_program, reference, samples: int = DIVERGENCE_SAMPLES):
    """``divergence(kept) -> layers`` for keep_float auto: the per-layer reading (etforge.builders.numerics.
    quantized_divergence graph_layer_sqnrs) of ``graph(kept)`` (the model quantized with ``kept`` in
    float, as a graph module) against the fp32 capture (``fp32_program``: an ExportedProgram or the path
    of its .pt2), pooled over the first ``samples`` reference samples."""
    import torch

    from etforge.builders.numerics.quantized_divergence import graph_layer_sqnrs

    fp32: list = []  # loaded on the first reading: a model that meets its threshold never needs it
    inputs = [reference.sample_inputs(n) for n in range(min(samples, reference.count))]

    def divergence(kept: tuple) -> list:
        if not fp32:
            program = fp32_program
            fp32.append((program if hasattr(program, "module") else torch.export.load(program)).module())
        return graph_layer_sqnrs(graph(kept), fp32[0], inputs)

    return divergence


def graph_prefix(cell) -> str:
    """How the captured graph's layer names start: a model captured through its ``outputs:``
    selection is wrapped (etforge.builders.capture.output_select), the others are not."""
    from etforge.builders.capture.output_select import CORE

    return f"{CORE}." if getattr(getattr(cell, "model", None), "outputs", ()) else ""


def pt2e_keep_float(cell, program, convert, reference) -> tuple[dict, dict | None, dict]:
    """(layer -> why it stays in float, the ``auto`` record or None, the record's ``layers``) of a PT2E
    scheme's ``keep_float``: ``convert(kept)`` quantizes the captured ``program`` leaving ``kept`` in float
    (layers named as in the model, without the outputs: wrapper's prefix)."""
    from etforge.builders.quantization.rescue import AUTO, auto_keep, graph_layers, matching, rescue_reason

    option = cell.transform.options.get("keep_float")
    if not option:
        return {}, None, {}
    measure, graph = measured_once(convert, reference)

    prefix = graph_prefix(cell)
    layers = {name.removeprefix(prefix): layer for name, layer in graph_layers(program).items()}
    rescue = None
    if option != AUTO:
        keep = matching(list(layers), list(option))
    else:
        threshold = cell.thresholds.get("sqnr_db")
        if threshold is None:
            raise BadValue(f"keep_float: auto aims at the cell's sqnr_db threshold and {cell.name} has none")
        limit = cell.transform.options.get("keep_float_limit")
        rescue = auto_keep(
            list(layers),
            measure,
            float(threshold),
            int(limit) if limit else None,
            divergence_of(graph, program, reference),
        )
        keep = {e["layer"]: rescue_reason(e) for e in rescue["kept"]}
    taken: dict = {}
    for name, (kind, size) in layers.items():
        if name not in keep:
            taken[kind] = taken.get(kind, 0) + size
    record = {
        "quantized": len(layers) - len(keep),
        "float": len(keep),
        "kept_float": [{"layer": name, "reason": why} for name, why in keep.items()],
        "taken_weight_bytes": taken,
    }
    return keep, rescue, record
