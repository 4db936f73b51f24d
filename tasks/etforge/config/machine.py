"""Describe the machine a benchmark ran on, without importing torch or executorch.

``host_info()`` is what a ``bench.json`` records; ``host_fingerprint()`` is the
stable part of it (CPU, core counts, OS, architecture, runtime versions), cheap
enough to put into a benchmark task's cache key so that a result measured on
one machine is never served on another.
"""

from __future__ import annotations

import os
import platform

from etforge.config.tools import installed_version
from etforge.core.digest import digest

# Versions that change what a .pte costs to run.
RUNTIME_PACKAGES = ("executorch", "torch")


def cpu_model() -> str:
    """The CPU's marketing name from /proc/cpuinfo (x86 'model name', Arm 'Hardware'/'Model')."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            fields = {}
            for line in f:
                key, sep, value = line.partition(":")
                if sep and key.strip() not in fields:
                    fields[key.strip()] = value.strip()
    except OSError:
        fields = {}
    for key in ("model name", "Hardware", "Model", "cpu model", "Processor"):
        if fields.get(key):
            return fields[key]
    return platform.processor() or platform.machine() or "unknown"


def usable_cores() -> int:
    """Cores this process may run on (CPU affinity / cgroup cpuset), <= logical cores."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def host_fingerprint() -> dict:
    """The facts that make timings comparable: same fingerprint, same kind of machine."""
    return {
        "cpu_model": cpu_model(),
        "logical_cores": os.cpu_count() or 1,
        "usable_cores": usable_cores(),
        "machine": platform.machine(),
        "system": platform.system(),
        **{f"{p}_version": installed_version(p) for p in RUNTIME_PACKAGES},
    }


def host_id(fingerprint: dict | None = None) -> str:
    """A short digest of ``host_fingerprint()``: equal ids mean comparable hosts."""
    return digest(fingerprint or host_fingerprint())[:12]


def host_info() -> dict:
    """Everything a benchmark record says about its host (fingerprint plus context)."""
    fingerprint = host_fingerprint()
    return {
        **fingerprint,
        "host_id": host_id(fingerprint),
        "os": platform.platform(),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "python_implementation": platform.python_implementation(),
        "hostname": platform.node(),
    }


def host_label(info: dict) -> str:
    """One line for tables: 'Intel(R) Xeon(R) Processor, 2 cores, Linux x86_64'."""
    cores = info.get("usable_cores") or info.get("logical_cores")
    return f"{info.get('cpu_model', '?')}, {cores} cores, {info.get('system', '?')} {info.get('machine', '')}".strip()
