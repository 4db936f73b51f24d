"""Benchmark results against a baseline (the last release's, say): which cells got slower.

Pure functions over ``{cell name: bench info}`` mappings; a bench info is the
benchmark task's info (``latency_p50_ms``) or a whole bench.json
(``latency_ms.p50``). :func:`p50_of` is the one reader of a p50, for the
report, the summary and the outcome's evidence alike.

This module is publishing, not measuring: it joins no benchmark's key.

A baseline file is read without trusting it (etforge.core.jsonfile, as ``etforge diff``'s
releases are): a FIFO or a device is refused without blocking, the bytes read are bounded,
and JSON nested too deep or holding an absurd number is one BadValue.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from etforge.core.atomic import atomic_write_text
from etforge.core.errors import BadValue
from etforge.core.jsonfile import parse_json, read_regular
from etforge.core.text import one_line

BASELINE_FORMAT = "etforge-bench-baseline/1"


def shown(value) -> str:
    """A value read from a file as a message shows it: a scalar's repr, cut; a list or an object by
    its kind alone (its repr may be huge, or nested too deep to make)."""
    if isinstance(value, dict | list):
        return "an object" if isinstance(value, dict) else "a list"
    return one_line(repr(value[:60] if isinstance(value, str) else value), 60)


def regressions(plan, bench: dict) -> list:
    """Rows of :func:`compare_with_baseline` against the pipeline's baseline file, if it names one."""
    baseline = plan.benchmark.baseline
    if not baseline or not (plan.root / baseline).is_file():
        return []
    return compare_with_baseline(bench, load_baseline(plan.root / baseline), plan.benchmark.regression_pct)


def _latency(entry: dict, stat: str) -> float | None:
    """``stat`` (p50, min) in ms of a benchmark result: ``<stat>_ms``, the benchmark task's info
    (``latency_<stat>_ms``) or a whole bench.json (``latency_ms.<stat>``); None unless it is a finite
    number above 0."""
    if not isinstance(entry, dict):
        return None
    value = entry.get(f"{stat}_ms", entry.get(f"latency_{stat}_ms"))
    if value is None and isinstance(entry.get("latency_ms"), dict):
        value = entry["latency_ms"].get(stat)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or not value > 0:
        return None
    return float(value)


def p50_of(entry: dict) -> float | None:
    """The p50 (ms) of a benchmark result (any of the three shapes ``_latency`` reads)."""
    return _latency(entry, "p50")


def fastest_of(entry: dict) -> float | None:
    """The fastest timed run (ms) of a benchmark result, its p50 where it records no minimum: what
    ranks variants (etforge.publish.manifests.ship_fields.platform_defaults)."""
    fastest = _latency(entry, "min")
    return fastest if fastest is not None else p50_of(entry)


def _host_id_of(entry: dict) -> str | None:
    if entry.get("host_id"):
        return entry["host_id"]
    host = entry.get("host")
    return host.get("host_id") if isinstance(host, dict) else None


def baseline_deltas(current: dict, baseline: dict) -> list:
    """One row per cell with a p50 in both mappings, sorted by cell name.

    ``change_pct`` is (current - baseline) / baseline * 100: positive is slower.
    ``same_host`` is True/False when both record a host_id, else None.
    """
    rows = []
    for name in sorted(set(current) & set(baseline)):
        now, then = p50_of(current[name]), p50_of(baseline[name])
        if now is None or then is None:
            continue
        a, b = _host_id_of(current[name]), _host_id_of(baseline[name])
        rows.append(
            {
                "cell": name,
                "baseline_p50_ms": then,
                "current_p50_ms": now,
                "change_pct": round((now - then) / then * 100.0, 2),
                "same_host": (a == b) if a and b else None,
            }
        )
    return rows


def compare_with_baseline(current: dict, baseline: dict, threshold_pct: float) -> list:
    """Cells whose p50 is more than ``threshold_pct`` percent slower than in ``baseline``.

    ``current`` and ``baseline`` map cell name -> bench info (the builder's info,
    or a whole bench.json). Cells missing from either side, or without a p50,
    are not compared. Each returned row is a ``baseline_deltas`` row plus
    ``threshold_pct`` and ``regression: True``.
    """
    if isinstance(threshold_pct, bool) or not isinstance(threshold_pct, (int, float)) or threshold_pct < 0:
        raise BadValue(f"threshold_pct: expected a number >= 0, got {threshold_pct!r}")
    return [
        {**row, "threshold_pct": threshold_pct, "regression": True}
        for row in baseline_deltas(current, baseline)
        if row["change_pct"] > threshold_pct
    ]


def baseline_document(results: dict, **meta) -> dict:
    """The baseline file's content for ``results`` (cell name -> bench info)."""
    return {"format": BASELINE_FORMAT, **meta, "cells": {k: results[k] for k in sorted(results)}}


def write_baseline(path: Path, results: dict, **meta) -> None:
    atomic_write_text(Path(path), json.dumps(baseline_document(results, **meta), indent=2, sort_keys=True) + "\n")


def load_baseline(path: Path) -> dict:
    """Read a baseline results file into {cell name: bench info}.

    Format (JSON)::

        {"format": "etforge-bench-baseline/1",
         "created": "...", "pipeline": "...", "version": "...",      (optional, free-form)
         "cells": {"small_cnn/xnnpack/fp32": {"latency_p50_ms": 0.42, "host_id": "...", ...}, ...}}

    A bare mapping {cell name: bench info} is accepted too. Each bench info is the
    benchmark task's info (``latency_p50_ms``) or a whole bench.json (``latency_ms.p50``);
    entries without a p50 (a cell that did not run) are kept and never compared.
    """
    path = Path(path)
    try:
        data = parse_json(read_regular(path))
    except OSError as exc:
        raise BadValue(f"cannot read baseline {path}: {exc.strerror}") from None
    except BadValue as exc:
        raise BadValue(f"baseline {path} {exc}") from None
    if not isinstance(data, dict):
        raise BadValue(f"baseline {path}: expected a JSON object, got {type(data).__name__}")
    if "format" in data:
        if data["format"] != BASELINE_FORMAT:
            raise BadValue(f"baseline {path}: format {shown(data['format'])}, expected {BASELINE_FORMAT!r}")
        cells = data.get("cells")
        if not isinstance(cells, dict):
            raise BadValue(f"baseline {path}: 'cells' must map cell names to bench results")
    else:
        cells = data
    for name, entry in cells.items():
        if not isinstance(entry, dict):
            raise BadValue(f"baseline {path}: cell {shown(name)}: expected an object, got {type(entry).__name__}")
        raw = entry.get("latency_p50_ms")
        if raw is None and isinstance(entry.get("latency_ms"), dict):
            raw = entry["latency_ms"].get("p50")
        if raw is not None and p50_of(entry) is None:
            raise BadValue(
                f"baseline {path}: cell {shown(name)}: p50 must be a positive number of ms, got {shown(raw)}"
            )
    return dict(cells)
