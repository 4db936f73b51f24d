"""The report's charts and overview, laid out without a browser: log scales, labels that never
overlap, a colour per scheme, the cost charts, and each platform's best variant marked."""

from __future__ import annotations

import hashlib
import re

from etforge.cache.records import write_state
from etforge.checks.numerics import Numerics, OnDevice
from etforge.checks.size import SizeGate
from etforge.pipeline.results import TaskStatus
from etforge.pipeline.specs import spec_of
from etforge.pipeline.stage_results import (
    BenchmarkResult,
    CaptureResult,
    ExportResult,
    GateResult,
    Verdict,
)
from etforge.program.costs import ProgramCosts
from etforge.publish.outcome import cell_outcome
from etforge.publish.report.charts import CHAR_W, bar_chart, scatter_chart, scheme_colours
from etforge.publish.report.cost_charts import planned_chart, size_breakdown_chart
from etforge.publish.report.page import render_report
from unit.support import HOST, make_unit_project, report_row


def _boxes_overlap(a, b) -> bool:
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


def test_every_scheme_gets_a_colour_of_its_own():
    names = [f"s{i}" for i in range(20)]
    colours = scheme_colours(names)
    assert len(set(colours.values())) == 20


def test_one_slow_backend_puts_the_latency_chart_on_a_log_scale():
    rows = [report_row("m/xnnpack/fp32", p50=0.4), report_row("m/portable/fp32", p50=60.0)]
    chart = bar_chart("m: latency", rows, "latency", ["xnnpack", "portable"], ["fp32"], {"fp32": "#000"})
    assert chart["log_scale"] and chart["ylabel"] == "latency p50 (ms, log scale)"
    fast, slow = chart["bars"]
    assert 0.15 < fast["h"] / slow["h"] < 0.5  # linear would make it 0.007: an invisible bar
    assert [t["text"] for t in chart["yticks"]][:3] == ["0.1", "0.2", "0.5"]
    near = [report_row("m/xnnpack/fp32", p50=0.4), report_row("m/portable/fp32", p50=4.0)]
    assert not bar_chart("m", near, "latency", ["xnnpack", "portable"], ["fp32"], {"fp32": "#000"})["log_scale"]


def test_many_long_backend_names_are_turned_and_never_overlap():
    backends = [f"a_rather_long_backend_name_{i}" for i in range(14)]
    rows = [report_row(f"m/{b}/fp32", size=1000 + i) for i, b in enumerate(backends)]
    chart = bar_chart("m: size", rows, "size", backends, ["fp32"], {"fp32": "#000"})
    assert chart["rotate_groups"]
    xs = [g["x"] for g in chart["groups"]]
    assert min(b - a for a, b in zip(xs, xs[1:])) >= 13  # a turned line is ~13 px thick
    assert chart["height"] >= chart["plot"]["y"] + chart["plot"]["h"] + len(backends[0]) * CHAR_W
    few = bar_chart("m: size", rows[:2], "size", backends[:2], ["fp32"], {"fp32": "#000"})
    assert not few["rotate_groups"]
    for bar in chart["bars"]:  # a value label is drawn only where it fits its bar
        assert not bar["show_label"] or len(bar["label"]) * 5.9 <= bar["w"] + 2


def test_crowded_scatter_labels_never_overlap():
    rows = [report_row(f"m/b{i % 3}/int{i}", size=100_000 + (i % 2), sqnr=30.0) for i in range(40)]
    chart = scatter_chart(rows, {r["quant"]: "#000" for r in rows}, {f"b{i}": "circle" for i in range(3)})
    boxes = [
        (p["lx"], p["ly"] - 10, p["lx"] + len(p["label"]) * CHAR_W, p["ly"] + 3) for p in chart["points"] if p["label"]
    ]
    assert all(not _boxes_overlap(a, b) for i, a in enumerate(boxes) for b in boxes[i + 1 :])
    assert chart["unlabelled"] and len(boxes) + len(chart["unlabelled"]) == 40


def test_cost_charts_stack_the_bytes_and_log_scale_the_planned_memory():
    parts = {"constants": 96944, "delegate XnnpackBackend": 2784, "program": 2456}
    rows = [
        report_row(
            "m/xnnpack/fp32",
            size_parts=parts,
            size_title="",
            planned_bytes=12400,
            planned_text="12 KB",
            planned_title="",
        ),
        report_row(
            "m/portable/fp32",
            size_parts={"constants": 97400, "program": 6528},
            size_title="",
            planned_bytes=1048576,
            planned_text="1 MB",
            planned_title="at the maximum shape",
        ),
    ]
    sizes = size_breakdown_chart("m: bytes", rows)
    xnn = sizes["rows"][0]["segments"]
    assert len(xnn) == 3 and xnn[1]["title"] == "delegate XnnpackBackend: 2.7 KB"
    assert [x["name"] for x in sizes["legend"]] == ["constants", "delegate XnnpackBackend", "program"]
    widths = [sum(s["w"] for s in r["segments"]) for r in sizes["rows"]]
    assert abs(widths[0] / widths[1] - sum(parts.values()) / (97400 + 6528)) < 0.01
    planned = planned_chart("m: planned", rows, {"fp32": "#123456"})
    assert planned["log_scale"] and planned["xlabel"] == "planned bytes (log scale)"
    assert planned["rows"][1]["title"] == "m/portable/fp32: 1 MB (at the maximum shape)"
    ticks = planned["xticks"]
    assert all(b["x"] - a["x"] >= (len(a["text"]) + len(b["text"])) * CHAR_W / 2 for a, b in zip(ticks, ticks[1:]))


PIPELINE = """\
name: t
version: 0.0.1
models:
  a:
    python: models.a:build
    inputs: [{name: x, shape: [1, 4]}]
backends:
  xnnpack: {}
  portable: {}
  vulkan: {}
quantization: [fp32, int8]
targets: false
matrix:
  exclude: [{backend: vulkan, quantization: int8}, {backend: portable, quantization: int8}]
"""


def test_the_page_opens_with_the_matrix_and_marks_each_platforms_best(tmp_path):
    project = make_unit_project(tmp_path / "p", PIPELINE, ("a",))
    plan = project.plan()
    # (p50, fastest run): int8 is the faster program, but a busy host lifted its p50 above fp32's
    latency = {"a/xnnpack/fp32": (0.5, 0.45), "a/xnnpack/int8": (0.9, 0.28), "a/portable/fp32": (9.0, 8.7)}
    for cell in plan.cells:
        sha = hashlib.sha256(cell.name.encode()).hexdigest()

        def write(stage, result, cell=cell):
            spec = spec_of(plan, stage, cell, HOST)
            write_state(spec, TaskStatus.OK, key=None, info=result.to_json(), reason="", log=spec.log_file)

        write("capture", CaptureResult(inputs="random (seeded)"))
        if cell.transform is not None:
            write(
                "quantize", __import__("etforge.pipeline.stage_results", fromlist=["x"]).QuantizeResult(method="pt2e")
            )
            write("sizegate", GateResult(checks=(SizeGate(passed=True),)))
        write(
            "export",
            ExportResult(
                sha256=sha,
                size_bytes=1000,
                costs=ProgramCosts(
                    size_breakdown={"constants": 900, "delegates": {}, "program": 100, "total": 1000},
                    planned_bytes={"forward": [4096]},
                ),
            ),
        )
        if cell.backend.name == "vulkan":
            spec = spec_of(plan, "validate", cell, HOST)
            info = Verdict(program_sha256=sha, checks=(OnDevice(test_cases=2),)).to_json()
            write_state(spec, TaskStatus.NOT_RUNNABLE, key=None, info=info, reason="no Vulkan here", log=spec.log_file)
        else:
            check = Numerics(passed=True, inputs="npz d.npz", samples=2, sqnr_db=40.0)
            write("validate", Verdict(program_sha256=sha, checks=(check,)))
            p50, fastest = latency[cell.name]
            write("benchmark", BenchmarkResult(program_sha256=sha, latency_p50_ms=p50, latency_min_ms=fastest))
    bench = {name: {"p50_ms": p50, "min_ms": fastest} for name, (p50, fastest) in latency.items()}
    html = render_report(plan, plan.cells, plan.rejected, bench=bench, host=HOST)
    assert html.index('id="overview"') < html.index('id="matrix"')  # the matrix comes first
    chips = dict(re.findall(r'<span class="chip ([\w-]+)" data-cell="([^"]+)"', html)[i][::-1] for i in range(4))
    assert chips == {
        "a/xnnpack/fp32": "ok",
        "a/xnnpack/int8": "ok",
        "a/portable/fp32": "ok",
        "a/vulkan/fp32": "on-device",
    }
    best = dict(
        (c, p.split()) for c, p in re.findall(r'data-cell="([^"]+)" data-status="[^"]+" data-best-for="([^"]+)"', html)
    )
    assert "ios" in best["a/xnnpack/int8"]  # fastest measured where the first choice (xnnpack) was measured
    # the manifests rank by the same figure as the report (manifests/context.py): each variant's fastest run
    ranked = {c.name: cell_outcome(plan, c, HOST).facts.latency_fastest_ms for c in plan.cells}
    assert ranked == {name: fastest for name, (_, fastest) in latency.items()} | {"a/vulkan/fp32": None}
    assert {"android", "linux"} <= set(best["a/vulkan/fp32"])  # their first choice runs only on the device
    assert "where the bytes go" in html and "planned memory (largest method arena)" in html
