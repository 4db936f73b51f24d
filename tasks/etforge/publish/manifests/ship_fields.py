"""What an app needs to decide whether a variant can ship to a device: its costs and its runtime.

    costs(program) -> {"size_breakdown", "planned_bytes", "planned_peak_bytes", "planned_note",
                       "delegate_subgraphs", "program_bytes"}
    runtime(program) -> {"executorch_version", "schema_version", "load_window": [first, last] | None}
    capabilities(cell, program) -> {"min_ram_bytes", "delegates_required", recipe capability options...}
    platform_defaults(fallback, latency) -> platform -> {"variant", "ranked_by", "reason"}

All read the export's result of the outcome (its current record; etforge.builders.lowering.program_costs
measured the figures), so every manifest and the report show one set of numbers.
"""

from __future__ import annotations

from etforge.program.compat import load_window
from etforge.program.costs import min_ram_bytes, program_bytes


def costs(program) -> dict:
    c = program.costs
    return {
        "size_breakdown": dict(c.size_breakdown) or None,
        "planned_bytes": {m: list(v) for m, v in c.planned_bytes.items()} or None,
        "planned_peak_bytes": c.planned_peak,
        "planned_note": c.planned_note,
        "delegate_subgraphs": dict(c.delegate_subgraphs),
        "program_bytes": program_bytes(program.size_bytes, program.data_size_bytes),
    }


def runtime(program, fallback_version: str = "") -> dict:
    version = program.executorch_version or fallback_version
    window = load_window(version)
    return {
        "executorch_version": version,
        "schema_version": program.schema_version,
        "load_window": list(window) if window else None,
    }


def capabilities(cell, program) -> dict:
    """What a device must have to load the variant: RAM (planned memory plus constants, a lower
    bound), the delegates the program calls, and the recipe options its backend names as
    capabilities (``manifest.capabilities``: Core ML's minimum deployment target, QNN's SoC)."""
    c = program.costs
    out: dict = {
        "min_ram_bytes": min_ram_bytes(c.planned_bytes, c.size_breakdown, program.data_size_bytes),
        "delegates_required": sorted(c.delegate_subgraphs)
        or [str(d) for d in program.delegates or cell.backend.delegates],
    }
    for member in cell.backend.members:
        for name, option in (member.manifest.get("capabilities") or {}).items():
            if member.options.get(option) is not None:
                out.setdefault(name, member.options[option])
    return out


# Host latencies this close to the fastest are noise on a build host, not a ranking (benchmark repeats
# on a loaded 2-core machine differ by about this much): ties go to the declared order.
LATENCY_TIE = 0.10


def platform_defaults(fallback: dict, latency: dict) -> dict:
    """platform -> {"variant", "ranked_by", "reason"}: the variant a loader should pick first.

    ``fallback``: platform -> variant ids in the declared order (recipes' ``manifest.rank`` or
    ``manifests.platforms``); ``latency``: variant id -> its fastest timed run on the build host
    (ms, BenchmarkResult.latency_min_ms), where etforge measured it. The minimum, not the p50:
    other work on the host only ever adds time, so the fastest run is the figure a busy build
    machine disturbs least (the advice of Python's timeit), and a re-benchmark under load keeps
    the pick. When the order's first variant was measured here, the fastest measured variant is
    the default; otherwise (it runs only on the device) the declared order decides. Variants
    within ``LATENCY_TIE`` of the fastest count as ties, settled by the declared order, and no
    figure goes into the reason: a re-benchmark changes the manifests only when the pick changes.
    """
    out = {}
    for platform, ids in fallback.items():
        if not ids:
            continue
        measured = [(latency[i], n, i) for n, i in enumerate(ids) if latency.get(i) is not None]
        if measured and latency.get(ids[0]) is not None:
            fastest = min(t for t, _, _ in measured)
            _, _, best = min((n, t, i) for t, n, i in measured if t <= fastest * (1 + LATENCY_TIE))
            reason = (
                f"fastest run measured on the build host of {len(measured)} measured variant(s) "
                f"(within {LATENCY_TIE:.0%} of it, the declared order decides)"
            )
            out[platform] = {"variant": best, "ranked_by": "host latency", "reason": reason}
        else:
            why = "not measured on the build host" if not measured else "the first is not measured on the build host"
            out[platform] = {
                "variant": ids[0],
                "ranked_by": "fallback order",
                "reason": f"first in the declared {platform} fallback order ({why})",
            }
    return out
