"""One self-contained HTML page for a pipeline run: the matrix table and SVG charts.

Every cell's status, reason and evidence (size, delegation, SQNR, the data it
was validated on) is its outcome (etforge.publish.outcome, which the terminal summary,
manifests and release read too); latency comes from an optional benchmark
mapping (cell name -> {"p50_ms": ...}) and optional baseline regression flags. Chart geometry is
computed in etforge.publish.report.charts; ``templates/report.html.j2`` only emits
the elements, so every label is escaped by Jinja2. The page needs no network: inline CSS, inline
SVG, one inline script (the cell table's filters). Output is deterministic (no timestamps, fixed ordering,
rounded coordinates) so an unchanged run rewrites the same bytes.

This module must not import torch or executorch.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

from etforge.checks.base import finite as _num
from etforge.core.atomic import atomic_write_text
from etforge.pipeline.layout import layout_of
from etforge.pipeline.results import BuildResult
from etforge.pipeline.stage_results import ReportResult
from etforge.publish import baseline, diff_section, outcome, summary, templates
from etforge.publish.outcome_memo import RunOutcomes
from etforge.publish.report.charts import BACKEND_MARKERS, bar_chart, marker_path, scatter_chart, scheme_colours
from etforge.publish.report.cost_charts import planned_chart, size_breakdown_chart
from etforge.publish.report.cost_fields import EMPTY as COST_EMPTY
from etforge.publish.report.cost_fields import cost_fields
from etforge.publish.report.glance import glance
from etforge.publish.report.judges import judged_by
from etforge.publish.report.llm_table import COLUMNS as LLM_COLUMNS
from etforge.publish.report.llm_table import llm_rows
from etforge.publish.report.overview import overview

TEMPLATE = "report.html.j2"
STATUS_ORDER = outcome.STATUSES
# Status -> badge style in the template; the rest look neutral.
BADGES = {
    "ok": "ok",
    "provisional": "provisional",
    "on-device": "on-device",
    "failed": "failed",
    "unexpectedly-passing": "unexpected",
    "expected-failure": "expected",
    "skipped": "skipped",
    "rejected": "rejected",
}


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


# --------------------------------------------------------------------------- rows


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
            pct = _num(
                next(
                    (flag[k] for k in ("change_pct", "slower_pct", "delta_pct", "regression_pct", "pct") if k in flag),
                    None,
                )
            )
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


# (label, keys tried in order) for the latency cell's tooltip
BENCH_DETAILS = (
    ("p90", ("p90_ms", "latency_p90_ms")),
    ("trimmed mean", ("trimmed_mean_ms", "latency_trimmed_mean_ms")),
    ("min", ("min_ms", "latency_min_ms")),
    ("load", ("load_ms",)),
)


def _bench_title(result: dict) -> str:
    if not isinstance(result, dict):
        return ""
    nested = result.get("latency_ms")
    nested = nested if isinstance(nested, dict) else {}
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


def check_cells(result: outcome.CellOutcome) -> dict:
    """heading -> {"text", "title", "meter"} of each of the cell's checks (the first of a heading wins)."""
    out: dict = {}
    for check in result.facts.checks:
        meter = _num(check.meter())
        out.setdefault(check.heading(), {"text": check.text(), "title": check.detail(), "meter": meter})
    return out


def charted(result: outcome.CellOutcome) -> tuple:
    """(value, text, axis label) of the figure the accuracy-against-size chart plots, or (None, "-", "")."""
    for check in result.facts.checks:
        for figure in check.figures():
            if figure.chart and _num(figure.value) is not None:
                return figure.value, check.text(), figure.chart
    return None, "-", ""


def cell_data(plan, cell, result: outcome.CellOutcome, bench: dict, flags: dict) -> dict:
    """One table row of ``cell`` from its outcome; latency from ``bench``."""
    facts = result.facts
    program = facts.program
    size = _num(program.size_bytes) if program is not None else None
    accuracy, accuracy_text, accuracy_label = charted(result)
    timing = bench.get(cell.name)
    timing = timing if isinstance(timing, dict) else {}
    p50 = baseline.p50_of(timing)
    return {
        "cell": cell.name,
        "model": cell.model.name,
        "backend": cell.backend.name,
        "quant": cell.quant.name,
        "quantized": cell.transform is not None,
        "status": result.status,
        "note": summary.outcome_row(result, layout_of(plan).shown)["note"],
        "size_bytes": size,
        "size_text": summary.human_size(size),
        "checks": check_cells(result),
        "judged_by": [asdict(chip) for chip in judged_by(facts.checks)],  # every runtime that ran it
        "accuracy": accuracy,
        "accuracy_text": accuracy_text,
        "accuracy_label": accuracy_label,
        "random_inputs": facts.provisional,
        "p50_ms": p50,
        "fastest_ms": baseline.fastest_of(timing),  # what ranks a platform's default (overview.py)
        "latency_text": format_ms(p50),
        "bench_title": _bench_title(timing),
        "regression": flags.get(cell.name),
        **cost_fields(program),  # size breakdown, planned memory (etforge.publish.report.cost_fields)
    }


def rejected_data(rejected) -> dict:
    if isinstance(rejected, dict):  # already a summary row
        row = rejected
        model, backend, quant = (row["cell"].split("/") + ["", "", ""])[:3]
    else:
        row = summary.rejected_row(rejected)
        model, backend, quant = rejected.model, rejected.backend, rejected.quantization
    return {
        "cell": row["cell"],
        "model": model,
        "backend": backend,
        "quant": quant,
        "quantized": False,
        "status": "rejected",
        "note": row.get("note", ""),
        "size_bytes": None,
        "size_text": "-",
        "checks": {},
        "judged_by": [],
        "accuracy": None,
        "accuracy_text": "-",
        "accuracy_label": "",
        "random_inputs": None,
        "p50_ms": None,
        "fastest_ms": None,
        "latency_text": "-",
        "bench_title": "",
        "regression": None,
        **COST_EMPTY,
    }


def _order(plan):
    models = {n: i for i, n in enumerate(plan.models)}
    backends = {n: i for i, n in enumerate(plan.backends)}
    quants = {n: i for i, n in enumerate(plan.quantizations)}
    big = 1 << 20

    def key(row):
        return (
            models.get(row["model"], big),
            row["model"],
            backends.get(row["backend"], big),
            row["backend"],
            quants.get(row["quant"], big),
            row["quant"],
        )

    return key


# --------------------------------------------------------------------------- page


def profile_rows(rows: list, bench: dict, top: int = 3) -> list:
    """Per benchmarked cell, its profile: the delegate/portable split (percent of the run, for a bar),
    call counts and its ``top`` operators; ``note`` when the ETDump gave none. Shown, never gated."""
    out = []
    for row in rows:
        profile = (bench.get(row["cell"]) or {}).get("profile")
        if not isinstance(profile, dict):
            continue
        total, delegate, portable = (_num(profile.get(k)) for k in ("total_ms", "delegate_ms", "portable_ms"))
        split = [100 * v / total if total and v is not None else 0.0 for v in (delegate, portable)]
        ops = [op for op in profile.get("top") or () if isinstance(op, dict)][:top]
        out.append(
            {
                "cell": row["cell"],
                "note": profile.get("note"),
                "total": format_ms(total),
                "delegate_pct": round(split[0], 1),
                "portable_pct": round(split[1], 1),
                "calls": f"{profile.get('delegate_calls', '-')} / {profile.get('portable_calls', '-')}",
                "top": [
                    {
                        "name": op.get("name"),
                        "kind": op.get("kind"),
                        "ms": format_ms(_num(op.get("ms"))),
                        "module": op.get("module") or "",
                    }
                    for op in ops
                ],
            }
        )
    return out


def build_context(
    plan,
    cells,
    rejected,
    bench: dict | None = None,
    baseline_flags: list | None = None,
    host: dict | None = None,
    results: dict | None = None,
) -> dict:
    """``host``: read the cells' benchmark records too (a failed benchmark fails its cell); ``results``:
    their outcomes (cell name -> CellOutcome) when the caller has them already."""
    bench = bench or {}
    flags = _flags_by_cell(baseline_flags)
    results = results or {}
    rows = [cell_data(plan, c, results.get(c.name) or outcome.cell_outcome(plan, c, host), bench, flags) for c in cells]
    rows += [rejected_data(r) for r in rejected or ()]
    rows.sort(key=_order(plan))
    built_rows = [r for r in rows if r["status"] != "rejected"]  # only these get bars and points
    present_quants = [q for q in plan.quantizations if any(r["quant"] == q for r in built_rows)]
    present_quants += sorted({r["quant"] for r in built_rows} - set(present_quants))
    colours = scheme_colours(present_quants)  # every scheme its own colour
    present_backends = [b for b in plan.backends if any(r["backend"] == b for r in built_rows)]
    present_backends += sorted({r["backend"] for r in built_rows} - set(present_backends))
    markers = {b: BACKEND_MARKERS[i % len(BACKEND_MARKERS)] for i, b in enumerate(present_backends)}

    models = []
    for model in dict.fromkeys(r["model"] for r in rows):
        model_rows = [r for r in rows if r["model"] == model]
        built = [r for r in model_rows if r["status"] != "rejected"]
        backends = [b for b in present_backends if any(r["backend"] == b for r in built)]
        schemes = [q for q in present_quants if any(r["quant"] == q for r in built)]
        charts = (
            [
                bar_chart(f"{model}: latency p50", built, "latency", backends, schemes, colours),
                bar_chart(f"{model}: program size", built, "size", backends, schemes, colours),
            ]
            if built
            else []
        )
        cost_charts = (
            [
                size_breakdown_chart(f"{model}: where the bytes go", built),
                planned_chart(f"{model}: planned memory (largest method arena)", built, colours),
            ]
            if built
            else []
        )
        models.append({"name": model, "rows": model_rows, "charts": charts, "cost_charts": cost_charts})

    counts: dict = {}
    for r in rows:
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    status_counts = [{"status": s, "n": counts[s]} for s in STATUS_ORDER if s in counts]
    status_counts += [{"status": s, "n": n} for s, n in sorted(counts.items()) if s not in STATUS_ORDER]
    known = {r["cell"] for r in rows}
    scatter = scatter_chart(rows, colours, markers)
    return {
        "name": plan.name,
        "version": plan.version,
        "rows": rows,
        "models": models,
        "status_counts": status_counts,
        "scheme_legend": [{"name": q, "colour": c} for q, c in colours.items()],
        # model x backend, coloured by state, each platform's best variant marked (overview.py)
        "overview": overview(plan, rows, colours, BADGES),
        "scatter": scatter,
        "scatter_schemes": [
            {"name": q, "colour": c} for q, c in colours.items() if any(p["quant"] == q for p in scatter["points"])
        ],
        "scatter_backends": [
            {"name": b, "path": marker_path(m, 8, 8, 5)}
            for b, m in markers.items()
            if any(p["backend"] == b for p in scatter["points"])
        ],
        "llm_columns": [heading for heading, _, _ in LLM_COLUMNS],
        "llm_rows": llm_rows(rows, bench),  # the benchmark's LLM figures (etforge.publish.report.llm_table)
        "has_bench": any(r["p50_ms"] is not None for r in rows),
        "profile_rows": profile_rows(rows, bench),  # per-operator profiles (etforge.builders.bench.profile)
        "random_cells": [r["cell"] for r in rows if r["random_inputs"]],
        "provisional_cells": [r["cell"] for r in rows if r["status"] == "provisional"],
        "unexpected_cells": [r["cell"] for r in rows if r["status"] == "unexpectedly-passing"],
        "badges": BADGES,
        # one column per check heading, in the order the cells' checks first name them
        "check_headings": list(dict.fromkeys(h for r in rows for h in r["checks"])),
        "regressions": [{"cell": c, "text": t} for c, t in sorted(flags.items())],
        "unknown_regressions": sorted(set(flags) - known),
        "toolchain": sorted((plan.toolchain or {}).items()),
        **glance(rows, STATUS_ORDER),  # the notes' legend, the filters, the cells to look at first
        "changes": None,  # "changes since <baseline>": report_content fills it (etforge diff)
    }


def render_report(
    plan,
    cells,
    rejected,
    bench: dict | None = None,
    baseline_flags: list | None = None,
    host: dict | None = None,
    results: dict | None = None,
) -> str:
    """The page (``results``: the cells' outcomes, cell name -> CellOutcome, when the caller has them)."""
    return templates.render(TEMPLATE, **build_context(plan, cells, rejected, bench, baseline_flags, host, results))


def write_report(
    plan,
    cells,
    rejected,
    out_path: Path,
    bench: dict | None = None,
    baseline_flags: list | None = None,
    host: dict | None = None,
) -> None:
    """Write the HTML report for ``cells`` (and the ``rejected`` combinations) to ``out_path``.

    ``bench`` maps a cell name to its benchmark results: {"p50_ms": ..., ...}, the
    benchmark task's info (``latency_p50_ms``) or a whole bench.json
    (``latency_ms.p50``). ``baseline_flags`` lists regressions: cell names, or dicts with
    "cell" and optionally "message", "change_pct", "baseline_p50_ms",
    "threshold_pct", "same_host" (the rows of etforge.publish.baseline compare_with_baseline).
    Both may be None: latency then shows "-" and no latency bars are drawn.
    """
    atomic_write_text(Path(out_path), render_report(plan, cells, rejected, bench, baseline_flags, host))


# ---------------------------------------------------------------- the report stage


def benchmark_results(plan, cells, host: dict, outcomes: RunOutcomes | None = None) -> dict:
    """Cell name -> benchmark info of the cells benchmarked here (their outcomes' evidence)."""
    run = outcomes or RunOutcomes(plan, host)
    return {o.cell: o.facts.benchmark.to_json() for o in run.outcomes(cells) if o.facts.benchmark}


def report_content(plan, cells, host: dict, outcomes: RunOutcomes | None = None) -> dict:
    """What the report stage renders (its digest is the key): the page's context for the selected
    cells (``outcomes``: the run's, etforge.publish.outcome_memo; each cell is decided once)."""
    run = outcomes or RunOutcomes(plan, host)
    models = {c.model.name for c in cells}
    bench = benchmark_results(plan, cells, host, run)
    context = build_context(
        plan,
        cells,
        [r for r in plan.rejected if r.model in models],
        bench,
        baseline.regressions(plan, bench),
        host,
        results=run.by_name(cells),
    )
    # against the last `etforge diff`'s baseline
    context["changes"] = diff_section.changes_since(plan, cells, host, run)
    return context


def report_stage(context: dict, workdir: Path) -> BuildResult:
    """The report stage's builder: the page rendered into ``workdir``."""
    (workdir / "report.html").write_text(templates.render(TEMPLATE, **context), encoding="utf-8")
    cells = sum(1 for r in context["rows"] if r["status"] != "rejected")
    return BuildResult(files={"report.html": workdir / "report.html"}, result=ReportResult(cells=cells))
