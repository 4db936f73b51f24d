"""Replace several sibling paths as one step: after a crash at any moment, all of them or none.

    staging = new_staging(parent, prefix)   a directory beside the targets; fill it
    swap_in(staging, {"tree": "x-1.0", "archive": "x-1.0.tar.gz"})
    finish(staging)                          after a crash: roll a committed swap forward, else drop it
    pending(target)                          whether a journaled swap naming ``target`` is unfinished

A release is a directory, an archive and a timing file side by side; a reader that finds a new
directory beside an old archive (a SIGKILL between two renames) would trust a mix of two runs.
So the moves are journaled: ``swap_in`` writes ``staging/SWAP`` (atomically: the commit point),
then removes each old target and renames the staged item into its place, then removes the
staging directory. A crash before the journal leaves the old paths as they were (``finish``
drops the staging directory); a crash after it is rolled forward by ``finish``, which is called
under the run lock before anything reads the targets. A staged name with no item removes its
target. SIGINT and SIGTERM wait while the moves run, so that Ctrl-C cannot stop them halfway.

The journal names targets as plain names in the staging directory's parent, never paths: a
damaged journal can neither write nor remove anything elsewhere.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from etforge.core.atomic import atomic_write_text
from etforge.core.errors import BadValue

JOURNAL = "SWAP"
DEFERRED = {signal.SIGINT, signal.SIGTERM}


def new_staging(parent: Path, prefix: str) -> Path:
    """An empty staging directory in ``parent`` (where the targets are), readable like a release."""
    parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
    os.chmod(staging, 0o755)
    return staging


def swap_in(staging: Path, targets: dict[str, str]) -> None:
    """Move each ``staging/<item>`` onto ``<parent>/<target name>`` as one step (see the module
    docstring); an item missing from ``staging`` removes its target."""
    for item, name in targets.items():
        _check_name(item)
        _check_name(name)
    journal = Journal(
        moves={item: name for item, name in targets.items() if os.path.lexists(staging / item)},
        removals=sorted(name for item, name in targets.items() if not os.path.lexists(staging / item)),
    )
    atomic_write_text(staging / JOURNAL, json.dumps({"moves": journal.moves, "removals": journal.removals}))
    with _signals_deferred():
        _apply(staging, journal)


def finish(staging: Path) -> None:
    """What a crash left: a journaled swap is completed, anything else is dropped."""
    journal = _journal(staging)
    if journal is not None:
        with _signals_deferred():
            _apply(staging, journal)
    else:
        shutil.rmtree(staging, ignore_errors=True)


@dataclass(frozen=True)
class Journal:
    moves: dict[str, str]  # staged item -> the name it replaces
    removals: list[str]  # names removed, with nothing in their place


def pending(target: Path) -> bool:
    """Whether a journaled swap that names ``target`` is not finished yet (a SIGKILL stopped it, or
    it is running now): until it is, ``target`` and its siblings may come from two swaps."""
    try:
        stagings = [entry for entry in os.scandir(target.parent) if entry.is_dir(follow_symlinks=False)]
    except OSError:
        return False
    for entry in stagings:
        journal = _journal(Path(entry.path))
        if journal is not None and target.name in (*journal.moves.values(), *journal.removals):
            return True
    return False


def _apply(staging: Path, journal: Journal) -> None:
    """Idempotent, so that a crash at any point is completed by running it again: an item already
    moved is no longer staged, and its target is left alone."""
    parent = staging.parent
    for item, name in sorted(journal.moves.items()):
        if os.path.lexists(staging / item):
            _remove(parent / name)
            os.rename(staging / item, parent / name)
    for name in journal.removals:
        _remove(parent / name)
    shutil.rmtree(staging)  # the journal goes last: until then a crash is rolled forward again


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif os.path.lexists(path):
        path.unlink()


def _journal(staging: Path) -> Journal | None:
    try:
        data = json.loads((staging / JOURNAL).read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return None  # no journal (or a torn one, which atomic writes never leave): never committed
    if (
        not isinstance(data, dict)
        or not isinstance(data.get("moves"), dict)
        or not isinstance(data.get("removals"), list)
    ):
        return None
    try:
        for name in [*data["moves"], *data["moves"].values(), *data["removals"]]:
            _check_name(name)
    except BadValue:
        return None
    return Journal(moves=data["moves"], removals=data["removals"])


def _check_name(name) -> None:
    if not isinstance(name, str) or not name or name in (".", "..") or "/" in name or "\0" in name:
        raise BadValue(f"not a plain file name: {name!r}")


@contextmanager
def _signals_deferred():
    """SIGINT and SIGTERM are delivered once the block ends (SIGKILL cannot be: ``finish`` is for it)."""
    old = signal.pthread_sigmask(signal.SIG_BLOCK, DEFERRED)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)
