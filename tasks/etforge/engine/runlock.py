"""One doit run per checkout at a time, tied to the live process that holds it.

The lock is a POSIX record lock (``fcntl.lockf``) on ``artifacts/.etforge/run.lock``.
Unlike ``flock``, a record lock belongs to one process: forked workers do not
inherit it, so a run whose main process is killed frees the lock at once even
while orphaned workers linger, and the kernel drops it when its holder dies.
The holder writes ``held by pid N`` into the file and clears it when it
finishes, so a pid still found there by the next holder names a run that was
killed.

One rule of record locks to respect: a process loses its lock when it closes
*any* descriptor of the file, so the holder only ever touches the file through
the handle returned here.
"""

from __future__ import annotations

import errno
import fcntl
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

HELD_BY = "held by pid "


@dataclass
class RunLock:
    path: Path
    handle: TextIO


def _recorded_pid(handle: TextIO) -> int | None:
    handle.seek(0)
    text = handle.read().strip()
    if not text.startswith(HELD_BY):  # empty: released cleanly (or written by an older etforge)
        return None
    try:
        return int(text.removeprefix(HELD_BY))
    except ValueError:
        return None


def acquire(lock_file: Path, say: Callable[[str], None]) -> RunLock:
    """Block until this process holds the run lock; ``say`` gets one line per event."""
    lock_file.parent.mkdir(parents=True, exist_ok=True)
    handle = open(lock_file, "a+", encoding="utf-8")  # lockf needs a descriptor open for writing
    checkout = lock_file.parent.parent
    try:
        fcntl.lockf(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno not in (errno.EACCES, errno.EAGAIN):
            handle.close()
            raise
        holder = _recorded_pid(handle)
        who = f"pid {holder}" if holder else "another process"
        say(f"etforge: another doit run ({who}) is using {checkout}; waiting for it to finish")
        fcntl.lockf(handle, fcntl.LOCK_EX)
    previous = _recorded_pid(handle)
    if previous is not None and previous != os.getpid():
        say(
            f"etforge: took over the run lock of {checkout} from pid {previous}, "
            "which ended without releasing it (killed); cleaning up after it"
        )
    try:
        handle.seek(0)
        handle.truncate()
        handle.write(f"{HELD_BY}{os.getpid()}\n")
        handle.flush()
    except OSError:
        pass  # a full disk: the lock holds all the same, waiting runs just cannot name us
    return RunLock(lock_file, handle)


def release(lock: RunLock) -> None:
    """Clear the pid (a clean end) and unlock; the kernel does the unlock anyway when we die."""
    try:
        lock.handle.seek(0)
        lock.handle.truncate()
        lock.handle.flush()
    except OSError:
        pass  # a full disk cannot stop a truncate, but a vanished directory can: still unlock
    finally:
        lock.handle.close()  # closing drops the record lock
