"""Accuracy rescue: keep_float auto keeps the most sensitive layer in float.

One tiny model, five linears, one of them deliberately fragile (an outlier weight per row on a nearly
dead input channel: its 4-bit groups round everything else away). Under 8da4w it misses a 22 dB
threshold (about 16 dB); with ``keep_float: auto`` etforge measures each layer's sensitivity, keeps
the fragile one in float (about +9 dB) and the cell passes, naming that layer in its note, its
export.json and the report. Explicit regexes are checked in-process.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from conftest import check, make_project, state

FRAGILE = """\
import torch
from torch import nn


class Fragile(nn.Module):
    def __init__(self):
        super().__init__()
        self.l0, self.l1, self.l2 = nn.Linear(64, 128), nn.Linear(128, 128), nn.Linear(128, 128)
        self.l3, self.l4 = nn.Linear(128, 64), nn.Linear(64, 10)

    def forward(self, x):
        x = torch.relu(self.l1(torch.relu(self.l0(x))))
        return self.l4(torch.relu(self.l3(torch.relu(self.l2(x)))))


def build():
    torch.manual_seed(0)
    model = Fragile()
    with torch.no_grad():
        model.l0.weight[0] *= 1e-3  # input channel 0 of l1 is nearly dead ...
        model.l0.bias[0] = 0.0
        model.l1.weight[:, 0] = 40 * model.l1.weight.std()  # ... and carries an outlier in every row
    return model
"""
PIPELINE = """\
name: t
models:
  fragile:
    python: models.fragile:build
    inputs: [{name: x, shape: [1, 64]}]
    thresholds: {8da4w: {sqnr_db: 22}}
backends:
  xnnpack: {}
quantization: [8da4w]
targets: false  # aarch64 verdicts: tests/test_aarch64_targets.py
"""
CELL = "fragile/xnnpack/8da4w"


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    project = make_project(tmp_path_factory.mktemp("rescue") / "proj", PIPELINE)
    (project.root / "models" / "fragile.py").write_text(FRAGILE)
    missed = project.doit("validate")  # the verdict is all it shows: no benchmark, manifests or report
    missed_state = state(project, f"validate:{CELL}")
    project.write_pipeline(PIPELINE + "quantization_options: {8da4w: {keep_float: auto}}\n")
    rescued = project.doit()
    return project, missed, missed_state, rescued


def summary(project) -> dict:
    return {r["cell"]: r for r in json.loads((project.out / "summary.json").read_text())}


def test_the_fragile_model_misses_its_threshold_without_rescue(runs):
    _, missed, validate, _ = runs
    assert missed.returncode == 1, missed.stdout + missed.stderr
    assert validate["status"] == "failed" and "SQNR" in validate["reason"], validate


def test_keep_float_auto_keeps_the_fragile_layer_and_the_cell_passes(runs):
    project, _, _, rescued = runs
    assert rescued.returncode == 0, rescued.stdout + rescued.stderr
    row = summary(project)[CELL]
    assert row["status"] == "provisional", row
    quantize = state(project, "quantize:fragile/8da4w/torchao_8da4w")["info"]
    rescue = quantize["rescue"]
    assert [e["layer"] for e in rescue["kept"]] == ["l1"], rescue
    assert rescue["before_db"] < 22 <= rescue["after_db"] and rescue["reached"] is True
    assert rescue["kept"][0]["gain_db"] > 5
    assert rescue["sensitivity"][0]["layer"] == "l1"  # ranked the most sensitive
    assert len(rescue["sensitivity"]) == 5
    assert quantize["layers"]["kept_float"][0]["layer"] == "l1"
    assert quantize["layers"]["quantized_layers"] == {"linear": ["l0", "l2", "l3", "l4"]}
    # named in the note and the report, with the dB it bought (the quantize record's: no copy in export.json)
    gain = f"{rescue['kept'][0]['gain_db']:+.1f} dB"
    assert f"keep_float auto kept l1 ({gain}) in float" in row["note"], row["note"]
    assert f"keep_float auto kept l1 ({gain})" in (project.out / "report.html").read_text()
    validate = state(project, f"validate:{CELL}")
    assert validate["status"] == "ok" and check(validate["info"], "numerics")["sqnr_db"] >= 22


def test_explicit_keep_float_regexes_keep_the_layers_they_name():
    torch = pytest.importorskip("torch")
    from etforge.builders.quantization.quantize import keep_float, torchao_steps

    namespace: dict = {}
    exec(FRAGILE, namespace)
    model = namespace["build"]()
    transform = SimpleNamespace(
        method="torchao",
        ref="etforge.builders.quantization.quantizers:torchao_8da4w",
        options={"group_size": 32, "keep_float": ["l[13]"]},
        fallback=None,
        group_multiple=32,
    )
    cell = SimpleNamespace(transform=transform, quant=SimpleNamespace(name="8da4w"), thresholds={}, name=CELL)
    keep, rescue = keep_float(cell, model, reference=None)
    assert rescue is None and keep == {"l1": "keep_float: matches 'l[13]'", "l3": "keep_float: matches 'l[13]'"}
    _, layers = torchao_steps("8da4w", transform, model, keep)
    assert layers["quantized_layers"] == {"linear": ["l0", "l2", "l4"]}
    assert layers["kept_float"] == [
        {"layer": "l1", "reason": "keep_float: matches 'l[13]'"},
        {"layer": "l3", "reason": "keep_float: matches 'l[13]'"},
    ]
    assert layers["taken_weight_bytes"] == {"linear": (64 * 128 + 128 * 128 + 64 * 10) * 4}
    assert isinstance(model, torch.nn.Module)


def test_keep_float_auto_on_static_int8_finds_the_fragile_layer():
    """PT2E (XNNPACK's static int8): the same search through the quantizer's node filter, in-process."""
    torch = pytest.importorskip("torch")
    import numpy as np

    from etforge.builders.capture.reference import Reference
    from etforge.builders.quantization.quantize import pt2e_keep_float, pt2e_quantize
    from etforge.builders.quantization.quantizers import xnnpack_int8_static
    from etforge.builders.quantization.rescue import eager_sqnr, without_layers

    namespace: dict = {}
    exec(FRAGILE, namespace)
    model = namespace["build"]().eval()
    generator = torch.Generator().manual_seed(0)
    samples = [torch.randn(1, 64, generator=generator) for _ in range(8)]
    with torch.no_grad():
        eager = [model(x).numpy() for x in samples]
    reference = Reference([np.stack([x.numpy() for x in samples])], [np.stack(eager)], "random (seeded)")
    program = torch.export.export(model, (samples[0],), strict=False)

    def convert(kept=()):
        quantizer = without_layers(xnnpack_int8_static({}), kept)
        return pt2e_quantize(program, (samples[0],), quantizer, [(x,) for x in samples[:4]])

    before = eager_sqnr(convert(), reference)
    transform = SimpleNamespace(options={"keep_float": "auto"})
    cell = SimpleNamespace(transform=transform, thresholds={"sqnr_db": before + 2}, name="fragile/xnnpack/int8")
    keep, rescue, layers = pt2e_keep_float(cell, program, convert, reference)
    assert list(keep) == ["l1"] and rescue["reached"], rescue
    assert rescue["sensitivity"][0]["layer"] == "l1" and rescue["kept"][0]["gain_db"] >= 2
    assert layers["kept_float"][0]["layer"] == "l1" and layers["quantized"] == 4
    assert layers["taken_weight_bytes"] == {"linear": (64 * 128 + 128 * 128 + 128 * 64 + 64 * 10) * 4}
    # the program quantized that way computes what the search measured
    converted = convert(("l1",))
    assert eager_sqnr(converted, reference) == pytest.approx(rescue["after_db"], abs=0.01)


def test_keep_float_names_layers_as_the_model_does_when_outputs_are_selected():
    torch = pytest.importorskip("torch")
    from etforge.builders.capture.output_select import select_outputs
    from etforge.builders.quantization.quantize import graph_prefix
    from etforge.builders.quantization.rescue import graph_layers

    namespace: dict = {}
    exec(FRAGILE, namespace)
    wrapped = select_outputs(namespace["build"]().eval(), [0])
    program = torch.export.export(wrapped, (torch.randn(1, 64),), strict=False)
    cell = SimpleNamespace(model=SimpleNamespace(outputs=(0,)))
    prefix = graph_prefix(cell)
    assert [name.removeprefix(prefix) for name in graph_layers(program)] == ["l0", "l1", "l2", "l3", "l4"]
    assert graph_prefix(SimpleNamespace(model=SimpleNamespace(outputs=()))) == ""
