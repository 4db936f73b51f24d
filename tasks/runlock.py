"""One doit run per checkout at a time: a second run waits, saying for whom."""

from __future__ import annotations

import fcntl
import os
import sys
from pathlib import Path


def acquire(lock_file: Path, out=sys.stdout):
    """Block until this process holds the run lock; return the open file (keep it open)."""
    lock_file.parent.mkdir(parents=True, exist_ok=True)
    handle = open(lock_file, "a+")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        holder = handle.read().strip() or "another process"
        out.write(f"etforge: another doit run is using {lock_file.parent.parent} ({holder}); waiting for it to finish\n")
        out.flush()
        fcntl.flock(handle, fcntl.LOCK_EX)  # released by the kernel when the holder exits, even on SIGKILL
    handle.seek(0)
    handle.truncate()
    handle.write(f"pid {os.getpid()}")
    handle.flush()
    return handle
