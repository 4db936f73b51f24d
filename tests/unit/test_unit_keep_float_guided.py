"""keep_float auto guided by the first divergent layer: fake measurements and per-layer readings (no torch)."""

from __future__ import annotations

import math

from etforge.builders.numerics.quantized_divergence import first_below
from etforge.builders.quantization.rescue import auto_keep, named_candidate


def _layer(name: str, sqnr) -> dict:
    return {"layer": name, "op_target": "aten.linear.default", "sqnr_db": sqnr, "max_abs_error": 0.1}


# keep_float auto: a model of five layers whose third, when quantized, costs 20 dB at the output.
LAYERS = ["l0", "l1", "l2", "l3", "l4"]
COST = {"l0": 0.5, "l1": 1.0, "l2": 20.0, "l3": 0.2, "l4": 0.1}


def _measure(calls: list):
    def measure(kept: tuple) -> float:
        calls.append(kept)
        return 45.0 - sum(cost for layer, cost in COST.items() if layer not in kept)

    return measure


def _divergence(readings: list):
    def divergence(kept: tuple) -> list:  # cumulative per-layer SQNR: it drops where a layer is fragile
        readings.append(kept)
        out, sqnr = [], 60.0
        for layer in LAYERS:
            sqnr -= 0.0 if layer in kept else COST[layer] * 2
            out.append(_layer(layer, sqnr))
        return out

    return divergence


def test_keep_float_auto_tries_the_first_divergent_layer_first_with_fewer_measurements():
    guided_calls, readings, search_calls = [], [], []
    guided = auto_keep(LAYERS, _measure(guided_calls), 30.0, None, _divergence(readings))
    search = auto_keep(LAYERS, _measure(search_calls), 30.0, None)
    assert [e["layer"] for e in guided["kept"]] == [e["layer"] for e in search["kept"]] == ["l2"]
    assert guided["after_db"] == search["after_db"] and guided["reached"] and search["reached"]
    assert guided["search"] == "first divergence" and search["search"] == "sensitivity"
    assert guided["divergence"]["layer"] == "l2" and guided["divergence"]["tried"] == "l2"
    assert (guided["measurements"], search["measurements"]) == (2, 6)  # 1 + k against 1 + L (+ k, measured)
    assert len(guided_calls) == 2 and readings == [()]
    assert guided["sensitivity"][0]["layer"] == "l2" and len(guided["sensitivity"]) == 5


def test_keep_float_auto_falls_back_to_the_sensitivity_search_when_the_divergence_misleads():
    def misleading(kept: tuple) -> list:  # names l0 and then l1, which buy too little
        return [_layer("l0", 5.0)] + [_layer(layer, 4.0) for layer in LAYERS[1:]]

    calls: list = []
    rescue = auto_keep(LAYERS, _measure(calls), 30.0, None, misleading)
    search = auto_keep(LAYERS, _measure([]), 30.0, None)
    assert rescue["search"] == "sensitivity" and rescue["kept"] == search["kept"] == [{"layer": "l2", "gain_db": 20.0}]
    assert rescue["divergence"]["layer"] == "l0" and rescue["reached"]
    assert rescue["measurements"] == len(calls) == len(set(map(frozenset, calls)))  # each set measured once


def test_a_divergence_that_fails_leaves_the_search_to_decide():
    def broken(kept: tuple) -> list:
        raise RuntimeError("export failed\ntraceback")

    rescue = auto_keep(LAYERS, _measure([]), 30.0, None, broken)
    assert rescue["divergence"] == {"error": "RuntimeError: export failed"}
    assert rescue["search"] == "sensitivity" and [e["layer"] for e in rescue["kept"]] == ["l2"]


def test_the_candidate_for_a_divergent_non_weight_layer_is_the_weight_layer_feeding_it():
    layers = [_layer("proj0", 40.0), _layer("act0", 39.0), _layer("proj1", 25.0), _layer("act1", 3.0)]
    found = first_below(layers, 20.0)
    assert found is not None and found["layer"] == "act1"
    assert named_candidate(layers, found, ["proj0", "proj1"], kept=[]) == "proj1"
    assert named_candidate(layers, found, ["proj0", "proj1"], kept=["proj1"]) == "proj0"
    assert named_candidate(layers, None, ["proj0"], kept=[]) is None


def test_a_nan_measurement_is_never_a_gain():
    def nan_after_keeping(kept: tuple) -> float:
        return 10.0 if not kept else math.nan

    rescue = auto_keep(LAYERS, nan_after_keeping, 30.0, None, _divergence([]))
    assert rescue["search"] == "sensitivity" and not rescue["reached"]
