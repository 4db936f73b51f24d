"""``etforge diff``: this run against a baseline release, cell by cell, with tolerances.

    compare(baseline_cells, baseline_timings, current, tolerances) -> [Change]

``current`` is etforge.publish.cell_metrics.snapshot (the same figures a release records), the
baseline is etforge.publish.diff_baseline.load's. Per cell:

    state        new, removed, ok -> failed (a lost cell), failed -> ok, provisional -> ok
    size         the program (and its breakdown where recorded), its external weights
    numerics     the worst SQNR and top-k agreement, and each output's
    delegation   coverage
    latency      p50 and p90, an LLM's tokens per second (only when both timed it on one host)
    memory       planned memory where recorded, peak RSS
    program      for a program whose bytes changed: operators left on portable kernels, ops
                 per delegate, delegates, size breakdown, planned buffers (like diff_pte)
    inputs       thresholds and the model's definition, when they changed

A change beyond its tolerance (pipeline.yaml ``diff:``, etforge.config.defaults.DIFF_TOLERANCES)
is a regression, and so is a cell that shipped in the baseline and does not ship now. Timings
are allowed their noise: each figure is already a median (or percentile) of repeats, and the
tolerance adds ``noise_sigma`` times the baseline's own standard deviation when it recorded one.
Every comparison is NaN-safe: a figure that is not a finite number is not compared.
"""

from __future__ import annotations

from dataclasses import dataclass

from etforge.program.costs import planned_peak
from etforge.publish.outcome import SHIPS, finite

REGRESSION, IMPROVEMENT, CHANGED, NEW, REMOVED = "regression", "improvement", "changed", "new", "removed"
ORDER = {REGRESSION: 0, REMOVED: 1, IMPROVEMENT: 2, NEW: 3, CHANGED: 4}


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
        if _ships(before.get("status")) and _ships(after.get("status")):
            out += _metrics(name, before.get("metrics") or {}, after.get("metrics") or {}, tol)
            out += _program(name, before, after)
            out += _timings(name, base_timings.get(name), now_timings.get(name), tol)
        out += _inputs(name, before, after)
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


def _abs_change(name, what, a, b, bound, fmt, unit="", scale=1.0) -> list:
    """A change of a higher-is-better figure judged by an absolute tolerance (shown times ``scale``)."""
    a, b = finite(a), finite(b)
    if a is None or b is None or a == b:
        return []
    kind = REGRESSION if a - b > bound else IMPROVEMENT if b - a > bound else CHANGED
    return [
        Change(name, what, fmt(a), fmt(b), kind, f"{(b - a) * scale:+.4g}{unit} (tolerance {bound * scale:g}{unit})")
    ]


def fmt_bytes(value) -> str:
    return f"{int(value):,} B"


def _frac(value) -> str:
    return f"{value * 100:.2f}%"


def _db(value) -> str:
    return f"{value:.2f} dB"


def _metrics(name: str, a: dict, b: dict, tol: dict) -> list:
    out: list = []
    size = tol["size_pct"]
    out += _pct_change(name, "size", _get(a, "size", "bytes"), _get(b, "size", "bytes"), size, fmt_bytes)
    breakdown = _breakdown_note(_get(a, "size", "breakdown"), _get(b, "size", "breakdown"))
    if breakdown and out:
        out[-1] = Change(**{**vars(out[-1]), "note": f"{out[-1].note}; {breakdown}"})
    out += _pct_change(
        name, "external weights", _get(a, "size", "data_bytes"), _get(b, "size", "data_bytes"), size, fmt_bytes
    )
    out += _pct_change(
        name, "planned memory", _planned(a), _planned(b), size, fmt_bytes, note=", every method's buffers"
    )
    sqnr_a, sqnr_b = _get(a, "numerics", "sqnr_db"), _get(b, "numerics", "sqnr_db")
    out += _abs_change(name, "sqnr_db", sqnr_a, sqnr_b, tol["sqnr_db"], _db, " dB")
    if _get(a, "numerics", "exact") and finite(_get(b, "numerics", "sqnr_db")) is not None:
        out.append(Change(name, "sqnr_db", "exact", _db(_get(b, "numerics", "sqnr_db")), CHANGED, "no longer exact"))
    for k in ("top1_agreement", "top5_agreement"):
        out += _abs_change(name, k, _get(a, "numerics", k), _get(b, "numerics", k), tol["top_k"], _frac, " points", 100)
    outputs_a = {o.get("output"): o for o in _get(a, "numerics", "outputs") or () if isinstance(o, dict)}
    outputs_b = {o.get("output"): o for o in _get(b, "numerics", "outputs") or () if isinstance(o, dict)}
    if len(outputs_b) > 1:  # one output: the worst output's figures above already say it
        for output in sorted(outputs_a.keys() & outputs_b.keys(), key=str):
            oa, ob = outputs_a[output], outputs_b[output]
            what = f"{output} sqnr_db"
            out += _abs_change(name, what, oa.get("sqnr_db"), ob.get("sqnr_db"), tol["sqnr_db"], _db, " dB")
            for k in ("top1_agreement", "top5_agreement"):
                out += _abs_change(name, f"{output} {k}", oa.get(k), ob.get(k), tol["top_k"], _frac, " points", 100)
    out += _abs_change(
        name,
        "coverage",
        _get(a, "delegation", "coverage"),
        _get(b, "delegation", "coverage"),
        tol["coverage_pct"] / 100,
        _frac,
        " points",
        100,
    )
    return out


def _planned(metrics: dict):
    """The largest arena a method needs: what the budget gate judges (max_planned_bytes)."""
    planned = _get(metrics, "memory", "planned_bytes")
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
    """What differs in two programs' recorded structure: operators outside delegates, ops per
    delegate, the delegates, the size breakdown and planned buffers ("" when none was recorded)."""
    da, db = _get(a, "delegation") or {}, _get(b, "delegation") or {}
    parts = _counts_note("portable op", da.get("not_delegated"), db.get("not_delegated"))
    parts += _counts_note("ops delegated to", da.get("delegated_by_backend"), db.get("delegated_by_backend"))
    for k in ("delegated_ops", "non_delegated_ops", "delegated_subgraphs"):
        if da.get(k) != db.get(k) and da.get(k) is not None and db.get(k) is not None:
            parts.append(f"{k} {da.get(k)} -> {db.get(k)}")
    if da.get("delegates") != db.get("delegates") and da.get("delegates") is not None:
        parts.append(f"delegates {da.get('delegates')} -> {db.get('delegates')}")
    note = _breakdown_note(_get(a, "size", "breakdown"), _get(b, "size", "breakdown"))
    parts += [note] if note else []
    pa, pb = _get(a, "memory", "planned_bytes") or {}, _get(b, "memory", "planned_bytes") or {}
    for method in sorted(pa.keys() | pb.keys()) if isinstance(pa, dict) and isinstance(pb, dict) else ():
        if pa.get(method) != pb.get(method):
            parts.append(f"planned buffers of {method} {pa.get(method)} -> {pb.get(method)}")
    ca, cb = _get(a, "size", "constant_bytes"), _get(b, "size", "constant_bytes")
    if ca is not None and cb is not None and ca != cb:
        parts.append(f"constants {fmt_bytes(ca)} -> {fmt_bytes(cb)}")
    return "; ".join(parts)


def _program(name: str, before: dict, after: dict) -> list:
    a, b = before.get("sha256"), after.get("sha256")
    if not a or not b or a == b:
        return []
    summary = structure(before.get("metrics") or {}, after.get("metrics") or {})
    return [Change(name, "program", a[:12], b[:12], CHANGED, summary or "bytes changed; same recorded structure")]


def _inputs(name: str, before: dict, after: dict) -> list:
    out = []
    ta, tb = _get(before, "cell", "thresholds"), _get(after, "cell", "thresholds")
    if isinstance(ta, dict) and isinstance(tb, dict) and ta != tb:
        shown = [
            f"{k} {ta.get(k, '-')} -> {tb.get(k, '-')}" for k in sorted(ta.keys() | tb.keys()) if ta.get(k) != tb.get(k)
        ]
        out.append(Change(name, "thresholds", _kv(ta), _kv(tb), CHANGED, ", ".join(shown)))
    ka, kb = _get(before, "metrics", "tools"), _get(after, "metrics", "tools")
    if isinstance(ka, dict) and isinstance(kb, dict) and ka != kb:
        for k in sorted(ka.keys() | kb.keys()):
            if ka.get(k) != kb.get(k):
                out.append(Change(name, k, str(ka.get(k, "-")), str(kb.get(k, "-")), CHANGED, "a recipe's tool"))
    ma, mb = _get(before, "metrics", "model_sha256"), _get(after, "metrics", "model_sha256")
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
    spread = finite(a.get("latency_stdev_ms")) or 0.0
    out = []
    for what, key in (("p50", "latency_p50_ms"), ("p90", "latency_p90_ms")):
        out += _latency(name, what, finite(a.get(key)), finite(b.get(key)), pct, sigma * spread)
    llm_a, llm_b = a.get("llm") or {}, b.get("llm") or {}
    for what, key in (("decode tok/s", "decode_tok_s"), ("prefill tok/s", "prefill_tok_s")):
        out += _pct_change(name, what, llm_a.get(key), llm_b.get(key), pct, lambda v: f"{v:.1f}", False)
    rss_a = finite(a.get("peak_rss_mb")) or finite(llm_a.get("peak_rss_mb"))
    rss_b = finite(b.get("peak_rss_mb")) or finite(llm_b.get("peak_rss_mb"))
    out += _pct_change(name, "peak RSS", rss_a, rss_b, tol["memory_pct"], lambda v: f"{v:.1f} MB")
    return out


def _latency(name: str, what: str, a, b, pct: float, noise_ms: float) -> list:
    """A slower or faster figure beyond ``pct`` percent plus the baseline's noise allowance."""
    if a is None or b is None or a <= 0 or a == b:
        return []
    allowed = a * pct / 100 + noise_ms
    kind = REGRESSION if b - a > allowed else IMPROVEMENT if a - b > allowed else CHANGED
    note = f"{(b - a) / a * 100:+.1f}% (tolerance {pct:g}%" + (f" + {noise_ms:.3g} ms noise)" if noise_ms else ")")
    return [Change(name, what, f"{a:.3f} ms", f"{b:.3f} ms", kind, note)]


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
