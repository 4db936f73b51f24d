"""This process's memory figures from /proc/self/status (Linux), for the benchmark stages."""

from __future__ import annotations


def proc_status_bytes(*fields: str) -> dict:
    """The named fields of /proc/self/status (e.g. VmRSS, VmHWM) in bytes; empty off Linux."""
    out = {}
    try:
        with open("/proc/self/status", encoding="ascii", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key in fields:
                    out[key] = int(value.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return out
