"""The pure parts of the first-divergent-layer search of a quantized cell (no torch)."""

from __future__ import annotations

import math

from etforge.builders.numerics.quantized_divergence import describe, first_below, is_below
from etforge.builders.numerics.validate import describe_divergence


def _layer(name: str, sqnr, err: float = 0.1) -> dict:
    return {"layer": name, "op_target": "aten.linear.default", "sqnr_db": sqnr, "max_abs_error": err}


def test_the_first_layer_below_the_threshold_is_named_with_the_layers_after_it():
    layers = [_layer("a", 40.0), _layer("b", 31.0), _layer("c", 12.5), _layer("d", 30.0), _layer("e", 9.0)]
    found = first_below(layers, 25.0, after=2)
    assert found is not None
    assert (found["layer"], found["sqnr_db"], found["index"]) == ("c", 12.5, 2)
    assert found["after"] == [{"layer": "d", "sqnr_db": 30.0}, {"layer": "e", "sqnr_db": 9.0}]
    assert found["layers_compared"] == 5 and found["threshold_db"] == 25.0


def test_a_layer_at_the_threshold_or_identical_is_not_divergent():
    assert first_below([_layer("a", 25.0), _layer("b", None, 0.0)], 25.0) is None


def test_a_non_finite_sqnr_counts_as_divergent():
    assert is_below(math.nan, math.nan, 25.0)
    found = first_below([_layer("a", 50.0), _layer("b", math.nan, math.nan), _layer("c", 3.0)], 25.0)
    assert found is not None and found["layer"] == "b"


def test_an_all_zero_eager_layer_is_judged_by_its_absolute_error():
    assert not is_below(-math.inf, 0.0, 25.0)
    assert is_below(-math.inf, 0.5, 25.0)
    assert is_below(-math.inf, math.nan, 25.0)


def test_the_reason_phrase_names_the_layer_its_sqnr_and_the_layers_after():
    found = first_below([_layer("blocks.0", 40.0), _layer("blocks.1.proj", 0.07), _layer("head", math.nan)], 20.0)
    assert found is not None
    text = describe(found)
    assert text.startswith("first divergence at layer blocks.1.proj (aten.linear), SQNR 0.1 dB; after it: head nan dB")
    assert describe_divergence(found) == text
    assert describe_divergence({"layer": None}) == (
        "first divergence not found: every layer matches eager fp32 within the threshold"
    )
