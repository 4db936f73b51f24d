"""Accuracy rescue: which layers a quantized model keeps in float so that it meets its thresholds.

A scheme's ``keep_float`` option (``quantization_options: {8da4w: {keep_float: ...}}``):

    [regex, ...]   keep every layer whose name one of them matches (re.fullmatch) in float
    auto           keep the most sensitive layers, fewest first, until the cell's sqnr_db threshold
                   holds or ``keep_float_limit`` layers are kept (default: a quarter of the layers
                   the scheme takes, at least one)

``auto`` measures on the eager model, over the capture's reference samples (what validation
compares against). First the whole model quantized; when it misses, the per-layer reading of that
quantized graph against eager fp32 (etforge.builders.numerics.quantized_divergence: a replay of
both graphs, no quantization) names the first divergent layer, and that layer (or the weight layer
feeding it) is kept in float and the model measured again; then the next first divergent layer of
the model so quantized, while each one kept buys something, until the threshold holds or the limit
is reached: 1 + k quantizations. Only when that does not reach the threshold does the sensitivity
search run: each layer kept in float alone (its sensitivity: the
dB keeping it buys), then the layers in that order, re-measured after each one, so that what each
bought is measured, not assumed: 1 + L + k quantizations, less those already measured. The rescue
record says which search decided (``search``), which layer the divergence named (``divergence``)
and how many quantizations were measured (``measurements``). The runtime program computes what the
quantized eager model computes (research: 52-66 dB between them for every rescued program), so
the choice carries over to the delegate.

The option joins the quantize key (it is one of the scheme's options), and with ``auto`` so do
the thresholds it aims at (etforge.pipeline.keys).

For a PT2E scheme the layers are the captured graph's linear and convolution calls, named by the
module that made them (``nn_module_stack``), and a kept layer is left out of the quantizer's
annotation with a node filter (:func:`without_layers`; XNNPACK's quantizer takes one, and
``set_module_name(name, None)`` is refused in executorch 1.5.1).
"""

from __future__ import annotations

import math
import re

from etforge.core.errors import BadValue

AUTO = "auto"
LIMIT_SHARE = 0.25  # of the layers the scheme takes: the default limit of ``auto``
# The captured graph's weight layers (the capture's weight_bytes kinds): op -> kind
GRAPH_LAYERS = {"aten.linear": "linear", "aten.conv1d": "conv", "aten.conv2d": "conv", "aten.conv3d": "conv"}


def graph_layers(program) -> dict:
    """layer name -> (kind, fp32 bytes of its weight) of every linear/conv call of a captured
    ExportedProgram, named by the module that made it, in graph order."""
    named = program.graph_signature.inputs_to_parameters
    out: dict = {}
    for node in program.graph.nodes:
        kind = GRAPH_LAYERS.get(str(getattr(node.target, "overloadpacket", ""))) if node.op == "call_function" else None
        stack = list((node.meta.get("nn_module_stack") or {}).values()) if kind else []
        if not stack or len(node.args) < 2:
            continue
        name = stack[-1][0]
        weight = program.state_dict.get(named.get(getattr(node.args[1], "name", ""), ""))
        size = weight.numel() * weight.element_size() if weight is not None else 0
        out.setdefault(name, (kind, size))
    return out


def without_layers(quantizer, layers):
    """``quantizer`` annotating nothing the modules named ``layers`` made (they stay in float)."""
    if not layers:
        return quantizer
    if not hasattr(quantizer, "set_filter_function"):
        raise BadValue(f"keep_float: {type(quantizer).__name__} cannot leave layers out of its quantization")
    from torchao.quantization.pt2e.quantizer.utils import get_module_name_filter

    hits = [get_module_name_filter(name) for name in layers]
    quantizer.set_filter_function(lambda node: not any(hit(node) for hit in hits))
    return quantizer


def matching(names, patterns) -> dict:
    """layer -> why it stays in float, for every layer of ``names`` a pattern matches (re.fullmatch)."""
    for pattern in patterns:
        try:
            re.compile(pattern)
        except re.error as exc:
            raise BadValue(f"keep_float: {pattern!r} is not a regular expression ({exc})") from None
    out = {}
    for name in names:
        hit = next((p for p in patterns if re.fullmatch(p, name)), None)
        if hit is not None:
            out[name] = f"keep_float: matches {hit!r}"
    return out


def eager_sqnr(model, reference) -> float:
    """The worst output's SQNR (dB) of ``model`` against the reference's eager outputs, pooled over
    every sample (math.inf: identical)."""
    import numpy as np
    import torch
    from torch.utils._pytree import tree_leaves

    from etforge.builders.numerics.compare import sqnr_db

    got: list = [[] for _ in reference.outputs]
    want: list = [[] for _ in reference.outputs]
    with torch.no_grad():
        for n in range(reference.count):
            inputs = [torch.from_numpy(np.asarray(x)) for x in reference.sample_inputs(n)]
            leaves = [t for t in tree_leaves(model(*inputs)) if isinstance(t, torch.Tensor)]
            for i, (actual, expected) in enumerate(zip(leaves, reference.sample_outputs(n))):
                got[i].append(actual.detach().float().numpy().ravel())
                want[i].append(np.asarray(expected, dtype=np.float64).ravel())
    worst = math.inf
    for actual, expected in zip(got, want):
        if not actual:
            continue
        value = sqnr_db(np.concatenate(expected), np.concatenate(actual))
        value = math.inf if value is None else value
        worst = value if math.isnan(value) else min(worst, value)  # a NaN is the worst there is
        if math.isnan(worst):
            break
    return worst


def auto_keep(candidates: list, measure, threshold: float, limit: int | None, divergence=None) -> dict:
    """The layers to keep in float, fewest first, and what each bought.

    ``measure(kept: tuple) -> dB`` quantizes the model with ``kept`` left in float and measures it (each
    distinct set once). ``divergence(kept: tuple) -> layers``: the per-layer reading of the model
    quantized with ``kept`` in float against eager fp32 (etforge.builders.numerics.quantized_divergence
    ``graph_layer_sqnrs``); with it, the first divergent layer is tried first (:func:`_guided`), and
    the sensitivity search runs only when that does not reach the threshold.

    Returns the ``rescue`` record: ``threshold_db``, ``limit``, ``before_db`` (everything quantized),
    ``search`` ("first divergence" or "sensitivity"), ``divergence`` (the layer the first reading
    named, its SQNR, the candidate tried for it), ``sensitivity`` (by the divergence: each candidate's
    reading and the dB lost there; by the search: [{"layer", "gain_db"}], what keeping it alone buys,
    most sensitive first), ``kept`` ([{"layer", "gain_db"}] in the order kept), ``after_db``,
    ``reached`` and ``measurements`` (quantizations measured)."""
    limit = limit if limit is not None else max(1, math.ceil(LIMIT_SHARE * len(candidates)))
    memo: dict = {}

    def measured(kept: tuple) -> float:
        key = frozenset(kept)
        if key not in memo:
            memo[key] = measure(tuple(kept))
        return memo[key]

    before = measured(())
    record: dict = {"threshold_db": threshold, "limit": limit, "before_db": _db(before), "kept": []}
    if before >= threshold or not candidates:
        done: dict = {"after_db": _db(before), "reached": before >= threshold, "sensitivity": []}
        return {**record, **done, "measurements": len(memo)}
    if divergence is not None:
        guided = _guided(candidates, measured, divergence, threshold, limit, before)
        record["divergence"] = guided.pop("divergence")
        if guided["reached"]:
            return {**record, **guided, "search": "first divergence", "measurements": len(memo)}
    gains = {layer: measured((layer,)) - before for layer in candidates}
    ranked = sorted(candidates, key=lambda layer: (-_finite(gains[layer]), candidates.index(layer)))
    record["sensitivity"] = [{"layer": layer, "gain_db": _db(gains[layer])} for layer in ranked]
    kept: list = []
    current = before
    for layer in ranked[:limit]:
        after = measured(tuple(kept) + (layer,))
        record["kept"].append({"layer": layer, "gain_db": _db(after - current)})
        kept.append(layer)
        current = after
        if current >= threshold:
            break
    return {
        **record,
        "after_db": _db(current),
        "reached": current >= threshold,
        "search": "sensitivity",
        "measurements": len(memo),
    }


def _guided(candidates: list, measured, divergence, threshold: float, limit: int, before: float) -> dict:
    """Keep the candidate the per-layer reading names (:func:`named_candidate`), re-read the model
    with it in float, and so on, while each one kept buys something, until the threshold holds or
    ``limit`` layers are kept. Returns ``divergence``, ``sensitivity``, ``kept``, ``after_db``, ``reached``."""
    from etforge.builders.numerics.quantized_divergence import REPLAY, first_below
    from etforge.core.text import first_line

    kept: list = []
    out: dict = {"divergence": {}, "sensitivity": [], "kept": []}
    current = before
    while len(kept) < limit and not current >= threshold:
        try:
            layers = divergence(tuple(kept))
        except Exception as exc:  # the sensitivity search still answers
            out["divergence"] = out["divergence"] or {"error": first_line(exc)}
            break
        found = first_below(layers, threshold)
        target = named_candidate(layers, found, candidates, kept)
        if not kept:  # what the reading of the whole quantized model named
            out["divergence"] = {
                "layer": found and found["layer"],
                "sqnr_db": found and found["sqnr_db"],
                "tried": target,
                "method": REPLAY,
            }
            out["sensitivity"] = _by_divergence(layers, candidates, target)
        if target is None:
            break
        after = measured(tuple(kept) + (target,))
        if not after > current:  # NaN-safe: bought nothing, so the search decides
            break
        out["kept"].append({"layer": target, "gain_db": _db(after - current)})
        kept.append(target)
        current = after
    return {**out, "after_db": _db(current), "reached": current >= threshold}


def named_candidate(layers: list, found: dict | None, candidates: list, kept: list) -> str | None:
    """The candidate to keep for the first divergent layer ``found`` of ``layers`` (in model order):
    that layer itself, else the last candidate before it (a weight layer feeding it), else the first
    after it; one already kept is passed over. None when no layer is below the threshold."""
    if found is None:
        return None
    order = [n["layer"] for n in layers]
    free = [c for c in candidates if c not in kept and c in order]
    at = found["index"]
    before = [c for c in free if order.index(c) <= at]
    after = [c for c in free if order.index(c) > at]
    if found["layer"] in free:
        return found["layer"]
    if before:
        return max(before, key=order.index)
    return min(after, key=order.index) if after else None


def _by_divergence(layers: list, candidates: list, first: str | None) -> list:
    """The candidates by the per-layer reading: ``first`` (the one named), then by the dB each loses
    against the reading before it; each with its reading's SQNR and that loss."""
    rows = []
    previous: float | None = None
    for layer in layers:
        sqnr = layer["sqnr_db"]
        if layer["layer"] in candidates:
            loss: float | None = None if previous is None or sqnr is None else previous - sqnr
            rows.append({"layer": layer["layer"], "sqnr_db": _db(sqnr), "loss_db": _db(loss)})
        previous = math.inf if sqnr is None else sqnr
    unknown = -math.inf  # no reading before it, or an identical one: ranked last
    return sorted(
        rows, key=lambda r: (r["layer"] != first, -_finite(unknown if r["loss_db"] is None else r["loss_db"]))
    )


def _finite(value: float) -> float:
    return value if math.isfinite(value) else (1e9 if value > 0 else -1e9)


def _db(value: float | None) -> float | None:
    """Rounded for the record; None for an infinite (identical) or NaN value."""
    return round(value, 2) if value is not None and math.isfinite(value) else None


def rescue_reason(entry: dict) -> str:
    gain = entry.get("gain_db")
    bought = f"{gain:+.1f} dB" if isinstance(gain, (int, float)) else "to identical outputs"
    return f"keep_float auto: most sensitive layer, bought {bought}"
