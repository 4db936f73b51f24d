"""Find the first layer where a quantized cell's graph falls below its threshold against eager fp32.

Method (granularity: one reading per leaf module, by its ``nn_module_stack`` path): the
quantized graph (the quantize stage's ``model.pt2``, before lowering) and the fp32 capture
(the capture's ``model.pt2``) are each replayed node by node (``torch.fx.Interpreter``) on the
same sample, and every floating-point node's value is kept. A layer's reading is the value of
the last floating-point node its module made, taken after the quantize/dequantize pair that
follows it when there is one, i.e. as the next layer sees it. Layers are compared where both
graphs have them with the same shape, in the fp32 graph's order, as SQNR (dB) of the quantized
reading against the fp32 one; the first below the threshold (the cell's ``sqnr_db``, else
DIVERGENCE_SQNR_DB) is the first divergent layer, and the layers after it are listed with theirs.

Why not the lowered program: ETDump's debug buffers need a runtime built with the event
tracer, and the pip runtime here is not (../shared/executorch-notes.md, Devtools), so
``Inspector.calculate_numeric_gap`` has no runtime side; the tap comparison
(``etforge.builders.numerics.divergence``) breaks on PT2E-quantized graphs; and an XNNPACK
delegate is opaque to both. The runtime program computes what the quantized graph computes
(52-66 dB between them for every rescued program, etforge.builders.quantization.rescue), so the
layer the quantized graph loses is the layer the program loses.
"""

from __future__ import annotations

import math
from pathlib import Path

from etforge.config.defaults import DIVERGENCE_SQNR_DB

ZERO_SIGNAL_ATOL = 1e-4  # an all-zero eager reading has no SQNR: divergent above this max abs error
AFTER = 5  # layers listed after the first divergent one


def is_below(sqnr_db: float | None, max_abs_error: float, threshold_db: float) -> bool:
    """Whether one layer's reading is divergent: SQNR below the threshold, or not finite.

    ``sqnr_db`` None: identical (not divergent); -inf: an all-zero eager value, judged by the
    absolute error; NaN (a NaN or inf in the quantized value): divergent."""
    if sqnr_db is None:
        return False
    if sqnr_db == -math.inf:
        return not max_abs_error <= ZERO_SIGNAL_ATOL  # NaN-safe: a NaN error is divergent
    return not sqnr_db >= threshold_db  # NaN-safe: a NaN SQNR is divergent


def first_below(layers: list, threshold_db: float, after: int = AFTER) -> dict | None:
    """The first divergent layer of ``layers`` (in model order, each ``{"layer", "op_target", "sqnr_db",
    "max_abs_error"}``) and the SQNR of the ``after`` layers that follow it; None when none is below."""
    for index, layer in enumerate(layers):
        if not is_below(layer["sqnr_db"], layer["max_abs_error"], threshold_db):
            continue
        return {
            "layer": layer["layer"],
            "op_target": layer["op_target"],
            "sqnr_db": layer["sqnr_db"],
            "max_abs_error": layer["max_abs_error"],
            "index": index,
            "threshold_db": threshold_db,
            "layers_compared": len(layers),
            "after": [{"layer": n["layer"], "sqnr_db": n["sqnr_db"]} for n in layers[index + 1 : index + 1 + after]],
            "method": "quantized graph replayed per layer against eager fp32",
        }
    return None


def describe(found: dict) -> str:
    """One phrase for the cell's reason, e.g. 'first divergence at layer features.3 (aten.conv2d),
    SQNR 7.5 dB; after it: head 6.1 dB (quantized graph, per layer, against eager fp32)'."""
    target = (found.get("op_target") or "").removesuffix(".default")
    text = f"first divergence at layer {found['layer']} ({target}), SQNR {_db(found['sqnr_db'])} dB"
    if found.get("after"):
        text += "; after it: " + ", ".join(f"{n['layer']} {_db(n['sqnr_db'])} dB" for n in found["after"])
    return text + " (quantized graph, per layer, against eager fp32)"


def _db(value) -> str:
    if value is None:
        return "inf"
    return "nan" if value != value else ("-inf" if value == -math.inf else f"{value:.1f}")


def first_divergent_layer(
    quantized_pt2: Path, fp32_pt2: Path, cell, inputs: list, *, threshold_db: float | None = None
) -> dict | None:
    """The first layer of the quantized graph below the threshold against eager fp32 (see
    :func:`first_below`, plus ``layers``: every compared layer's SQNR), or None when none is."""
    layers, threshold = layer_sqnrs(quantized_pt2, fp32_pt2, cell, inputs, threshold_db=threshold_db)
    found = first_below(layers, threshold)
    if found is not None:
        found["layers"] = [{"layer": n["layer"], "sqnr_db": n["sqnr_db"]} for n in layers]
    return found


def layer_sqnrs(quantized_pt2: Path, fp32_pt2: Path, cell, inputs: list, *, threshold_db=None) -> tuple[list, float]:
    """(per layer both graphs have, in model order: layer, op_target, sqnr_db, max_abs_error; the threshold)."""
    import numpy as np
    import torch

    from etforge.builders.capture.output_select import CORE
    from etforge.builders.lowering.lower import _register_transform_ops
    from etforge.builders.numerics.compare import sqnr_db

    threshold = float(
        threshold_db if threshold_db is not None else (cell.thresholds or {}).get("sqnr_db", DIVERGENCE_SQNR_DB)
    )
    _register_transform_ops(cell)
    tensors = [x if isinstance(x, torch.Tensor) else torch.from_numpy(np.ascontiguousarray(x)) for x in inputs]
    eager = _layer_readings(torch.export.load(fp32_pt2), tensors)
    quantized = _layer_readings(torch.export.load(quantized_pt2), tensors)
    layers = []
    for path, (target, expected) in eager.items():
        if path not in quantized or quantized[path][1].shape != expected.shape:
            continue
        reference = expected.double().numpy()
        actual = quantized[path][1].double().numpy()
        with np.errstate(invalid="ignore", over="ignore"):
            err = float(np.max(np.abs(reference - actual))) if reference.size else 0.0
        sqnr = sqnr_db(reference, actual)
        layers.append(
            {
                "layer": path.removeprefix(f"{CORE}."),
                "op_target": target,
                "sqnr_db": sqnr if sqnr is None or not math.isfinite(sqnr) else round(sqnr, 2),
                "max_abs_error": err,
            }
        )
    return layers, threshold


def _layer_readings(program, tensors: list) -> dict:
    """module path -> (op of its last float node, its value as the next layer sees it), in graph order."""
    import torch

    module = program.module()
    values: dict = {}
    # a graph whose inputs are half (an fp16 cell's) takes the samples cast to them, as the program does
    wanted = [n.meta.get("val") for n in module.graph.nodes if n.op == "placeholder"]
    tensors = [
        t.to(w.dtype) if isinstance(w, torch.Tensor) and t.is_floating_point() and w.is_floating_point() else t
        for t, w in zip(tensors, wanted + [None] * (len(tensors) - len(wanted)), strict=False)
    ]

    class Recorder(torch.fx.Interpreter):
        def run_node(self, node):
            value = super().run_node(node)
            if isinstance(value, torch.Tensor) and value.is_floating_point():
                values[node.name] = value.detach().float()
            return value

    with torch.no_grad():
        Recorder(module).run(*tensors)
    readings: dict = {}
    for node in module.graph.nodes:
        stack = list((node.meta.get("nn_module_stack") or {}).values())
        if node.op != "call_function" or node.name not in values or not stack or not stack[-1][0]:
            continue
        path = stack[-1][0]
        reading = _after_requantization(node)
        readings.pop(path, None)  # re-insert: a module's reading sits where its last node is
        readings[path] = (str(node.target), values.get(reading.name, values[node.name]))
    # order by where each module's output lands; a module read twice keeps its last reading
    return readings


def _after_requantization(node):
    """The dequantize node of a quantize -> dequantize pair right after ``node``, else ``node``."""
    for user in node.users:
        if ".quantize_per" in str(user.target):
            for second in user.users:
                if "dequantize" in str(second.target):
                    return second
    return node
