"""The report's cost charts: where each program's bytes go, and the memory each one plans.

    size_breakdown_chart(title, rows) -> stacked horizontal bars per cell: constants, each
                                         delegate's payload, the program itself
    planned_chart(title, rows, colours) -> one horizontal bar per cell (log scale when the
                                         largest is LOG_RATIO times the smallest)

Horizontal bars, one row per cell with its name at the left: labels never overlap, whatever
the number of cells. Coordinates only; templates/report.html.j2 draws them.
"""

from __future__ import annotations

import math

from etforge.publish.report.charts import CHAR_W, LOG_RATIO, _r, _size_unit, log_ticks, nice_step, spaced_ticks
from etforge.publish.summary import human_size

ROW_H = 20
PART_COLOURS = {"constants": "#6E7781", "program": "#D0D7DE"}  # delegate payloads take DELEGATE_COLOURS
DELEGATE_COLOURS = ("#0969DA", "#8250DF", "#BF3989", "#1A7F37", "#9A6700", "#CF222E")


def _frame(title: str, labels: list, width: int = 640) -> dict:
    left = int(min(max((len(x) for x in labels), default=4) * CHAR_W + 16, 300))
    top, bottom, right = 34, 36, 16
    plot_h = ROW_H * len(labels)
    return {
        "title": title,
        "width": width,
        "height": top + plot_h + bottom,
        "plot": {"x": left, "y": top, "w": width - left - right, "h": plot_h},
        "rows": [],
        "xticks": [],
        "xlabel": "",
        "legend": [],
        "empty": not labels,
    }


def _linear_ticks(chart: dict, vmax: float, div: float) -> float:
    step = nice_step(vmax / div, 4)
    top_value = step * math.ceil(vmax / div / step) if vmax > 0 else step
    plot = chart["plot"]
    for i in range(int(round(top_value / step)) + 1):
        v = i * step
        text = f"{v:g}"
        chart["xticks"].append({"x": _r(plot["x"] + v / top_value * plot["w"]), "text": text})
    return top_value * div


def size_breakdown_chart(title: str, rows: list) -> dict:
    """Stacked bars of the cells that record a size breakdown."""
    rows = [r for r in rows if r.get("size_parts")]
    chart = _frame(title, [r["cell"] for r in rows])
    if not rows:
        chart["empty_text"] = "no program records a size breakdown"
        chart["height"] = 90
        return chart
    delegates = sorted({k for r in rows for k in r["size_parts"] if k.startswith("delegate ")})
    colours = {**PART_COLOURS, **{d: DELEGATE_COLOURS[i % len(DELEGATE_COLOURS)] for i, d in enumerate(delegates)}}
    order = ["constants", *delegates, "program"]
    chart["legend"] = [{"name": k, "colour": colours[k]} for k in order if any(k in r["size_parts"] for r in rows)]
    vmax = max(sum(r["size_parts"].values()) for r in rows)
    unit, div = _size_unit(vmax)
    full = _linear_ticks(chart, vmax, div)
    chart["xlabel"] = f"bytes in the .pte ({unit})"
    plot = chart["plot"]
    for i, r in enumerate(rows):
        y = plot["y"] + i * ROW_H
        x = float(plot["x"])
        segments = []
        for part in order:
            n = r["size_parts"].get(part)
            if not n:
                continue
            w = n / full * plot["w"]
            segments.append(
                {"x": _r(x), "w": _r(max(w, 0.5)), "colour": colours[part], "title": f"{part}: {human_size(n)}"}
            )
            x += w
        chart["rows"].append(
            {
                "cell": r["cell"],
                "y": _r(y + 3),
                "h": ROW_H - 6,
                "label_y": _r(y + ROW_H / 2 + 4),
                "segments": segments,
                "title": f"{r['cell']}: {r['size_title']}",
            }
        )
    return chart


def planned_chart(title: str, rows: list, colours: dict) -> dict:
    """Bars of the largest planned arena of each cell that records one, coloured by scheme."""
    rows = [r for r in rows if r.get("planned_bytes")]
    chart = _frame(title, [r["cell"] for r in rows])
    if not rows:
        chart["empty_text"] = "no program records its planned memory"
        chart["height"] = 90
        return chart
    values = [r["planned_bytes"] for r in rows]
    plot = chart["plot"]
    log_scale = max(values) / min(values) > LOG_RATIO
    chart["log_scale"] = log_scale
    if log_scale:
        lo, hi = math.floor(math.log10(min(values))), math.ceil(math.log10(max(values)))
        hi = hi if hi > lo else lo + 1

        def width_of(v):
            return (math.log10(v) - lo) / (hi - lo) * plot["w"]

        ticks = [v for v in log_ticks(lo, hi) if v >= 1]
        for v in ticks:
            chart["xticks"].append({"x": _r(plot["x"] + width_of(v)), "text": human_size(v).replace(".0 ", " ")})
        chart["xlabel"] = "planned bytes (log scale)"
    else:
        unit, div = _size_unit(max(values))
        full = _linear_ticks(chart, max(values), div)

        def width_of(v):
            return v / full * plot["w"]

        chart["xlabel"] = f"planned bytes ({unit})"
    chart["xticks"] = spaced_ticks(chart["xticks"])
    for i, r in enumerate(rows):
        y = plot["y"] + i * ROW_H
        w = max(width_of(r["planned_bytes"]), 1.0)
        segment = {"x": plot["x"], "w": _r(w), "colour": colours.get(r["quant"], "#8c959f"), "title": ""}
        chart["rows"].append(
            {
                "cell": r["cell"],
                "y": _r(y + 3),
                "h": ROW_H - 6,
                "label_y": _r(y + ROW_H / 2 + 4),
                "segments": [segment],
                "title": f"{r['cell']}: {r['planned_text']}"
                + (f" ({r['planned_title']})" if r["planned_title"] else ""),
            }
        )
    return chart
