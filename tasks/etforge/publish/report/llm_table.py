"""The report's LLM table: per benchmarked LLM cell, the figures of bench.json's ``llm`` section.

The benchmark stage (etforge.builders.llm.bench) puts them in its result's ``llm`` figures; a
cell without them (not an LLM, or not benchmarked here) has no row. Timings are shown, never gated.
"""

from __future__ import annotations

import math

# (column heading, key of the benchmark's llm figures, unit) in table order
COLUMNS = (
    ("load", "load_ms", "ms"),
    ("prompt", "prompt_len", "tokens"),
    ("prefill", "prefill_tok_s", "tok/s"),
    ("time to first token", "ttft_ms", "ms"),
    ("decode", "decode_tok_s", "tok/s"),
    ("decode step p50", "decode_step_p50_ms", "ms"),
    ("peak RSS", "peak_rss_mb", "MB"),
    ("added by the program", "peak_rss_delta_mb", "MB"),
)


def _text(value, unit: str) -> str:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return "-"
    if unit == "ms":
        return f"{value:.3g} ms" if value < 100 else f"{value:.0f} ms"
    if unit == "tokens":
        return str(int(value))
    return f"{value:,.1f} {unit}" if value < 1000 else f"{value:,.0f} {unit}"


def llm_rows(rows: list, bench: dict) -> list:
    """``[{"cell", "figures": [text per COLUMNS], "title"}]`` for the report rows benchmarked as LLMs."""
    out = []
    for row in rows:
        info = (bench.get(row["cell"]) or {}).get("llm")
        if not isinstance(info, dict) or "decode_tok_s" not in info:
            continue
        out.append(
            {
                "cell": row["cell"],
                "figures": [_text(info.get(key), unit) for _, key, unit in COLUMNS],
                "title": f"{info.get('decode_steps')} decode steps; medians over generations",
            }
        )
    return out
