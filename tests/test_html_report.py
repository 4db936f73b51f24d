"""The HTML report, rendered from a real run and checked in headless Chromium.

One small project is built for real (linreg, validated on seeded random inputs
only, and the small CNN, validated on data named in pipeline.yaml, on XNNPACK
and portable, fp32 and int8; a model whose factory raises, for a failed cell; a
QNN cell this host cannot lower, for a skipped one and, with int8, a refused
one). The page is then loaded in Debian's `chromium`: the test reads the DOM
after rendering and a screenshot, not just the file.

The page must read at a glance at 1,280-1,440 px. A second page of the same run, with twelve more
(rejected) backends for a 15-column overview like the default pipeline's, is loaded in a wrapper page
that iframes it and writes the layout's bounding boxes into its own DOM (Chromium's --dump-dom, no
driver): the overview scrolls inside its own box with the model column in view, nothing spills past
the window, and no two cells' text boxes overlap.
"""

from __future__ import annotations

import html as html_lib
import json
import re
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest
from conftest import check, make_project
from unit.support import report_row

from etforge.cache.records import read_state
from etforge.config.model import RejectedCell
from etforge.config.resolve import resolve
from etforge.pipeline.specs import spec_of
from etforge.publish import summary
from etforge.publish.report.charts import bar_chart, scatter_chart
from etforge.publish.report.page import format_ms, write_report

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
]
WINDOW = (1400, 2000)
WIDTHS = (1280, 1440)  # the page must work across laptop screens
EXTRA_BACKENDS = [f"npu_{i:02d}" for i in range(12)]  # with xnnpack, portable, qnn: 15 columns

PIPELINE = """\
name: t
version: 0.0.1
models:
  linreg:
    python: models.linreg:build
    inputs: [{name: features, shape: [1, 4]}]
  cnn:
    python: models.small_cnn:build
    kwargs: {num_classes: 3, width: 4}
    inputs: [{name: image, shape: [1, 3, 8, 8]}]
    validation: {npz: data/val.npz}
  broken:
    python: models.broken:build
    inputs: [{name: x, shape: [1, 4]}]
backends:
  xnnpack: {}
  portable: {}
  qnn: {}
quantization: [fp32, int8]
matrix:
  exclude: [{model: broken}, {backend: qnn}]
  include:
    - {model: broken, backend: portable, quantization: fp32}
    - {model: cnn, backend: qnn}
"""
BROKEN_FACTORY = """\
def build():
    raise RuntimeError("this factory is broken on purpose")
"""
HOSTILE = RejectedCell("cnn", "portable", "int3", "<script>document.title='pwned'</script> & <b>no</b>")
# Test-only wrapper: iframes the report at %WIDTH% px and writes its layout into <pre id="m"> as JSON
# (the overview's box and table, the model column before and after scrolling the box to its end, each
# table cell's text boxes in the headers and first rows).
MEASURE = """<!DOCTYPE html>
<html><head><meta charset="utf-8"></head><body style="margin:0">
<iframe id="f" src="%SRC%" style="border:0; width:%WIDTH%px; height:2400px"></iframe>
<pre id="m">pending</pre>
<script>
document.getElementById("f").addEventListener("load", function () {
  var d = this.contentDocument, w = this.contentWindow;
  function r(e) { var b = e.getBoundingClientRect(); return [b.left, b.top, b.right, b.bottom]; }
  function texts(cells) {
    return cells.map(function (el) {
      var range = d.createRange(); range.selectNodeContents(el);
      return Array.from(range.getClientRects()).filter(function (b) { return b.width > 0 && b.height > 0; })
        .map(function (b) { return [b.left, b.top, b.right, b.bottom]; });
    });
  }
  var box = d.getElementById("overview-box"), table = d.getElementById("overview");
  var first = table.querySelector("tbody th"), out = {};
  out.viewport = w.innerWidth; out.page_width = d.documentElement.scrollWidth;
  out.box = r(box); out.table = r(table); out.overflow = w.getComputedStyle(box).overflowX;
  out.box_client = box.clientWidth; out.box_scroll = box.scrollWidth;
  out.model_before = r(first);
  box.scrollLeft = box.scrollWidth;
  out.model_after = r(first); out.last_header_after = r(table.querySelector("thead th:last-child"));
  box.scrollLeft = 0;
  out.matrix_box = r(d.getElementById("matrix-box"));
  var rows = Array.from(d.querySelectorAll("#matrix tbody tr.cell-row")).slice(0, 8);
  out.note = r(rows[0].querySelector("td.note"));
  var cells = Array.from(d.querySelectorAll("#overview thead th, #matrix thead th"));
  Array.from(table.querySelectorAll("tbody tr")).slice(0, 3).forEach(function (tr) { cells = cells.concat(Array.from(tr.children)); });
  rows.forEach(function (tr) { cells = cells.concat(Array.from(tr.children)); });
  out.texts = texts(cells);
  // the state filter's "needs a look" choice, then back to all
  var state = d.querySelector('#filters select[data-filter="status"]');
  state.value = "attention"; state.dispatchEvent(new Event("change"));
  out.attention_rows = Array.from(d.querySelectorAll("#matrix tbody tr.cell-row"))
    .filter(function (tr) { return !tr.hidden; }).map(function (tr) { return tr.dataset.cell; });
  state.value = ""; state.dispatchEvent(new Event("change"));
  document.getElementById("m").textContent = JSON.stringify(out);
});
</script>
</body></html>
"""


class Dom(HTMLParser):
    """Elements of a dumped DOM: (tag, attrs) in order, and the text of each matrix row."""

    def __init__(self, text: str):
        super().__init__(convert_charrefs=True)
        self.elements: list = []
        self.row_text: dict = {}
        self._row = None
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        self.elements.append((tag, attrs))
        if tag == "tr" and "data-cell" in attrs:
            self._row = attrs["data-cell"]
            self.row_text[self._row] = ""
        elif tag == "tr":
            self._row = None

    def handle_endtag(self, tag):
        if tag == "tr":
            self._row = None

    def handle_data(self, data):
        if self._row is not None:
            self.row_text[self._row] += data

    def find(self, tag=None, **attrs) -> list:
        out = []
        for t, a in self.elements:
            if tag and t != tag:
                continue
            if all(
                (a.get(k.replace("_", "-")) == v) if v is not True else (k.replace("_", "-") in a)
                for k, v in attrs.items()
            ):
                out.append(a)
        return out


def chromium(url: str, profile: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(CHROMIUM), *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *args, url],
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    if not CHROMIUM.exists():
        pytest.skip("needs Debian's chromium at /usr/bin/chromium (install it with .ci/install-chromium.sh)")
    root = tmp_path_factory.mktemp("report")
    project = make_project(root / "proj", PIPELINE)
    (project.root / "models" / "broken.py").write_text(BROKEN_FACTORY)
    import numpy as np

    (project.root / "data").mkdir()
    np.savez(
        project.root / "data" / "val.npz",
        image=np.random.default_rng(5).standard_normal((4, 3, 8, 8)).astype(np.float32),
    )
    with pytest.MonkeyPatch.context() as env:
        env.delenv("QNN_SDK_ROOT", raising=False)  # qnn cells cannot be lowered here
        # Every verdict the page shows, in one worker; no benchmark task: the latencies below are
        # synthetic, and the page is written here by write_report, not by the report task.
        run = project.doit("export", "sizegate", "validate", "target")
        plan = resolve(project.pipeline)
    assert run.returncode != 0, run.stdout  # the broken model fails; every other cell still ran
    rejected = list(plan.rejected) + [HOSTILE]
    ok_cells = [c for c in plan.cells if summary.cell_row(plan, c)["status"] == "ok"]
    # Synthetic benchmark results (the benchmark task fills these for real) in the three shapes
    # the report reads: {"p50_ms"}, the benchmark task's info, a bench.json. One ok cell has none.
    shapes = (
        lambda v: {"p50_ms": v, "p90_ms": v * 1.3, "threads": 1},
        lambda v: {"latency_p50_ms": v, "latency_p90_ms": v * 1.3, "peak_rss_mb": 310.5},
        lambda v: {"latency_ms": {"p50": v, "p90": v * 1.3}, "iterations": 100},
    )
    bench = {c.name: shapes[i % 3](round(0.2 + 0.15 * i, 3)) for i, c in enumerate(ok_cells[1:])}
    flags = [
        {
            "cell": ok_cells[-1].name,
            "baseline_p50_ms": 0.5,
            "current_p50_ms": 0.59,
            "change_pct": 18.0,
            "threshold_pct": 10,
            "same_host": True,
            "regression": True,
        }
    ]
    out = root / "report.html"
    write_report(plan, plan.cells, rejected, out, bench=bench, baseline_flags=flags)
    first = out.read_bytes()
    write_report(plan, plan.cells, rejected, out, bench=bench, baseline_flags=flags)
    wide = root / "wide.html"  # as wide as the default pipeline's overview: 15 backend columns
    extra = [RejectedCell("cnn", b, "fp32", "no recipe for this backend on this host") for b in EXTRA_BACKENDS]
    write_report(plan, plan.cells, rejected + extra, wide, bench=bench, baseline_flags=flags)
    layout, shots = {}, {}
    for width in WIDTHS:
        wrapper = root / f"measure-{width}.html"
        wrapper.write_text(MEASURE.replace("%SRC%", wide.name).replace("%WIDTH%", str(width)))
        measured = chromium(
            wrapper.as_uri(),
            root / f"profile-m{width}",
            "--dump-dom",
            "--allow-file-access-from-files",  # the wrapper reads the iframed page's layout
            "--virtual-time-budget=2000",
            f"--window-size={width},2400",
        )
        found = re.search(r'<pre id="m">(.*?)</pre>', measured.stdout, re.S)
        assert found, measured.stderr[-2000:]
        layout[width] = json.loads(html_lib.unescape(found.group(1)))
        shots[width] = root / f"wide-{width}.png"
        capture = chromium(
            wide.as_uri(), root / f"profile-s{width}", f"--screenshot={shots[width]}", f"--window-size={width},1600"
        )
        assert capture.returncode == 0, capture.stderr[-2000:]
    dump = chromium(out.as_uri(), root / "profile-dom", "--dump-dom")
    assert dump.returncode == 0, dump.stderr[-2000:]
    shot = root / "report.png"
    capture = chromium(
        out.as_uri(), root / "profile-shot", f"--screenshot={shot}", f"--window-size={WINDOW[0]},{WINDOW[1]}"
    )
    assert capture.returncode == 0, capture.stderr[-2000:]
    print(f"report: {out}\nscreenshot: {shot}\nwide: {wide}, {', '.join(map(str, shots.values()))}")
    return {
        "plan": plan,
        "rejected": rejected,
        "bench": bench,
        "flags": flags,
        "html": out,
        "first": first,
        "dom": Dom(dump.stdout),
        "dom_text": dump.stdout,
        "shot": shot,
        "layout": layout,
        "shots": shots,
    }


def test_table_has_one_row_per_cell_with_its_status_and_reason(page):
    plan, dom = page["plan"], page["dom"]
    rows = {a["data-cell"]: a["data-status"] for a in dom.find("tr", data_cell=True)}
    assert len(dom.find("tr", data_cell=True)) == len(plan.cells) + len(page["rejected"])
    expected = {c.name: summary.cell_row(plan, c)["status"] for c in plan.cells}
    expected.update({r.name: "rejected" for r in page["rejected"]})
    assert rows == expected
    assert rows["cnn/xnnpack/fp32"] == "ok"  # validated on the data pipeline.yaml names
    assert rows["cnn/xnnpack/int8"] == "ok"
    assert rows["linreg/xnnpack/fp32"] == "provisional"  # on seeded random inputs only
    assert rows["broken/portable/fp32"] == "failed"
    assert rows["cnn/qnn/fp32"] == "skipped"
    assert {"ok", "provisional", "failed", "skipped", "rejected"} <= set(rows.values())
    text = dom.row_text
    assert "this factory is broken on purpose" in text["broken/portable/fp32"]
    assert "QNN_SDK_ROOT" in text["cnn/qnn/fp32"]
    for r in page["rejected"]:
        assert r.reason in " ".join(text[r.name].split()), text[r.name]
    # Escaped, never markup: the hostile reason is text; the one script is the page's own filters.
    assert [a.get("id") for a in dom.find("script")] == ["filters-js"] and not dom.find("b")
    assert "<title>t 0.0.1" in page["dom_text"]


def test_table_shows_size_accuracy_latency_and_delegation(page):
    plan, dom, bench = page["plan"], page["dom"], page["bench"]
    text = dom.row_text
    for cell in plan.cells:
        row = " ".join(text[cell.name].split())
        info = (read_state(spec_of(plan, "export", cell).state_file) or {}).get("info") or {}
        if "size_bytes" in info:
            assert summary.human_size(info["size_bytes"]) in row
            # the delegation column shows the compute share the gate judges (op counts in its title)
            pct = check(info, "delegation")["compute_coverage"] * 100
            assert (f"{pct:.1f}%" if pct < 100 else "100%") in row, row
        if cell.name in bench:
            p50 = [v for k, v in sorted(bench[cell.name].items()) if k in ("p50_ms", "latency_p50_ms")]
            p50 = p50[0] if p50 else bench[cell.name]["latency_ms"]["p50"]
            assert format_ms(p50) in row, row
        else:
            assert " ms" not in row  # missing benchmark: "-"
    for cell in plan.cells:
        sqnr = check((read_state(spec_of(plan, "validate", cell).state_file) or {}).get("info"), "numerics").get(
            "sqnr_db"
        )
        if sqnr is not None:
            assert f"{sqnr:.1f}" in text[cell.name]
    assert "random inputs" in text["linreg/xnnpack/int8"]  # validated on seeded random tensors
    assert "random inputs" not in text["cnn/xnnpack/int8"]
    assert "validated only on seeded random inputs" not in text["cnn/xnnpack/int8"]
    assert dom.find("div", id="random-inputs")
    assert "regression" in text[page["flags"][0]["cell"]]
    assert "+18% vs baseline (baseline p50 0.500 ms), threshold 10%" in page["dom_text"]


def test_charts_have_one_bar_per_measured_cell_and_one_point_per_quantized_cell(page):
    plan, dom, bench = page["plan"], page["dom"], page["bench"]
    sized = {
        c.name
        for c in plan.cells
        if "size_bytes" in ((read_state(spec_of(plan, "export", c).state_file) or {}).get("info") or {})
    }
    size_bars = {a["data-cell"] for a in dom.find("rect", data_metric="size", data_cell=True)}
    latency_bars = {a["data-cell"] for a in dom.find("rect", data_metric="latency", data_cell=True)}
    assert len(dom.find("rect", data_metric="size", data_cell=True)) == len(sized)
    assert size_bars == sized
    assert latency_bars == set(bench)
    assert {"cnn/xnnpack/fp32", "cnn/xnnpack/int8", "linreg/portable/int8"} <= size_bars
    charts = dom.find("svg", data_metric=True)
    models_with_cells = {c.model.name for c in plan.cells}
    assert len(charts) == 2 * len(models_with_cells)

    quantized = set()
    for c in plan.cells:
        vinfo = (read_state(spec_of(plan, "validate", c).state_file) or {}).get("info") or {}
        if c.transform is not None and check(vinfo, "numerics").get("sqnr_db") is not None and c.name in sized:
            quantized.add(c.name)
    points = [a["data-cell"] for a in dom.find("path", data_cell=True)]
    assert sorted(points) == sorted(quantized)
    assert {"cnn/xnnpack/int8", "cnn/portable/int8", "linreg/xnnpack/int8"} <= set(points)
    labels = {a["data-label-for"] for a in dom.find("text", data_label_for=True)}
    assert labels == quantized


def test_the_page_opens_with_the_model_backend_matrix_and_marks_the_best(page):
    plan, dom, html = page["plan"], page["dom"], page["dom_text"]
    assert html.index('id="overview"') < html.index('id="matrix"')
    rows = {a["data-cell"]: a["data-status"] for a in dom.find("tr", data_cell=True)}
    chips = {a["data-cell"]: a for a in dom.find("span", data_cell=True, data_status=True)}
    assert {c: a["data-status"] for c, a in chips.items()} == rows  # one chip per cell, coloured by its state
    assert all(a["class"].split()[1] in ("ok", "provisional", "failed", "skipped", "rejected") for a in chips.values())
    for model in ("linreg", "cnn"):  # each platform's pick is marked once per model, on a shipped variant
        marked = [a for c, a in chips.items() if c.startswith(model + "/") and "data-best-for" in a]
        platforms = [p for a in marked for p in a["data-best-for"].split()]
        assert sorted(platforms) == sorted(set(platforms)) and "linux" in platforms
        assert all(a["data-status"] in ("ok", "provisional") for a in marked)
    dots = re.findall(r'<span class="dot" style="background: ([^"]+)"></span>([\w-]+)<', html)
    by_scheme: dict = {}
    for colour, scheme in dots:
        by_scheme.setdefault(scheme, set()).add(colour)
    assert all(len(c) == 1 for c in by_scheme.values())  # one colour per scheme ...
    assert len({next(iter(c)) for c in by_scheme.values()}) == len(by_scheme)  # ... and its own
    hbars = [a for t, a in dom.elements if t == "svg" and "hbar-chart" in a.get("class", "")]
    assert len(hbars) == 2 * len({c.model.name for c in plan.cells})  # bytes and planned memory per model
    assert dom.find("g", data_cell="cnn/xnnpack/fp32")


def _overlap(a, b) -> float:
    w = min(a[2], b[2]) - max(a[0], b[0])
    h = min(a[3], b[3]) - max(a[1], b[1])
    return w * h if w > 0 and h > 0 else 0.0


def test_the_overview_fits_or_scrolls_in_its_own_box_at_laptop_widths(page):
    for width, m in page["layout"].items():
        assert m["viewport"] == width
        assert m["page_width"] <= width, (width, m["page_width"])  # nothing pushes the page sideways
        left, _, right, _ = m["box"]
        assert right <= width and m["matrix_box"][2] <= width
        if m["table"][2] > right + 0.5:  # wider than the window: it scrolls inside its box ...
            assert m["overflow"] in ("auto", "scroll") and m["box_scroll"] > m["box_client"], m
            assert m["last_header_after"][2] <= right + 1  # ... to its last backend column
            # ... with the model column fixed at the box's left edge
            assert abs(m["model_after"][0] - left) <= 1 and abs(m["model_after"][0] - m["model_before"][0]) <= 1
        assert m["note"][2] - m["note"][0] >= 250, m["note"]  # the reason column is no narrow strip
    assert page["layout"][1280]["table"][2] > page["layout"][1280]["box"][2]  # 15 columns do not fit 1,280 px


def test_no_text_overlaps_in_the_tables_at_laptop_widths(page):
    for width, m in page["layout"].items():
        boxes = [(i, b) for i, cell in enumerate(m["texts"]) for b in cell]
        assert len(m["texts"]) > 100 and len(boxes) > 100
        clashes = [
            (i, a, j, b) for k, (i, a) in enumerate(boxes) for j, b in boxes[k + 1 :] if i != j and _overlap(a, b) > 1
        ]
        assert not clashes, (width, clashes[:5])


def test_wide_page_screenshots_at_1280_and_1440(page):
    from PIL import Image

    for width, shot in page["shots"].items():
        with Image.open(shot) as img:
            assert img.size == (width, 1600)
            colours = img.convert("RGB").getcolors(maxcolors=1 << 20)
        assert colours is not None and len(colours) > 50
        assert (0xEF, 0xE6, 0xFF) in {c for _, c in colours}  # the rejected chips of the extra columns


def test_filters_and_the_cells_to_look_at_first(page):
    dom = page["dom"]
    assert {a["data-filter"] for a in dom.find("select", data_filter=True)} == {"status", "backend", "quant"}
    options = {a["value"] for a in dom.find("option", value=True)}
    assert {"failed", "skipped", "ok", "xnnpack", "qnn", "int8", "attention"} <= options
    links = [a["href"] for t, a in dom.elements if t == "a" and a.get("href", "").startswith("#cell-")]
    assert links[0] == "#cell-broken/portable/fp32"  # the failing cell, one click away
    assert dom.find("tr", id="cell-broken/portable/fp32")
    for m in page["layout"].values():  # the filter, run in Chromium: only the cells that need a look
        assert m["attention_rows"] == ["broken/portable/fp32"], m["attention_rows"]
    assert re.search(r'<span id="shown" class="sub">\d+ cell\(s\) shown</span>', page["dom_text"])


def test_notes_many_cells_share_are_said_once_in_a_legend(page):
    dom, text = page["dom"], page["dom_text"]
    shared = "validated on seeded random inputs only (name data under models.linreg.validation in pipeline.yaml)"
    shown = html_lib.unescape(re.sub(r"<[^>]*>", " ", text))  # the page's text, without tooltips
    assert shown.count(shared) == 1, shown.count(shared)  # once, in the legend
    entry = re.search(r'<div id="(N\d+)"><dt>\[N\d+\]</dt><dd>' + re.escape(shared), text)
    assert entry, "the linreg cells' shared note is not in the legend"
    tag = entry.group(1)
    for cell in ("linreg/xnnpack/fp32", "linreg/portable/int8"):
        assert f"[{tag}]" in dom.row_text[cell] and shared not in dom.row_text[cell]
    tagged = [a for a in dom.find("a", href=f"#{tag}") if a.get("title") == shared]
    assert len(tagged) >= 3
    assert "no recipe for this backend on this host" not in text  # the wide page's, not this one's


def test_judged_by_names_every_runtime_that_ran_the_cell(page):
    dom = page["dom"]
    chips = [a for a in dom.find("span", data_verdict=True)]
    assert chips and {a["data-verdict"] for a in chips} <= {"passed", "failed", "not run", "on device"}
    for cell in ("cnn/xnnpack/fp32", "linreg/xnnpack/fp32", "cnn/portable/int8"):
        row = dom.row_text[cell]
        assert "✓ host ExecuTorch" in row, row  # this host's ExecuTorch runtime judged and passed it
    titles = [a["title"] for a in chips]
    assert any(t.startswith("this host's ExecuTorch runtime: passed (validated on npz data/val.npz") for t in titles)
    assert "host ExecuTorch" not in dom.row_text["broken/portable/fp32"]  # never built: nothing ran it
    assert "host ExecuTorch" not in dom.row_text["cnn/qnn/fp32"]  # skipped: no runtime here judged it


def test_report_is_deterministic_and_self_contained(page):
    html = page["html"].read_text(encoding="utf-8")
    assert page["first"] == page["html"].read_bytes()
    assert html.count("<script") == 1 and '<script id="filters-js">' in html  # inline, nothing fetched
    for needle in ("http://", "https://", "<link", "<script src", "@import", "url(", "fetch(", "XMLHttpRequest"):
        assert needle not in html.replace('xmlns="http://www.w3.org/2000/svg"', ""), needle


def test_screenshot_shows_a_rendered_page(page):
    from PIL import Image

    shot = page["shot"]
    assert shot.is_file() and shot.stat().st_size > 10_000
    with Image.open(shot) as img:
        assert img.size == WINDOW
        rgb = img.convert("RGB")
        colours = rgb.getcolors(maxcolors=1 << 20)
    assert colours is not None and len(colours) > 50
    present = {c for _, c in colours}
    assert (0x00, 0x72, 0xB2) in present  # fp32 bars
    assert (0xE6, 0x9F, 0x00) in present  # int8 bars
    assert (0xDA, 0xFB, 0xE1) in present  # "ok" badge
    assert (0xEE, 0xF6, 0xC8) in present  # "provisional" badge
    assert (0xFF, 0xEB, 0xE9) in present  # "failed" badge
    assert (0xFF, 0xF1, 0xC2) in present  # "skipped" badge
    assert (0xEF, 0xE6, 0xFF) in present  # "rejected" badge
    # Mostly white page, but far from blank.
    white = next((n for n, c in colours if c == (255, 255, 255)), 0)
    assert white < 0.97 * WINDOW[0] * WINDOW[1]


def test_chart_geometry_without_a_browser():
    colours = {"fp32": "#0072B2", "int8": "#E69F00", "8da4w": "#009E73"}
    markers = {"xnnpack": "circle", "portable": "square"}
    rows = [
        report_row("big/xnnpack/fp32", 9_000_000, 120.0, 3.5),
        report_row("big/xnnpack/int8", 2_400_000, 31.2, 1.9),
        report_row("big/xnnpack/8da4w", 1_300_000, 24.0, None),
        report_row("tiny/portable/int8", 3_000, 40.5),
        report_row("tiny/portable/8da4w", 2_000, None, status="skipped"),
    ]
    scatter = scatter_chart(rows, colours, markers)
    assert scatter["xlabel"] == "program size (log scale)"  # KB and MB on one axis
    assert sorted(p["cell"] for p in scatter["points"]) == [
        "big/xnnpack/8da4w",
        "big/xnnpack/int8",
        "tiny/portable/int8",
    ]
    assert scatter["omitted"] == ["tiny/portable/8da4w"]
    plot = scatter["plot"]
    for p in scatter["points"]:
        x, y = (float(v) for v in re.match(r"M(-?[\d.]+),(-?[\d.]+)", p["path"]).groups())
        assert plot["x"] - 8 <= x <= plot["x"] + plot["w"] and plot["y"] - 8 <= y <= plot["y"] + plot["h"]
    big = [r for r in rows if r["model"] == "big"]
    size = bar_chart("big: size", big, "size", ["xnnpack"], ["fp32", "int8", "8da4w"], colours)
    assert [b["cell"] for b in size["bars"]] == [r["cell"] for r in big]
    assert size["ylabel"] == "program size (MB)"
    heights = [b["h"] for b in size["bars"]]
    assert heights[0] > heights[1] > heights[2] > 0
    latency = bar_chart("big: latency", big, "latency", ["xnnpack"], ["fp32", "int8", "8da4w"], colours)
    assert [b["cell"] for b in latency["bars"]] == ["big/xnnpack/fp32", "big/xnnpack/int8"]
    assert [m["cell"] for m in latency["missing"]] == ["big/xnnpack/8da4w"]
    empty = bar_chart("tiny: latency", rows[3:], "latency", ["portable"], ["int8", "8da4w"], colours)
    assert empty["empty"] and not empty["bars"]
