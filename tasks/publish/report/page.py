"""One self-contained HTML page for a pipeline run: the matrix table and SVG charts.

Every cell's status, reason and evidence (size, delegation, SQNR, the data it
was validated on) is its outcome (tasks/outcome.py, which the terminal summary,
manifests and release read too); latency comes from an optional benchmark
mapping (cell name -> {"p50_ms": ...}) and optional baseline regression flags. Chart geometry is
computed here; ``templates/report.html.j2`` only emits the elements, so every
label is escaped by Jinja2. The page needs no network: inline CSS, inline
SVG, no scripts. Output is deterministic (no timestamps, fixed ordering,
rounded coordinates) so an unchanged run rewrites the same bytes.

This module must not import torch or executorch.
"""

from __future__ import annotations

import hashlib
import math
from pathlib import Path

from tasks.publish import outcome
from tasks.publish import summary
from tasks.core.atomic import atomic_write_text
from tasks.core.paths import TEMPLATE_DIR

TEMPLATES_DIR = TEMPLATE_DIR
TEMPLATE = "report.html.j2"

# Okabe-Ito: distinguishable with the common colour-vision deficiencies.
SCHEME_COLOURS = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#8C6D1F", "#4D4D4D")
BACKEND_MARKERS = ("circle", "square", "diamond", "triangle", "triangle-down")
STATUS_ORDER = outcome.STATUSES
# Status -> badge style in the template; the rest look neutral.
BADGES = {"ok": "ok", "provisional": "provisional", "on-device": "on-device", "failed": "failed",
          "unexpectedly-passing": "unexpected", "expected-failure": "expected", "skipped": "skipped",
          "rejected": "rejected"}

CHAR_W = 6.4  # approximate advance of an 11px sans-serif character, for label layout


# --------------------------------------------------------------------------- formatting

def format_ms(value) -> str:
    if value is None:
        return "-"
    if value < 1:
        return f"{value:.3f} ms"
    if value < 10:
        return f"{value:.2f} ms"
    if value < 100:
        return f"{value:.1f} ms"
    return f"{value:.0f} ms"


def format_fraction(value) -> str:
    """An agreement or coverage fraction (0..1, or already a percentage) as a percentage."""
    if value is None:
        return "-"
    pct = value * 100 if value <= 1 else value
    return f"{pct:.1f}%" if pct < 100 else "100%"


def _num(value):
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) else None


def _r(x: float) -> float:
    """Coordinates rounded so the output is stable and compact."""
    return round(x, 1)


# --------------------------------------------------------------------------- data

def _flags_by_cell(baseline_flags) -> dict:
    """Regression flags (cell names, or dicts with a "cell" key) -> cell -> one-line text."""
    out: dict = {}
    for flag in baseline_flags or ():
        if isinstance(flag, str):
            out[flag] = "slower than the baseline"
            continue
        if not isinstance(flag, dict) or "cell" not in flag:
            continue
        text = next((str(flag[k]) for k in ("message", "reason", "note") if flag.get(k)), None)
        if text is None:
            pct = _num(next((flag[k] for k in ("change_pct", "slower_pct", "delta_pct", "regression_pct", "pct")
                             if k in flag), None))
            base = _num(flag.get("baseline_p50_ms"))
            text = "slower than the baseline"
            if pct is not None:
                text = f"{pct:+.0f}% vs baseline"
            if base is not None:
                text += f" (baseline p50 {format_ms(base)})"
            if _num(flag.get("threshold_pct")) is not None:
                text += f", threshold {flag['threshold_pct']:g}%"
            if flag.get("same_host") is False:
                text += ", measured on a different host"
        out[str(flag["cell"])] = text
    return out


def bench_p50(result) -> float | None:
    """p50 in ms from a benchmark mapping entry: ``p50_ms``, the benchmark task's info
    (``latency_p50_ms``) or a whole bench.json (``latency_ms.p50``)."""
    if not isinstance(result, dict):
        return None
    value = result.get("p50_ms", result.get("latency_p50_ms"))
    if value is None and isinstance(result.get("latency_ms"), dict):
        value = result["latency_ms"].get("p50")
    value = _num(value)
    return value if value is not None and value >= 0 else None


# (label, keys tried in order) for the latency cell's tooltip
BENCH_DETAILS = (("p90", ("p90_ms", "latency_p90_ms")), ("trimmed mean", ("trimmed_mean_ms", "latency_trimmed_mean_ms")),
                 ("min", ("min_ms", "latency_min_ms")), ("load", ("load_ms",)))


def _bench_title(result: dict) -> str:
    if not isinstance(result, dict):
        return ""
    nested = result.get("latency_ms") if isinstance(result.get("latency_ms"), dict) else {}
    parts = []
    for label, keys in BENCH_DETAILS:
        value = next((_num(result.get(k)) for k in keys if _num(result.get(k)) is not None), None)
        if value is None:
            value = _num(nested.get(keys[0].removesuffix("_ms")))
        if value is not None:
            parts.append(f"{label} {format_ms(value)}")
    for label, key in (("peak RSS", "peak_rss_mb"), ("threads", "threads"), ("iterations", "iterations")):
        value = result.get(key)
        if isinstance(value, (int, float, str)) and not isinstance(value, bool):
            parts.append(f"{label} {value}{' MB' if key == 'peak_rss_mb' else ''}")
    for key in ("host", "note"):
        if isinstance(result.get(key), str) and result[key]:
            parts.append(result[key])
    return "; ".join(parts)


def cell_data(plan, cell, result: outcome.CellOutcome, bench: dict, flags: dict) -> dict:
    """One table row of ``cell`` from its outcome; latency from ``bench``."""
    ev = result.evidence
    size = _num(ev.size_bytes)
    delegated, non_delegated = ev.delegated_ops, ev.non_delegated_ops
    coverage = ev.coverage
    sqnr = _num(ev.metrics.get("sqnr_db"))
    top1, top5 = _num(ev.metrics.get("top1_agreement")), _num(ev.metrics.get("top5_agreement"))
    accuracy_title = "; ".join(f"{k}: {v:.6g}" for k, v in
                               (("cosine", _num(ev.metrics.get("cosine"))),
                                ("max abs error", _num(ev.metrics.get("max_abs_error"))))
                               if v is not None)
    if ev.validated_on:
        accuracy_title = "; ".join(filter(None, [f"validated on {ev.validated_on}"
                                                 + (f" ({ev.samples} samples)" if ev.samples else ""),
                                                 accuracy_title]))
    timing = bench.get(cell.name) if isinstance(bench.get(cell.name), dict) else {}
    p50 = bench_p50(timing)
    return {
        "cell": cell.name, "model": cell.model.name, "backend": cell.backend.name,
        "quant": cell.quant.name, "quantized": cell.transform is not None,
        "status": result.status, "note": summary.outcome_row(result)["note"],
        "size_bytes": size, "size_text": summary.human_size(size),
        "sqnr_db": sqnr, "sqnr_text": summary.sqnr_text(result), "accuracy_title": accuracy_title,
        "top1": top1, "top1_text": format_fraction(top1), "top5_text": format_fraction(top5),
        "random_inputs": bool(ev.metrics) and str(ev.validated_on or "").startswith("random"),
        "p50_ms": p50, "latency_text": format_ms(p50), "bench_title": _bench_title(timing),
        "regression": flags.get(cell.name),
        "coverage": coverage, "coverage_text": format_fraction(coverage),
        "coverage_title": (f"{delegated} delegated, {non_delegated} not delegated"
                           if coverage is not None else ""),
    }


def rejected_data(rejected) -> dict:
    if isinstance(rejected, dict):  # already a summary row
        row = rejected
        model, backend, quant = (row["cell"].split("/") + ["", "", ""])[:3]
    else:
        row = summary.rejected_row(rejected)
        model, backend, quant = rejected.model, rejected.backend, rejected.quantization
    return {
        "cell": row["cell"], "model": model, "backend": backend, "quant": quant, "quantized": False,
        "status": "rejected", "note": row.get("note", ""),
        "size_bytes": None, "size_text": "-", "sqnr_db": None, "sqnr_text": "-", "accuracy_title": "",
        "top1": None, "top1_text": "-", "top5_text": "-", "random_inputs": None,
        "p50_ms": None, "latency_text": "-", "bench_title": "", "regression": None,
        "coverage": None, "coverage_text": "-", "coverage_title": "",
    }


def _order(plan):
    models = {n: i for i, n in enumerate(plan.models)}
    backends = {n: i for i, n in enumerate(plan.backends)}
    quants = {n: i for i, n in enumerate(plan.quantizations)}
    big = 1 << 20

    def key(row):
        return (models.get(row["model"], big), row["model"], backends.get(row["backend"], big),
                row["backend"], quants.get(row["quant"], big), row["quant"])
    return key


# --------------------------------------------------------------------------- chart geometry

def nice_step(span: float, target: int = 5) -> float:
    raw = span / max(target, 1)
    if raw <= 0:
        return 1.0
    exp = math.floor(math.log10(raw))
    for m in (1, 2, 2.5, 5, 10):
        step = m * 10 ** exp
        if step >= raw:
            return step
    return 10 ** (exp + 1)


def _tick_text(value: float, step: float) -> str:
    decimals = 0
    while decimals < 6 and abs(round(step, decimals) - step) > 1e-9 * step:
        decimals += 1
    return f"{value:.{decimals}f}"


def _size_text(n: float) -> str:
    unit, div = _size_unit(n)
    return f"{n / div:g} {unit}"


def _size_unit(max_bytes: float) -> tuple[str, float]:
    for unit, div in (("GB", 1 << 30), ("MB", 1 << 20), ("KB", 1 << 10)):
        if max_bytes >= div:
            return unit, float(div)
    return "B", 1.0


def bar_chart(title: str, rows: list, metric: str, backends: list, schemes: list, colours: dict) -> dict:
    """Grouped bars: one group per backend, one bar per scheme; rows lacking the metric get no bar."""
    width, height = 640, 270
    left, right, top, bottom = 62, 14, 34, 44
    plot_w, plot_h = width - left - right, height - top - bottom
    values = {r["cell"]: (r["size_bytes"] if metric == "size" else r["p50_ms"]) for r in rows}
    present = [v for v in values.values() if v is not None]
    chart = {"title": title, "metric": metric, "width": width, "height": height,
             "plot": {"x": left, "y": top, "w": plot_w, "h": plot_h},
             "bars": [], "missing": [], "groups": [], "yticks": [], "ylabel": "", "empty": not present}
    if not present:
        chart["height"] = 90  # nothing to draw: a short note, not an empty frame
        chart["plot"] = {"x": left, "y": top, "w": plot_w, "h": 90 - top - 14}
        chart["empty_text"] = ("no benchmark results for this model" if metric == "latency"
                               else "no program was built for this model")
        return chart
    if metric == "size":
        unit, div = _size_unit(max(present))
        chart["ylabel"] = f"program size ({unit})"
    else:
        unit, div = "ms", 1.0
        chart["ylabel"] = "latency p50 (ms)"
    vmax = max(present) / div
    step = nice_step(vmax, 4)
    top_value = step * math.ceil(vmax / step) if vmax > 0 else step
    for i in range(int(round(top_value / step)) + 1):
        v = i * step
        chart["yticks"].append({"y": _r(top + plot_h - v / top_value * plot_h), "text": _tick_text(v, step)})
    by_slot = {(r["backend"], r["quant"]): r for r in rows}
    group_w = plot_w / max(len(backends), 1)
    bar_w = min(40.0, group_w * 0.8 / max(len(schemes), 1))
    for gi, backend in enumerate(backends):
        gx = left + gi * group_w
        chart["groups"].append({"x": _r(gx + group_w / 2), "text": backend,
                                "sep": _r(gx) if gi else None})
        x0 = gx + (group_w - bar_w * len(schemes)) / 2
        for si, scheme in enumerate(schemes):
            row = by_slot.get((backend, scheme))
            if row is None:
                continue
            x = x0 + si * bar_w
            value = values[row["cell"]]
            if value is None:
                chart["missing"].append({"x": _r(x + bar_w / 2), "y": _r(top + plot_h - 4),
                                         "cell": row["cell"], "status": row["status"]})
                continue
            h = max(value / div / top_value * plot_h, 1.0)
            label = row["size_text"] if metric == "size" else row["latency_text"]
            chart["bars"].append({
                "x": _r(x + 1), "y": _r(top + plot_h - h), "w": _r(bar_w - 2), "h": _r(h),
                "cell": row["cell"], "status": row["status"], "colour": colours[scheme],
                "label": label.replace(" ms", "") if metric == "latency" else label.split(" ")[0],
                "show_label": bar_w >= 22, "label_y": _r(top + plot_h - h - 4),
                "title": f"{row['cell']}: {label} ({row['status']})",
                "regression": bool(row["regression"]) and metric == "latency",
            })
    return chart


def _marker_path(shape: str, x: float, y: float, s: float = 5.5) -> str:
    if shape == "square":
        return f"M{_r(x - s)},{_r(y - s)}h{_r(2 * s)}v{_r(2 * s)}h{_r(-2 * s)}z"
    if shape == "diamond":
        d = s * 1.35
        return f"M{_r(x)},{_r(y - d)}L{_r(x + d)},{_r(y)}L{_r(x)},{_r(y + d)}L{_r(x - d)},{_r(y)}z"
    if shape in ("triangle", "triangle-down"):
        d = s * 1.3 * (1 if shape == "triangle" else -1)
        return f"M{_r(x)},{_r(y - d)}L{_r(x + abs(d))},{_r(y + d * 0.8)}L{_r(x - abs(d))},{_r(y + d * 0.8)}z"
    return (f"M{_r(x - s)},{_r(y)}a{s},{s} 0 1,0 {_r(2 * s)},0"
            f"a{s},{s} 0 1,0 {_r(-2 * s)},0z")


def _overlaps(a: tuple, b: tuple) -> bool:
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


def scatter_chart(rows: list, colours: dict, markers: dict) -> dict:
    """SQNR (dB) against program size, one labelled point per quantized cell."""
    width, height = 760, 400
    left, right, top, bottom = 62, 24, 20, 48
    plot_w, plot_h = width - left - right, height - top - bottom
    candidates = [r for r in rows if r["quantized"] and r["status"] != "rejected"]
    points = [r for r in candidates if r["sqnr_db"] is not None and r["size_bytes"] is not None]
    chart = {"width": width, "height": height, "plot": {"x": left, "y": top, "w": plot_w, "h": plot_h},
             "points": [], "xticks": [], "yticks": [], "xlabel": "", "ylabel": "SQNR vs eager (dB)",
             "empty": not points,
             "omitted": [r["cell"] for r in candidates if r not in points]}
    if not points:
        return chart
    sizes = [r["size_bytes"] for r in points]
    unit, div = _size_unit(max(sizes))
    log_scale = max(sizes) / min(sizes) > 20
    chart["xlabel"] = "program size (log scale)" if log_scale else f"program size ({unit})"
    if log_scale:
        lo, hi = math.log10(min(sizes) / 1.3), math.log10(max(sizes) * 1.3)

        def sx(v):
            return left + (math.log10(v) - lo) / (hi - lo) * plot_w
        for k in range(4):  # 1, 2, 5, 10, ... 500 of B, KB, MB, GB
            for m in (1, 2, 5, 10, 20, 50, 100, 200, 500):
                v = m * 1024 ** k
                if lo <= math.log10(v) <= hi:
                    chart["xticks"].append({"x": _r(sx(v)), "text": _size_text(v)})
    else:
        xs = [s / div for s in sizes]
        span = max(xs) - min(xs) or max(xs) * 0.5 or 1.0
        step = nice_step(span * 1.2, 5)
        x_lo = max(0.0, step * math.floor((min(xs) - span * 0.1) / step))
        x_hi = step * math.ceil((max(xs) + span * 0.1) / step)

        def sx(v):
            return left + (v / div - x_lo) / (x_hi - x_lo) * plot_w
        for i in range(int(round((x_hi - x_lo) / step)) + 1):
            v = x_lo + i * step
            chart["xticks"].append({"x": _r(left + (v - x_lo) / (x_hi - x_lo) * plot_w),
                                    "text": _tick_text(v, step)})
    ys = [r["sqnr_db"] for r in points]
    yspan = max(ys) - min(ys) or 10.0
    ystep = nice_step(yspan * 1.3, 5)
    y_lo = ystep * math.floor((min(ys) - yspan * 0.15) / ystep)
    y_hi = ystep * math.ceil((max(ys) + yspan * 0.15) / ystep)

    def sy(v):
        return top + plot_h - (v - y_lo) / (y_hi - y_lo) * plot_h
    for i in range(int(round((y_hi - y_lo) / ystep)) + 1):
        v = y_lo + i * ystep
        chart["yticks"].append({"y": _r(sy(v)), "text": _tick_text(v, ystep)})
    placed: list = []
    marks = [(sx(r["size_bytes"]), sy(r["sqnr_db"])) for r in points]
    for px, py in marks:
        placed.append((px - 7, py - 7, px + 7, py + 7))
    for r, (px, py) in sorted(zip(points, marks), key=lambda item: (item[1][1], item[1][0])):
        text = r["cell"]
        w, h = len(text) * CHAR_W, 13
        options = [(9, -3), (-9 - w, -3)] + [(dx, dy) for dy in (-14, 12, -26, 24, -38, 36)
                                              for dx in (9, -w / 2, -9 - w)]
        chosen = None
        for dx, dy in options:
            box = (px + dx, py + dy - h + 3, px + dx + w, py + dy + 3)
            if box[0] < left or box[2] > left + plot_w or box[1] < top or box[3] > top + plot_h:
                continue
            if not any(_overlaps(box, other) for other in placed):
                chosen = (dx, dy, box)
                break
        if chosen is None:
            chosen = (9, -3, (px + 9, py - h, px + 9 + w, py + 3))
        dx, dy, box = chosen
        placed.append(box)
        chart["points"].append({
            "cell": r["cell"], "status": r["status"], "colour": colours[r["quant"]],
            "quant": r["quant"], "backend": r["backend"],
            "path": _marker_path(markers[r["backend"]], px, py), "label": text,
            "lx": _r(px + dx), "ly": _r(py + dy),
            "title": f"{r['cell']}: SQNR {r['sqnr_text']} dB, {r['size_text']} ({r['status']})",
        })
    chart["points"].sort(key=lambda p: p["cell"])
    return chart


# --------------------------------------------------------------------------- page

def build_context(plan, cells, rejected, bench: dict | None = None, baseline_flags: list | None = None,
                  host: dict | None = None) -> dict:
    """``host``: read the cells' benchmark records too (a failed benchmark fails its cell)."""
    bench = bench or {}
    flags = _flags_by_cell(baseline_flags)
    rows = [cell_data(plan, c, outcome.cell_outcome(plan, c, host), bench, flags) for c in cells]
    rows += [rejected_data(r) for r in rejected or ()]
    rows.sort(key=_order(plan))
    built_rows = [r for r in rows if r["status"] != "rejected"]  # only these get bars and points
    present_quants = [q for q in plan.quantizations if any(r["quant"] == q for r in built_rows)]
    present_quants += sorted({r["quant"] for r in built_rows} - set(present_quants))
    colours = {q: SCHEME_COLOURS[i % len(SCHEME_COLOURS)] for i, q in enumerate(present_quants)}
    present_backends = [b for b in plan.backends if any(r["backend"] == b for r in built_rows)]
    present_backends += sorted({r["backend"] for r in built_rows} - set(present_backends))
    markers = {b: BACKEND_MARKERS[i % len(BACKEND_MARKERS)] for i, b in enumerate(present_backends)}

    models = []
    for model in dict.fromkeys(r["model"] for r in rows):
        model_rows = [r for r in rows if r["model"] == model]
        built = [r for r in model_rows if r["status"] != "rejected"]
        backends = [b for b in present_backends if any(r["backend"] == b for r in built)]
        schemes = [q for q in present_quants if any(r["quant"] == q for r in built)]
        charts = [bar_chart(f"{model}: latency p50", built, "latency", backends, schemes, colours),
                  bar_chart(f"{model}: program size", built, "size", backends, schemes, colours)] if built else []
        models.append({"name": model, "rows": model_rows, "charts": charts})

    counts = {}
    for r in rows:
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    status_counts = [{"status": s, "n": counts[s]} for s in STATUS_ORDER if s in counts]
    status_counts += [{"status": s, "n": n} for s, n in sorted(counts.items()) if s not in STATUS_ORDER]
    known = {r["cell"] for r in rows}
    scatter = scatter_chart(rows, colours, markers)
    return {
        "name": plan.name, "version": plan.version,
        "rows": rows, "models": models, "status_counts": status_counts,
        "scheme_legend": [{"name": q, "colour": c} for q, c in colours.items()],
        "scatter": scatter,
        "scatter_schemes": [{"name": q, "colour": c} for q, c in colours.items()
                            if any(p["quant"] == q for p in scatter["points"])],
        "scatter_backends": [{"name": b, "path": _marker_path(m, 8, 8, 5)} for b, m in markers.items()
                             if any(p["backend"] == b for p in scatter["points"])],
        "has_bench": any(r["p50_ms"] is not None for r in rows),
        "random_cells": [r["cell"] for r in rows if r["random_inputs"]],
        "provisional_cells": [r["cell"] for r in rows if r["status"] == "provisional"],
        "unexpected_cells": [r["cell"] for r in rows if r["status"] == "unexpectedly-passing"],
        "badges": BADGES,
        "regressions": [{"cell": c, "text": t} for c, t in sorted(flags.items())],
        "unknown_regressions": sorted(set(flags) - known),
        "toolchain": sorted((plan.toolchain or {}).items()),
    }


def render_report(plan, cells, rejected, bench: dict | None = None, baseline_flags: list | None = None,
                  host: dict | None = None) -> str:
    import jinja2

    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATES_DIR)), autoescape=True,
                             undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True,
                             keep_trailing_newline=True)
    return env.get_template(TEMPLATE).render(**build_context(plan, cells, rejected, bench, baseline_flags, host))


def write_report(plan, cells, rejected, out_path: Path, bench: dict | None = None,
                 baseline_flags: list | None = None, host: dict | None = None) -> None:
    """Write the HTML report for ``cells`` (and the ``rejected`` combinations) to ``out_path``.

    ``bench`` maps a cell name to its benchmark results: {"p50_ms": ..., ...}, the
    benchmark task's info (``latency_p50_ms``) or a whole bench.json
    (``latency_ms.p50``). ``baseline_flags`` lists regressions: cell names, or dicts with
    "cell" and optionally "message", "change_pct", "baseline_p50_ms",
    "threshold_pct", "same_host" (the rows of benchmark.compare_with_baseline).
    Both may be None: latency then shows "-" and no latency bars are drawn.
    """
    atomic_write_text(Path(out_path), render_report(plan, cells, rejected, bench, baseline_flags, host))


# ---------------------------------------------------------------- the doit task

def benchmark_results(plan, cells, host: dict) -> dict:
    """Cell name -> benchmark info of the cells benchmarked here (their outcomes' evidence)."""
    return {o.cell: o.evidence.benchmark for o in outcome.outcomes(plan, cells, host) if o.evidence.benchmark}


def baseline_regressions(plan, bench: dict) -> list:
    """Rows of benchmark.compare_with_baseline against the pipeline's baseline file, if any."""
    baseline = plan.benchmark_baseline
    if not baseline or not (plan.root / baseline).is_file():
        return []
    from tasks.build.benchmark import compare_with_baseline, load_baseline

    return compare_with_baseline(bench, load_baseline(plan.root / baseline), plan.regression_pct)


def _render_current(plan, cells, host: dict) -> str:
    models = {c.model.name for c in cells}
    bench = benchmark_results(plan, cells, host)
    return render_report(plan, cells, [r for r in plan.rejected if r.model in models], bench,
                         baseline_regressions(plan, bench), host)


def _spec(plan, html: str):
    from tasks.engine.cached_run import CachedTask

    key = hashlib.sha256(html.encode("utf-8")).hexdigest()  # the page is a pure function of its inputs
    return CachedTask(name="report", key=key, outputs={"report.html": plan.report_path},
                      state_file=plan.state_dir / "report.json", log_file=plan.log_path("report"))


def report_up_to_date(plan, cells, store, host: dict) -> bool:
    """doit ``uptodate``: evaluated after the cells' tasks ran, so it sees their records."""
    from tasks.engine.cached_run import is_up_to_date

    try:
        return is_up_to_date(_spec(plan, _render_current(plan, cells, host)), store)
    except Exception:  # the action reports it
        return False


def run_report(plan, cells, store, host: dict) -> bool:
    from tasks.engine.cached_run import BuildResult, run_cached

    html = _render_current(plan, cells, host)

    def build(workdir: Path) -> BuildResult:
        (workdir / "report.html").write_text(html, encoding="utf-8")
        return BuildResult(files={"report.html": workdir / "report.html"}, info={"cells": len(cells)})

    return run_cached(_spec(plan, html), store, build)


def report_task(plan, cells, store, host: dict) -> dict:
    from tasks.engine.taskdicts import matrix_task_deps

    return {
        "basename": "report",
        "doc": f"write {plan.report_path.relative_to(plan.root)}: matrix, charts, numerics and latency",
        "actions": [(run_report, [plan, cells, store, host])],
        "uptodate": [(report_up_to_date, [plan, cells, store, host])],
        "task_dep": matrix_task_deps(plan, cells),
        "verbosity": 2,
    }
