"""What an app needs to decide whether a variant can ship to a device: its costs and its runtime.

    costs(ev) -> {"size_breakdown", "planned_bytes", "planned_peak_bytes", "planned_note",
                  "delegate_subgraphs", "program_bytes"}
    runtime(ev) -> {"executorch_version", "schema_version", "load_window": [first, last] | None}

Both read the outcome's evidence (the export's current record; etforge.builders.program_costs
measured the figures), so every manifest and the report show one set of numbers.
"""

from __future__ import annotations

from etforge.program.compat import load_window
from etforge.program.costs import planned_peak, program_bytes


def costs(ev) -> dict:
    return {
        "size_breakdown": dict(ev.size_breakdown) or None,
        "planned_bytes": {m: list(v) for m, v in ev.planned_bytes.items()} or None,
        "planned_peak_bytes": planned_peak(ev.planned_bytes),
        "planned_note": ev.planned_note,
        "delegate_subgraphs": dict(ev.delegate_subgraphs),
        "program_bytes": program_bytes(ev.size_bytes, ev.data_size),
    }


def runtime(ev, fallback_version: str = "") -> dict:
    version = ev.executorch_version or fallback_version
    window = load_window(version)
    return {
        "executorch_version": version,
        "schema_version": ev.schema_version,
        "load_window": list(window) if window else None,
    }
