"""The first layer where a quantized cell leaves eager fp32, read per layer, and its reason phrase.

Granularity: one reading per leaf module, by its ``nn_module_stack`` path. A layer's reading is
the value of the last floating-point node its module made, taken after the quantize/dequantize
pair that follows it when there is one, i.e. as the next layer sees it (:func:`readings_of`).
Eager fp32's readings come from the fp32 capture (the capture's ``model.pt2``) replayed node by
node (``torch.fx.Interpreter``) on the same sample. Layers are compared where both sides have
them with the same shape, in the fp32 graph's order, as SQNR (dB) of the quantized reading
against the fp32 one; the first below the threshold (the cell's ``sqnr_db``, else
DIVERGENCE_SQNR_DB) is the first divergent layer, and the layers after it are listed with theirs.

Two sources of the quantized readings, named in the record's ``method`` and in the phrase:

- the program's own intermediate outputs (ETDump debug buffers, mapped to layers through the
  ETRecord: etforge.builders.numerics.etdump_divergence), where the program exposes its layers
  (a program without delegates: every portable kernel logs its output);
- else the quantized graph (the quantize stage's ``model.pt2``, before lowering) replayed the
  same way (:func:`layer_sqnrs`), with ``why`` saying why the program's own outputs were not
  used (an XNNPACK delegate logs only its outputs; no ETRecord). The runtime program computes
  what the quantized graph computes (52-66 dB between them for every rescued program,
  etforge.builders.quantization.rescue), so the layer the graph loses is the layer the program
  loses. ``keep_float: auto`` reads the same replay at quantize time, when there is no program
  yet (:func:`graph_layer_sqnrs`).
"""

from __future__ import annotations

import math
from pathlib import Path

from etforge.config.defaults import DIVERGENCE_SQNR_DB

ZERO_SIGNAL_ATOL = 1e-4  # an all-zero eager reading has no SQNR: divergent above this max abs error
AFTER = 5  # layers listed after the first divergent one
REPLAY = "quantized graph replayed per layer against eager fp32"  # a record's ``method``
ETDUMP = "program's own intermediate outputs (ETDump) per layer against eager fp32"
PHRASES = {
    REPLAY: "quantized graph, per layer, against eager fp32",
    ETDUMP: "the program's own intermediate outputs (ETDump), per layer, against eager fp32",
}


def is_below(sqnr_db: float | None, max_abs_error: float, threshold_db: float) -> bool:
    """Whether one layer's reading is divergent: SQNR below the threshold, or not finite.

    ``sqnr_db`` None: identical (not divergent); -inf: an all-zero eager value, judged by the
    absolute error; NaN (a NaN or inf in the quantized value): divergent."""
    if sqnr_db is None:
        return False
    if sqnr_db == -math.inf:
        return not max_abs_error <= ZERO_SIGNAL_ATOL  # NaN-safe: a NaN error is divergent
    return not sqnr_db >= threshold_db  # NaN-safe: a NaN SQNR is divergent


def first_below(layers: list, threshold_db: float, after: int = AFTER, method: str = REPLAY) -> dict | None:
    """The first divergent layer of ``layers`` (in model order, each ``{"layer", "op_target", "sqnr_db",
    "max_abs_error"}``) and the SQNR of the ``after`` layers that follow it; None when none is below.
    ``method``: where the quantized readings came from (REPLAY or ETDUMP)."""
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
            "method": method,
        }
    return None


def describe(found: dict) -> str:
    """One phrase for the cell's reason, e.g. 'first divergence at layer features.3 (aten.conv2d),
    SQNR 7.5 dB; after it: head 6.1 dB (the program's own intermediate outputs (ETDump), per layer,
    against eager fp32)'; a replay says why the program's own outputs were not read."""
    target = (found.get("op_target") or "").removesuffix(".default")
    text = f"first divergence at layer {found['layer']} ({target}), SQNR {_db(found['sqnr_db'])} dB"
    if found.get("after"):
        text += "; after it: " + ", ".join(f"{n['layer']} {_db(n['sqnr_db'])} dB" for n in found["after"])
    return text + f" ({method_phrase(found)})"


def method_phrase(found: dict) -> str:
    """How a record's readings were taken, e.g. 'quantized graph, per layer, against eager fp32: the
    program's XnnpackBackend delegate is opaque to ETDump (7 of 7 layers inside it)'."""
    phrase = PHRASES.get(found.get("method") or REPLAY, PHRASES[REPLAY])
    return phrase + (f": {found['why']}" if found.get("why") else "")


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
    return with_layers(first_below(layers, threshold), layers)


def with_layers(found: dict | None, layers: list) -> dict | None:
    """``found`` with every compared layer's SQNR (``layers``), for the record."""
    if found is not None:
        found["layers"] = [{"layer": n["layer"], "sqnr_db": n["sqnr_db"]} for n in layers]
    return found


def threshold_of(cell, threshold_db: float | None = None) -> float:
    """The per-layer threshold: ``threshold_db``, else the cell's ``sqnr_db``, else DIVERGENCE_SQNR_DB."""
    if threshold_db is not None:
        return float(threshold_db)
    return float((cell.thresholds or {}).get("sqnr_db", DIVERGENCE_SQNR_DB))


def layer_sqnrs(quantized_pt2: Path, fp32_pt2: Path, cell, inputs: list, *, threshold_db=None) -> tuple[list, float]:
    """(per layer both graphs have, in model order: layer, op_target, sqnr_db, max_abs_error; the threshold)."""
    import torch

    from etforge.builders.lowering.lower import _register_transform_ops

    _register_transform_ops(cell)
    fp32 = torch.export.load(fp32_pt2).module()
    quantized = torch.export.load(quantized_pt2).module()
    return graph_layer_sqnrs(quantized, fp32, [inputs]), threshold_of(cell, threshold_db)


def graph_layer_sqnrs(quantized, fp32, samples: list) -> list:
    """Per layer of two graph modules (a quantized graph, e.g. PT2E's converted one, and the fp32
    capture's), in model order: layer, op_target, sqnr_db, max_abs_error, each pooled over ``samples``
    (lists of input arrays or tensors)."""
    eager: dict = {}
    actual: dict = {}
    for inputs in samples:
        tensors = as_tensors(inputs)
        _pool(eager, layer_readings(fp32, tensors))
        _pool(actual, layer_readings(quantized, tensors))
    return compare_readings(_pooled(eager), _pooled(actual))


def _pool(into: dict, readings: dict) -> None:
    for path, (target, value) in readings.items():
        into.setdefault(path, (target, []))[1].append(value)


def _pooled(readings: dict) -> dict:
    """path -> (op, its value over every sample: one sample's as it is, several flattened end to end)."""
    import torch

    return {
        path: (target, values[0] if len(values) == 1 else torch.cat([v.reshape(-1) for v in values]))
        for path, (target, values) in readings.items()
    }


def as_tensors(inputs: list) -> list:
    import numpy as np
    import torch

    return [x if isinstance(x, torch.Tensor) else torch.from_numpy(np.ascontiguousarray(x)) for x in inputs]


def compare_readings(eager: dict, actual: dict) -> list:
    """Per layer of ``eager`` (path -> (op, value)) that ``actual`` has with the same shape, in eager's
    order: layer (without the outputs: wrapper's prefix), op_target (eager's), sqnr_db (rounded; None:
    identical), max_abs_error."""
    import numpy as np

    from etforge.builders.capture.output_select import CORE
    from etforge.builders.numerics.compare import sqnr_db

    layers = []
    for path, (target, expected) in eager.items():
        if path not in actual or actual[path][1].shape != expected.shape:
            continue
        reference = expected.double().numpy()
        value = actual[path][1].double().numpy()
        with np.errstate(invalid="ignore", over="ignore"):
            err = float(np.max(np.abs(reference - value))) if reference.size else 0.0
        sqnr = sqnr_db(reference, value)
        layers.append(
            {
                "layer": path.removeprefix(f"{CORE}."),
                "op_target": target,
                "sqnr_db": sqnr if sqnr is None or not math.isfinite(sqnr) else round(sqnr, 2),
                "max_abs_error": err,
            }
        )
    return layers


def layer_readings(module, tensors: list) -> dict:
    """module path -> (op of its last float node, its value as the next layer sees it), in graph
    order, of a graph module (an ExportedProgram's ``module()``, or PT2E's converted graph) run on
    ``tensors``."""
    import torch

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
    return readings_of(module.graph.nodes, values)


def readings_of(nodes, values: dict) -> dict:
    """module path -> (op of its last node with a value, that value as the next layer sees it), in
    graph order: ``values`` maps node names to float tensors (a replay's, or a program's ETDump's)."""
    readings: dict = {}
    for node in nodes:
        stack = list((node.meta.get("nn_module_stack") or {}).values())
        if node.op != "call_function" or node.name not in values or not stack or not stack[-1][0]:
            continue
        path = stack[-1][0]
        reading = _after_requantization(node)
        readings.pop(path, None)  # re-insert: a module's reading sits where its last node is
        readings[path] = (op_name(node.target), values.get(reading.name, values[node.name]))
    # order by where each module's output lands; a module read twice keeps its last reading
    return readings


def op_name(target) -> str:
    """'aten.linear.default' of an ATen op, and of an edge dialect's (an ``EdgeOpOverload`` wraps the
    ATen ``OpOverload`` in ``_op``; its own str carries its schema)."""
    aten = getattr(target, "_op", None)
    return str(aten) if hasattr(aten, "overloadpacket") else str(target)


def _after_requantization(node):
    """The dequantize node of a quantize -> dequantize pair right after ``node``, else ``node``."""
    for user in node.users:
        if ".quantize_per" in op_name(user.target):
            for second in user.users:
                if "dequantize" in op_name(second.target):
                    return second
    return node
