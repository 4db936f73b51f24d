"""``etforge diff``: this run against a baseline release, cell by cell, with tolerances.

    compare(baseline_cells, baseline_timings, current, tolerances) -> [Change]

``current`` is etforge.publish.cell_metrics.snapshot (the same figures a release records), the
baseline is etforge.publish.diff_baseline.load's. Per cell:

    state        new, removed, ok -> failed (a lost cell), failed -> ok, provisional -> ok
    size         the program (and its breakdown where recorded), its external weights, planned memory
    checks       every figure each check records (etforge.checks: SQNR and top-k agreement on a
                 runtime and per output, delegation coverage, ...), judged by the direction and
                 the ``diff:`` tolerance the figure names (Figure.to_json): no check is named here
    latency      p50 and p90, an LLM's tokens per second (only when both timed it on one host)
    memory       peak RSS
    program      for a program whose bytes changed: the checks' structure (operators left on
                 portable kernels, ops per delegate), delegates, size breakdown, planned buffers
    inputs       thresholds and the model's definition, when they changed

A change beyond its tolerance (pipeline.yaml ``diff:``, etforge.config.defaults.DIFF_TOLERANCES)
is a regression, and so is a cell that shipped in the baseline and does not ship now; a figure
that names no tolerance is only ever "changed". Both sides are read in today's format
(etforge.publish.cell_metrics current_form).

Timings are allowed their noise, so that two clean builds of one revision on one host diff
clean. Each figure is already a median (or percentile) of repeats; a latency is a regression
only when it is slower by more than ``latency_pct`` percent plus ``noise_sigma`` times the
run-to-run spread both benchmarks measured (the root of the sum of their latency variances),
and by more than TIMER_FLOOR_MS: below that, one call timed around ``method.execute`` measures
the host more than the program. An LLM's tokens per second are judged alike: beyond
``latency_pct`` percent, and by more than TIMER_FLOOR_MS in the time of one token.
Every comparison is NaN-safe: a figure that is not a finite number is not compared.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from etforge.checks.base import finite
from etforge.program.costs import planned_peak
from etforge.publish.cell_metrics import current_form
from etforge.publish.outcome import SHIPS

REGRESSION, IMPROVEMENT, CHANGED, NEW, REMOVED = "regression", "improvement", "changed", "new", "removed"
ORDER = {REGRESSION: 0, REMOVED: 1, IMPROVEMENT: 2, NEW: 3, CHANGED: 4}
# The smallest change of a timing that is judged. The benchmark times one call of method.execute
# through the Python bindings (etforge.builders.bench.benchmark): that call costs a few us itself,
# and on a shared host a program under ~0.1 ms moves by as much as itself between clean runs
# (measured on one 2-core host, same program, same revision: linreg's p50 0.0056 and 0.0083 ms,
# a small CNN's 0.052 and 0.109 ms, another's 0.011 and 0.061 ms: shifts of the whole run that
# no run's own spread accounts for). Above it, latency_pct and the measured spread decide.
TIMER_FLOOR_MS = 0.1


@dataclass(frozen=True)
class Change:
    cell: str
    what: str  # state, size, sqnr_db, p50, program, thresholds, ...
    before: str
    after: str
    kind: str  # regression | improvement | changed | new | removed
    note: str = ""

    @property
    def fails(self) -> bool:
        return self.kind == REGRESSION


def _ships(status) -> bool:
    return status in {str(s) for s in SHIPS}


def compare(base_cells: dict, base_timings: dict, current: dict, tol: dict, base_toolchain: dict | None = None) -> list:
    """Every change between the baseline's cells and the current snapshot, cell by cell (and the
    pipeline's toolchain, under the name ``toolchain``)."""
    now_cells, now_timings = current.get("cells") or {}, current.get("timings") or {}
    out: list = toolchain(base_toolchain or {}, current.get("toolchain") or {})
    for name in sorted(base_cells.keys() | now_cells.keys()):
        before, after = base_cells.get(name), now_cells.get(name)
        if before is None and after is not None:
            out.append(Change(name, "state", "-", str(after.get("status")), NEW))
            continue
        if after is None or before is None:
            was = (before or {}).get("status")
            kind = REGRESSION if _ships(was) else REMOVED
            out.append(
                Change(name, "state", str(was), "-", kind, "cell removed" + (": a lost cell" if _ships(was) else ""))
            )
            continue
        out += _state(name, before, after)
        a, b = current_form(before.get("metrics") or {}), current_form(after.get("metrics") or {})
        if _ships(before.get("status")) and _ships(after.get("status")):
            out += _metrics(name, a, b, tol)
            out += _program(name, before.get("sha256"), after.get("sha256"), a, b)
            out += _timings(name, base_timings.get(name), now_timings.get(name), tol)
        out += _inputs(name, before, after, a, b)
    return out


def _state(name: str, before: dict, after: dict) -> list:
    a, b = str(before.get("status")), str(after.get("status"))
    if a == b:
        return []
    if _ships(a) and not _ships(b):
        return [Change(name, "state", a, b, REGRESSION, "shipped in the baseline, not now")]
    if not _ships(a) and _ships(b):
        return [Change(name, "state", a, b, IMPROVEMENT)]
    if (a, b) == ("provisional", "ok"):
        return [Change(name, "state", a, b, IMPROVEMENT, "now validated on representative data")]
    return [Change(name, "state", a, b, CHANGED)]


def _get(mapping, *path):
    for key in path:
        mapping = mapping.get(key) if isinstance(mapping, dict) else None
    return mapping


def _pct_change(name, what, a, b, pct, fmt, higher_is_worse=True, note="") -> list:
    """A change of a figure judged by a relative tolerance (``pct`` percent)."""
    a, b = finite(a), finite(b)
    if a is None or b is None or a == b:
        return []
    change = (b - a) / a * 100 if a else float("inf") if b > a else float("-inf")
    worse = change if higher_is_worse else -change
    kind = REGRESSION if worse > pct else IMPROVEMENT if -worse > pct else CHANGED
    return [Change(name, what, fmt(a), fmt(b), kind, f"{change:+.1f}% (tolerance {pct:g}%)" + note)]


def fmt_bytes(value) -> str:
    return f"{int(value):,} B"


def _metrics(name: str, a: dict, b: dict, tol: dict) -> list:
    out: list = []
    size = tol["size_pct"]
    out += _pct_change(name, "size", _get(a, "program", "bytes"), _get(b, "program", "bytes"), size, fmt_bytes)
    breakdown = _breakdown_note(_get(a, "program", "breakdown"), _get(b, "program", "breakdown"))
    if breakdown and out:
        out[-1] = Change(**{**vars(out[-1]), "note": f"{out[-1].note}; {breakdown}"})
    out += _pct_change(
        name, "external weights", _get(a, "program", "data_bytes"), _get(b, "program", "data_bytes"), size, fmt_bytes
    )
    out += _pct_change(
        name, "planned memory", _planned(a), _planned(b), size, fmt_bytes, note=", every method's buffers"
    )
    checks_a, checks_b = _get(a, "checks") or {}, _get(b, "checks") or {}
    for key in sorted(checks_a.keys() & checks_b.keys()):
        figures_a, figures_b = _get(checks_a, key, "figures") or {}, _get(checks_b, key, "figures") or {}
        for figure in [f for f in figures_b if f in figures_a]:
            out += _figure(name, figure, figures_a[figure], figures_b[figure], tol)
    return out


def _shown(figure: dict, value) -> str:
    """A figure's value as people read it: dB to 0.01, a fraction as a percentage, bytes, yes/no."""
    unit, scale = str(figure.get("unit") or ""), finite(figure.get("scale")) or 1.0
    if unit == "yes/no":
        return "yes" if value else "no"
    if unit.strip() == "dB":
        return f"{value:.2f} dB"
    if unit.strip() == "points":
        return f"{value * scale:.2f}%"
    if unit.strip() == "B":
        return fmt_bytes(value)
    return f"{value * scale:.4g}{unit}"


def _figure(name: str, what: str, fa, fb, tol: dict) -> list:
    """A change of one check figure, judged as its record says (its direction and tolerance)."""
    if not isinstance(fa, dict) or not isinstance(fb, dict):
        return []
    a, b = finite(fa.get("value")), finite(fb.get("value"))
    if a is None or b is None or a == b:
        return []
    better, tolerance = fb.get("better"), fb.get("tolerance")
    bound = finite(tol.get(tolerance)) if isinstance(tolerance, str) else None
    if better not in ("higher", "lower") or bound is None:  # shown, never judged
        return [Change(name, what, _shown(fb, a), _shown(fb, b), CHANGED)]
    if fb.get("relative"):
        return _pct_change(name, what, a, b, bound, lambda v: _shown(fb, v), higher_is_worse=better == "lower")
    unit, scale = str(fb.get("unit") or ""), finite(fb.get("scale")) or 1.0
    bound *= finite(fb.get("tolerance_scale")) or 1.0
    worse = a - b if better == "higher" else b - a
    kind = REGRESSION if worse > bound else IMPROVEMENT if -worse > bound else CHANGED
    note = f"{(b - a) * scale:+.4g}{unit} (tolerance {bound * scale:g}{unit})"
    return [Change(name, what, _shown(fb, a), _shown(fb, b), kind, note)]


def _planned(metrics: dict):
    """The largest arena a method needs: what the budget gate judges (max_planned_bytes)."""
    planned = _get(metrics, "program", "planned_bytes")
    if not isinstance(planned, dict) or not planned:
        return None
    return planned_peak({m: [finite(n) or 0 for n in v] for m, v in planned.items() if isinstance(v, list)})


def _flat(value, prefix: str = "") -> dict:
    if isinstance(value, dict):
        out: dict = {}
        for k, v in value.items():
            out.update(_flat(v, f"{prefix}{k}."))
        return out
    return {prefix[:-1]: value}


def _breakdown_note(a, b) -> str:
    if not isinstance(a, dict) or not isinstance(b, dict):
        return ""
    fa, fb = _flat(a), _flat(b)
    parts = []
    for k in sorted(fa.keys() | fb.keys()):
        va, vb = finite(fa.get(k) or 0), finite(fb.get(k) or 0)
        if k != "total" and va is not None and vb is not None and va != vb:
            parts.append(f"{k} {fmt_bytes(va)} -> {fmt_bytes(vb)}")
    return ", ".join(parts)


def _counts_note(label: str, a, b) -> list:
    a, b = (a if isinstance(a, dict) else {}), (b if isinstance(b, dict) else {})
    return [
        f"{label} {k} x{a.get(k, 0)} -> x{b.get(k, 0)}" for k in sorted(a.keys() | b.keys()) if a.get(k) != b.get(k)
    ]


def structure(a: dict, b: dict) -> str:
    """What differs in two programs' recorded structure: what each check records of it (operators
    outside delegates, ops per delegate), the delegates, the size breakdown and planned buffers
    ("" when none was recorded)."""
    parts: list = []
    checks_a, checks_b = _get(a, "checks") or {}, _get(b, "checks") or {}
    for key in sorted(checks_a.keys() & checks_b.keys()):
        sa, sb = _get(checks_a, key, "structure") or {}, _get(checks_b, key, "structure") or {}
        for label in list(sb) + [k for k in sa if k not in sb]:  # (an empty count was left out of the record)
            va, vb = sa.get(label), sb.get(label)
            if isinstance(va, dict) or isinstance(vb, dict):
                parts += _counts_note(label, va, vb)
            elif va != vb and va is not None and vb is not None:
                parts.append(f"{label} {va} -> {vb}")
    da, db = _get(a, "program", "delegates"), _get(b, "program", "delegates")
    if da != db and da is not None:
        parts.append(f"delegates {da} -> {db}")
    note = _breakdown_note(_get(a, "program", "breakdown"), _get(b, "program", "breakdown"))
    parts += [note] if note else []
    pa, pb = _get(a, "program", "planned_bytes") or {}, _get(b, "program", "planned_bytes") or {}
    for method in sorted(pa.keys() | pb.keys()) if isinstance(pa, dict) and isinstance(pb, dict) else ():
        if pa.get(method) != pb.get(method):
            parts.append(f"planned buffers of {method} {pa.get(method)} -> {pb.get(method)}")
    ca, cb = _get(a, "program", "constant_bytes"), _get(b, "program", "constant_bytes")
    if ca is not None and cb is not None and ca != cb:
        parts.append(f"constants {fmt_bytes(ca)} -> {fmt_bytes(cb)}")
    return "; ".join(parts)


def _program(name: str, a: str | None, b: str | None, metrics_a: dict, metrics_b: dict) -> list:
    if not a or not b or a == b:
        return []
    summary = structure(metrics_a, metrics_b)
    return [Change(name, "program", a[:12], b[:12], CHANGED, summary or "bytes changed; same recorded structure")]


def _inputs(name: str, before: dict, after: dict, metrics_a: dict, metrics_b: dict) -> list:
    out = []
    ta, tb = _get(before, "cell", "thresholds"), _get(after, "cell", "thresholds")
    if isinstance(ta, dict) and isinstance(tb, dict) and ta != tb:
        shown = [
            f"{k} {ta.get(k, '-')} -> {tb.get(k, '-')}" for k in sorted(ta.keys() | tb.keys()) if ta.get(k) != tb.get(k)
        ]
        out.append(Change(name, "thresholds", _kv(ta), _kv(tb), CHANGED, ", ".join(shown)))
    ka, kb = _get(metrics_a, "tools"), _get(metrics_b, "tools")
    if isinstance(ka, dict) and isinstance(kb, dict) and ka != kb:
        for k in sorted(ka.keys() | kb.keys()):
            if ka.get(k) != kb.get(k):
                out.append(Change(name, k, str(ka.get(k, "-")), str(kb.get(k, "-")), CHANGED, "a recipe's tool"))
    ma, mb = _get(metrics_a, "model_sha256"), _get(metrics_b, "model_sha256")
    if ma and mb and ma != mb:
        out.append(
            Change(name, "model", ma[:12], mb[:12], CHANGED, "the model's definition changed (code, weights or inputs)")
        )
    return out


def toolchain(before: dict, after: dict) -> list:
    """The toolchain versions that differ (torch, executorch, ...): context for every other change."""
    return [
        Change("toolchain", str(k), str(before.get(k, "-")), str(after.get(k, "-")), CHANGED)
        for k in sorted(before.keys() | after.keys())
        if before and before.get(k) != after.get(k)
    ]


def _kv(mapping: dict) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(mapping.items())) or "-"


def _timings(name: str, a, b, tol: dict) -> list:
    if not isinstance(a, dict) or not isinstance(b, dict):
        return []
    if a.get("host_id") and b.get("host_id") and a.get("host_id") != b.get("host_id"):
        return [Change(name, "latency", "-", "-", CHANGED, "timed on another host: not compared")]
    pct, sigma = tol["latency_pct"], tol["noise_sigma"]
    # the run-to-run spread each benchmark measured (its latency stdev), of the difference of the two
    spread = math.hypot(finite(a.get("latency_stdev_ms")) or 0.0, finite(b.get("latency_stdev_ms")) or 0.0)
    out = []
    for what, key in (("p50", "latency_p50_ms"), ("p90", "latency_p90_ms")):
        out += _latency(name, what, finite(a.get(key)), finite(b.get(key)), pct, sigma * spread)
    llm_a, llm_b = a.get("llm") or {}, b.get("llm") or {}
    for what, key in (("decode tok/s", "decode_tok_s"), ("prefill tok/s", "prefill_tok_s")):
        out += _rate(name, what, finite(llm_a.get(key)), finite(llm_b.get(key)), pct)
    rss_a = finite(a.get("peak_rss_mb")) or finite(llm_a.get("peak_rss_mb"))
    rss_b = finite(b.get("peak_rss_mb")) or finite(llm_b.get("peak_rss_mb"))
    out += _pct_change(name, "peak RSS", rss_a, rss_b, tol["memory_pct"], lambda v: f"{v:.1f} MB")
    return out


def _latency(name: str, what: str, a, b, pct: float, noise_ms: float) -> list:
    """A slower or faster figure (ms) beyond ``pct`` percent plus the measured noise, and beyond
    the timer floor."""
    if a is None or b is None or a <= 0 or a == b:
        return []
    change = f"{(b - a) / a * 100:+.1f}%"
    shown = f"{a:.3f} ms", f"{b:.3f} ms"
    if abs(b - a) <= TIMER_FLOOR_MS:
        return [Change(name, what, *shown, CHANGED, f"{change} (under the {TIMER_FLOOR_MS:g} ms timer floor)")]
    allowed = a * pct / 100 + noise_ms
    kind = REGRESSION if b - a > allowed else IMPROVEMENT if a - b > allowed else CHANGED
    spread = f" + {noise_ms:.3g} ms measured spread" if noise_ms else ""
    return [Change(name, what, *shown, kind, f"{change} (tolerance {pct:g}%{spread})")]


def _rate(name: str, what: str, a, b, pct: float) -> list:
    """Fewer or more tokens per second beyond ``pct`` percent, when the time of one token changed
    by more than the timer floor."""
    if a is None or b is None or a <= 0 or b <= 0 or a == b:
        return []
    change = (b - a) / a * 100
    shown = f"{a:.1f}", f"{b:.1f}"
    token_ms = abs(1000 / b - 1000 / a)  # how much longer (or shorter) one token takes
    if token_ms <= TIMER_FLOOR_MS:
        note = f"{change:+.1f}% ({token_ms:.3g} ms a token: under the {TIMER_FLOOR_MS:g} ms timer floor)"
        return [Change(name, what, *shown, CHANGED, note)]
    kind = REGRESSION if -change > pct else IMPROVEMENT if change > pct else CHANGED
    return [Change(name, what, *shown, kind, f"{change:+.1f}% (tolerance {pct:g}%)")]


def counts(changes: list) -> dict:
    out = dict.fromkeys(ORDER, 0)
    for c in changes:
        out[c.kind] += 1
    return out


def summary_line(changes: list, label: str) -> str:
    n = counts(changes)
    lost = sum(1 for c in changes if c.fails and c.what == "state")
    text = f"{n[REGRESSION]} regression(s)" + (f" ({lost} lost cell(s))" if lost else "")
    return (
        f"changes since {label}: {text}, {n[IMPROVEMENT]} improvement(s), {n[NEW]} new, "
        f"{n[REMOVED]} removed, {n[CHANGED]} other change(s)"
    )


def ordered(changes: list) -> list:
    return sorted(changes, key=lambda c: (ORDER[c.kind], c.cell, c.what))


def console_table(changes: list, label: str) -> str:
    rows = [("cell", "what", "before", "after", "", "note")]
    rows += [(c.cell, c.what, c.before, c.after, c.kind, c.note) for c in ordered(changes)]
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    lines = ["  ".join(r[i].ljust(widths[i]) for i in range(5)) + "  " + r[5] for r in rows]
    if len(rows) == 1:
        lines = ["no changes"]
    return "\n".join([summary_line(changes, label), *[line.rstrip() for line in lines]]) + "\n"


def _md(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def markdown(changes: list, label: str) -> str:
    """A CI step summary or PR comment: a heading, the counts, one table row per change."""
    lines = [f"## Changes since {_md(label)}", "", _md(summary_line(changes, label)), ""]
    if changes:
        lines += ["| cell | what | before | after | verdict | note |", "|---|---|---|---|---|---|"]
        for c in ordered(changes):
            verdict = f"**{c.kind}**" if c.fails else c.kind
            cells = (c.cell, c.what, c.before, c.after, verdict, c.note)
            lines.append("| " + " | ".join(_md(x) for x in cells) + " |")
    else:
        lines.append("No changes.")
    return "\n".join(lines) + "\n"
