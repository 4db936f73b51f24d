"""The keys of the matrix-wide stages (manifests, report), kept while nothing their content reads changed.

A matrix-wide stage's key is the digest of the content it renders (etforge.pipeline.keys
content_key). Building that content decides every cell's outcome from its records and reads its
program's metadata: on a no-op run of the default pipeline, most of what etforge adds to doit.
This memo (``artifacts/.etforge/content-keys.json``) keeps each stage's last key with

- ``inputs``: a digest of everything the content is computed from besides files (the stage, its
  code and templates, the plan, the keys of every task whose record decides a cell, the selected
  cells, the host), made by the caller (etforge.engine.actions);
- ``files``: a digest of the path and stat signature (size, mtime, ctime, inode) of every file
  the content may read: the stage's :class:`FileSet` (``Stage.content_reads``).

A key is used again only while both digests are the same. The signatures are taken before the
content is read, so a file written while it was read makes them differ next time; and a file
written less than RACY_NS before they were taken does not vouch for its bytes (git's "racily
clean" rule: records.py ``trusted``), so such a key is not kept.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

from etforge.cache.records import signature, trusted
from etforge.core.atomic import atomic_write_text
from etforge.core.damaged import load_kept_json
from etforge.core.digest import canonical_json

MEMO_FILE = "content-keys.json"  # in artifacts/.etforge/


@dataclass(frozen=True)
class FileSet:
    """The files whose stat signatures stand for what a computation read."""

    trees: tuple = ()  # directories: every file under them, recursively (symlinks followed)
    skip: tuple = ()  # paths under ``trees`` that are written but never read (logs, the stages' outputs)
    files: tuple = ()  # single files, present or not

    def signature(self) -> tuple[str, bool]:
        """(digest of every file's path and signature, whether every file is old enough to vouch for its bytes)."""
        rows: list = []
        skip = {os.fspath(p) for p in self.skip}
        for tree in self.trees:
            _walk(os.fspath(tree), skip, rows)
        rows += [(os.fspath(file), signature(file)) for file in self.files]
        h = hashlib.sha256()
        for path, sig in rows:  # unambiguous: a path holds no NUL, a signature no NUL or newline
            h.update(f"{path}\0{sig}\n".encode())
        return h.hexdigest(), all(trusted(sig) for _, sig in rows)


def _walk(directory: str, skip: set, rows: list) -> None:
    try:
        entries = sorted(os.scandir(directory), key=lambda e: e.name)
    except OSError:  # missing (nothing built yet) or not a directory
        rows.append((directory, None))
        return
    for entry in entries:
        if entry.path in skip or entry.name == "__pycache__":
            continue
        try:
            is_dir = entry.is_dir()
        except OSError:  # removed while listed
            is_dir = False
        if is_dir:
            _walk(entry.path, skip, rows)
        else:
            rows.append((entry.path, signature(entry.path)))


class ContentKeys:
    """The kept key of each matrix-wide stage, in one small JSON file of the project."""

    def __init__(self, path: Path):
        self.path = Path(path)
        data = load_kept_json(self.path)
        self.entries: dict = data if isinstance(data, dict) else {}

    def get(self, name: str, inputs: str, files: str) -> str | None:
        """The key kept for stage task ``name`` when it was made from these inputs and file signatures."""
        kept = self.entries.get(name)
        if isinstance(kept, dict) and kept.get("inputs") == inputs and kept.get("files") == files:
            key = kept.get("key")
            return key if isinstance(key, str) and key else None
        return None

    def keep(self, name: str, inputs: str, files: str, key: str) -> None:
        entry = {"inputs": inputs, "files": files, "key": key}
        if self.entries.get(name) == entry:
            return
        self.entries[name] = entry
        try:
            atomic_write_text(self.path, canonical_json(self.entries) + "\n")
        except OSError:
            pass  # only a memo: losing it costs one content build, never correctness
