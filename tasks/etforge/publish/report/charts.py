"""The report's SVG chart geometry: bars per backend and scheme, SQNR against size; coordinates only.

Every function returns plain data (rounded coordinates, texts, colours) that
templates/report.html.j2 turns into SVG elements, so every label is escaped by
Jinja2 and the output is deterministic. The page (etforge.publish.report.page)
decides the rows; this module only lays them out.
"""

from __future__ import annotations

import math

# Okabe-Ito (distinguishable with the common colour-vision deficiencies), then Paul Tol's muted
# scheme: 14 distinct colours; scheme_colours makes more, each its own, beyond that.
SCHEME_COLOURS = (
    "#0072B2",
    "#E69F00",
    "#009E73",
    "#CC79A7",
    "#56B4E9",
    "#D55E00",
    "#8C6D1F",
    "#4D4D4D",
    "#882255",
    "#44AA99",
    "#999933",
    "#AA4499",
    "#332288",
    "#DDCC77",
)
BACKEND_MARKERS = ("circle", "square", "diamond", "triangle", "triangle-down")
CHAR_W = 6.4  # approximate advance of an 11px sans-serif character, for label layout
VALUE_CHAR_W = 5.9  # the same for the 10px value labels above bars
LOG_RATIO = 20  # a latency chart whose slowest bar is this many times the fastest uses a log scale


def scheme_colours(names: list) -> dict:
    """A colour of its own for every scheme: the palette, then evenly spaced hues (golden angle)."""
    out = {}
    for i, name in enumerate(names):
        if i < len(SCHEME_COLOURS):
            out[name] = SCHEME_COLOURS[i]
        else:
            hue = (i * 137.508) % 360
            out[name] = f"hsl({hue:.0f}, 55%, {40 + 10 * (i % 2)}%)"
    return out


def log_ticks(lo: float, hi: float) -> list:
    """1-2-5 values within 10**lo .. 10**hi (fewer per decade when there are many decades)."""
    steps = (1, 2, 5) if hi - lo <= 3 else (1,)
    out = []
    for k in range(math.floor(lo), math.ceil(hi) + 1):
        for m in steps:
            v = m * 10.0**k
            if lo - 1e-9 <= math.log10(v) <= hi + 1e-9:
                out.append(v)
    return out


def _r(x: float) -> float:
    """Coordinates rounded so the output is stable and compact."""
    return round(x, 1)


def nice_step(span: float, target: int = 5) -> float:
    raw = span / max(target, 1)
    if raw <= 0:
        return 1.0
    exp = math.floor(math.log10(raw))
    for m in (1, 2, 2.5, 5, 10):
        step = m * 10**exp
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
    width, height = 640.0, 270
    left, right, top, bottom = 62, 14, 34, 44.0
    plot_w, plot_h = float(width - left - right), height - top - bottom
    values = {r["cell"]: (r["size_bytes"] if metric == "size" else r["p50_ms"]) for r in rows}
    present = [v for v in values.values() if v is not None]
    chart: dict = {
        "title": title,
        "metric": metric,
        "width": width,
        "height": height,
        "plot": {"x": left, "y": top, "w": plot_w, "h": plot_h},
        "bars": [],
        "missing": [],
        "groups": [],
        "yticks": [],
        "ylabel": "",
        "empty": not present,
    }
    if not present:
        chart["height"] = 90  # nothing to draw: a short note, not an empty frame
        chart["plot"] = {"x": left, "y": top, "w": plot_w, "h": 90 - top - 14}
        chart["empty_text"] = (
            "no benchmark results for this model" if metric == "latency" else "no program was built for this model"
        )
        return chart
    # Backend names under their groups never overlap: rotated when they do not fit side by side,
    # and the chart widened when even rotated ones (one line each) would not.
    longest = max((len(b) for b in backends), default=1) * CHAR_W
    rotate = longest + 8 > plot_w / max(len(backends), 1)
    if rotate:  # vertical, one line each: 18 px apart, wider than a line is tall
        plot_w = max(plot_w, 18.0 * len(backends))
        width = left + right + plot_w
        bottom = 14 + longest
        height = int(top + plot_h + bottom)
        chart.update(width=_r(width), height=height, plot={"x": left, "y": top, "w": plot_w, "h": plot_h})
    chart["rotate_groups"] = rotate
    log_scale = metric == "latency" and min(present) > 0 and max(present) / min(present) > LOG_RATIO
    chart["log_scale"] = log_scale
    if metric == "size":
        unit, div = _size_unit(max(present))
        chart["ylabel"] = f"program size ({unit})"
    else:
        unit, div = "ms", 1.0
        chart["ylabel"] = "latency p50 (ms, log scale)" if log_scale else "latency p50 (ms)"
    if log_scale:  # one slow backend would flatten every other bar: decades instead
        lo, hi = math.floor(math.log10(min(present))), math.ceil(math.log10(max(present)))
        hi = hi if hi > lo else lo + 1

        def height_of(v):
            return (math.log10(v) - lo) / (hi - lo) * plot_h

        for v in log_ticks(lo, hi):
            chart["yticks"].append({"y": _r(top + plot_h - height_of(v)), "text": f"{v:g}"})
    else:
        vmax = max(present) / div
        step = nice_step(vmax, 4)
        top_value = step * math.ceil(vmax / step) if vmax > 0 else step

        def height_of(v):
            return v / div / top_value * plot_h

        for i in range(int(round(top_value / step)) + 1):
            v = i * step
            chart["yticks"].append({"y": _r(top + plot_h - v / top_value * plot_h), "text": _tick_text(v, step)})
    by_slot = {(r["backend"], r["quant"]): r for r in rows}
    group_w = plot_w / max(len(backends), 1)
    bar_w = min(40.0, group_w * 0.8 / max(len(schemes), 1))
    for gi, backend in enumerate(backends):
        gx = left + gi * group_w
        chart["groups"].append({"x": _r(gx + group_w / 2), "text": backend, "sep": _r(gx) if gi else None})
        x0 = gx + (group_w - bar_w * len(schemes)) / 2
        for si, scheme in enumerate(schemes):
            row = by_slot.get((backend, scheme))
            if row is None:
                continue
            x = x0 + si * bar_w
            value = values[row["cell"]]
            if value is None:
                chart["missing"].append(
                    {"x": _r(x + bar_w / 2), "y": _r(top + plot_h - 4), "cell": row["cell"], "status": row["status"]}
                )
                continue
            h = max(height_of(value), 1.0)
            label = row["size_text"] if metric == "size" else row["latency_text"]
            shown = label.replace(" ms", "") if metric == "latency" else label.split(" ")[0]
            chart["bars"].append(
                {
                    "x": _r(x + 1),
                    "y": _r(top + plot_h - h),
                    "w": _r(bar_w - 2),
                    "h": _r(h),
                    "cell": row["cell"],
                    "status": row["status"],
                    "colour": colours[scheme],
                    "label": shown,
                    "show_label": len(shown) * VALUE_CHAR_W <= bar_w,  # never wider than its bar
                    "label_y": _r(top + plot_h - h - 4),
                    "title": f"{row['cell']}: {label} ({row['status']})",
                    "regression": bool(row["regression"]) and metric == "latency",
                }
            )
    return chart


def marker_path(shape: str, x: float, y: float, s: float = 5.5) -> str:
    if shape == "square":
        return f"M{_r(x - s)},{_r(y - s)}h{_r(2 * s)}v{_r(2 * s)}h{_r(-2 * s)}z"
    if shape == "diamond":
        d = s * 1.35
        return f"M{_r(x)},{_r(y - d)}L{_r(x + d)},{_r(y)}L{_r(x)},{_r(y + d)}L{_r(x - d)},{_r(y)}z"
    if shape in ("triangle", "triangle-down"):
        d = s * 1.3 * (1 if shape == "triangle" else -1)
        return f"M{_r(x)},{_r(y - d)}L{_r(x + abs(d))},{_r(y + d * 0.8)}L{_r(x - abs(d))},{_r(y + d * 0.8)}z"
    return f"M{_r(x - s)},{_r(y)}a{s},{s} 0 1,0 {_r(2 * s)},0a{s},{s} 0 1,0 {_r(-2 * s)},0z"


def _overlaps(a: tuple, b: tuple) -> bool:
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


def scatter_chart(rows: list, colours: dict, markers: dict) -> dict:
    """Accuracy (the figure a check charts: SQNR in dB) against program size, one labelled point per quantized cell."""
    width, height = 760, 400
    left, right, top, bottom = 62, 24, 20, 48
    plot_w, plot_h = width - left - right, height - top - bottom
    candidates = [r for r in rows if r["quantized"] and r["status"] != "rejected"]
    points = [r for r in candidates if r["accuracy"] is not None and r["size_bytes"] is not None]
    chart: dict = {
        "width": width,
        "height": height,
        "plot": {"x": left, "y": top, "w": plot_w, "h": plot_h},
        "points": [],
        "xticks": [],
        "yticks": [],
        "xlabel": "",
        "ylabel": next((r["accuracy_label"] for r in points), ""),
        "empty": not points,
        "omitted": [r["cell"] for r in candidates if r not in points],
        "unlabelled": [],  # points whose label found no place clear of the others
    }
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
                v = m * 1024**k
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
            chart["xticks"].append({"x": _r(left + (v - x_lo) / (x_hi - x_lo) * plot_w), "text": _tick_text(v, step)})
    ys = [r["accuracy"] for r in points]
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
    marks = [(sx(r["size_bytes"]), sy(r["accuracy"])) for r in points]
    for px, py in marks:
        placed.append((px - 7, py - 7, px + 7, py + 7))
    for r, (px, py) in sorted(zip(points, marks), key=lambda item: (item[1][1], item[1][0])):
        text = r["cell"]
        w, h = len(text) * CHAR_W, 13
        options = [(9, -3), (-9 - w, -3)] + [
            (dx, dy) for dy in (-14, 12, -26, 24, -38, 36) for dx in (9, -w / 2, -9 - w)
        ]
        chosen: tuple | None = None
        for dx, dy in options:
            box = (px + dx, py + dy - h + 3, px + dx + w, py + dy + 3)
            if box[0] < left or box[2] > left + plot_w or box[1] < top or box[3] > top + plot_h:
                continue
            if not any(_overlaps(box, other) for other in placed):
                chosen = (dx, dy, box)
                break
        dx, dy = 0.0, 0
        if chosen is None:  # no free place: no label over another; the point keeps its tooltip
            chart["unlabelled"].append(text)
            text = ""
        else:
            dx, dy, box = chosen
            placed.append(box)
        chart["points"].append(
            {
                "cell": r["cell"],
                "status": r["status"],
                "colour": colours[r["quant"]],
                "quant": r["quant"],
                "backend": r["backend"],
                "path": marker_path(markers[r["backend"]], px, py),
                "label": text,
                "lx": _r(px + dx),
                "ly": _r(py + dy),
                "title": f"{r['cell']}: {r['accuracy_label'] or 'accuracy'} {r['accuracy_text']}, {r['size_text']} "
                f"({r['status']})",
            }
        )
    chart["points"].sort(key=lambda p: p["cell"])
    chart["unlabelled"].sort()
    chart["xticks"] = spaced_ticks(chart["xticks"])
    return chart


def spaced_ticks(ticks: list, gap: float = 6.0) -> list:
    """The x ticks whose labels do not overlap the previous kept one (left to right)."""
    kept: list = []
    for t in sorted(ticks, key=lambda t: t["x"]):
        half = len(t["text"]) * CHAR_W / 2
        if kept and t["x"] - half < kept[-1]["x"] + len(kept[-1]["text"]) * CHAR_W / 2 + gap:
            continue
        kept.append(t)
    return kept
