"""How long each task's last build took, from the state records (``elapsed_s``) or the cache.

Read by ``etforge ci-matrix`` (etforge.engine.ci_plan: balancing jobs) and by the progress line of
a run on a terminal (etforge.publish.progress_line: the time left). Every number read from elsewhere
is range-checked (etforge.cache.entries seconds_of: from 0 to a week).
"""

from __future__ import annotations

from collections.abc import Mapping

from etforge.cache.entries import seconds_of
from etforge.cache.records import read_state

BUILT = ("ok", "failed")  # a record whose elapsed_s measured a build (not a restore from the cache)


def recorded_durations(specs: Mapping, build_seconds=None) -> dict:
    """task name -> seconds its last build took: from the state records of this checkout, else
    (``build_seconds``: entry key -> seconds or None) from the cache entry of its current key."""
    out = {}
    for name, spec in specs.items():
        record = read_state(spec.state_file) or {}
        built_here = not record.get("cached") and record.get("status") in BUILT
        seconds = seconds_of(record.get("elapsed_s")) if built_here else None
        if seconds is None and build_seconds is not None and spec.key:
            seconds = seconds_of(build_seconds(spec.key))
        if seconds is not None:
            out[name] = seconds
    return out
