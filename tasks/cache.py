"""Content-addressed store: ``artifacts/cache/<k[:2]>/<k>/``, optionally backed by a remote.

An entry is a directory of blobs plus ``manifest.json`` (sha256 and size of
each blob, and the task's info). It is assembled in a temp directory and
renamed into place, so an entry either exists whole or not at all. Every
``get`` verifies each blob; a mismatch discards the entry and reports a miss.
A local miss is looked up in the remote store (tasks/remote.py), verified the
same way, and kept locally; a built entry is uploaded unless the remote is
read-only.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

from tasks.atomic import atomic_copy
from tasks.keys import canonical_json, sha256_file

MANIFEST = "manifest.json"


class CorruptEntry(Exception):
    pass


def read_entry(entry: Path) -> tuple[dict, dict]:
    """(blob name -> path, info) of a complete entry whose blobs all match; raises otherwise."""
    manifest = json.loads((entry / MANIFEST).read_text(encoding="utf-8"))
    files = {}
    for name, meta in manifest["files"].items():
        blob = entry / name
        if Path(name).name != name or name in (MANIFEST, ".", ".."):
            raise CorruptEntry(f"bad blob name {name!r}")
        if blob.stat().st_size != meta["size"] or sha256_file(blob) != meta["sha256"]:
            raise CorruptEntry(name)
        files[name] = blob
    return files, manifest.get("info", {})


class Store:
    def __init__(self, root: Path, remote=None):
        self.root = Path(root)
        self.remote = remote  # a tasks.remote.RemoteStore, or None

    def entry_dir(self, key: str) -> Path:
        return self.root / key[:2] / key

    def has(self, key: str) -> bool:
        """Cheap local existence check (a stat); ``get`` does the verification."""
        return (self.entry_dir(key) / MANIFEST).is_file()

    def new_workdir(self) -> Path:
        """A scratch directory on the store's filesystem for a builder's outputs."""
        tmp = self.root / "tmp"
        tmp.mkdir(parents=True, exist_ok=True)
        return Path(tempfile.mkdtemp(prefix="build-", dir=tmp))

    def get(self, key: str) -> tuple[dict, dict] | None:
        """(blob name -> path, info) for a verified entry (local, else remote), or None.

        A local hit is also offered to a writable remote (a no-op when it has it), so
        outputs built before the remote was configured, or whose upload failed, get shared.
        """
        hit = self._get_local(key)
        if hit is not None:
            if self.remote is not None and not self.remote.read_only:
                self.remote.upload(key, self.entry_dir(key))
            return hit
        if self.remote is not None and self._fetch(key):
            hit = self._get_local(key)
        return hit

    def _get_local(self, key: str) -> tuple[dict, dict] | None:
        entry = self.entry_dir(key)
        if not entry.exists():
            return None
        try:
            return read_entry(entry)
        except (CorruptEntry, ValueError, KeyError, OSError):
            self.discard(key)
            return None

    def _fetch(self, key: str) -> bool:
        staging = self.new_workdir()
        try:
            if not self.remote.fetch(key, staging):
                return False
            try:
                read_entry(staging)
            except (CorruptEntry, ValueError, KeyError, OSError):
                self.remote.discard(key)  # never serve it, and stop others from trying
                return False
            self._install(staging, key)
            return True
        finally:
            shutil.rmtree(staging, ignore_errors=True)

    def _install(self, staging: Path, key: str) -> Path:
        _fsync_dir_files(staging)
        entry = self.entry_dir(key)
        entry.parent.mkdir(parents=True, exist_ok=True)
        if entry.exists():
            try:
                read_entry(entry)
                return entry  # another task built the same key first: keep theirs, readers may be using it
            except (CorruptEntry, ValueError, KeyError, OSError):
                self.discard(key)
        try:
            os.rename(staging, entry)
        except OSError:
            if not self.has(key):  # lost a race with another writer: theirs is as good
                raise
        return entry

    def put(self, key: str, files: dict, info: dict) -> dict:
        """Store ``files`` (blob name -> path) under ``key``; return the stored paths."""
        staging = self.new_workdir()
        try:
            manifest = {"key": key, "files": {}, "info": info}
            for name, src in sorted(files.items()):
                dst = staging / name
                shutil.copyfile(src, dst)
                manifest["files"][name] = {"sha256": sha256_file(dst), "size": dst.stat().st_size}
            (staging / MANIFEST).write_text(canonical_json(manifest), encoding="utf-8")
            entry = self._install(staging, key)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        if self.remote is not None and not self.remote.read_only:
            self.remote.upload(key, entry)
        return {name: entry / name for name in files}

    def discard(self, key: str) -> None:
        entry = self.entry_dir(key)
        if not entry.exists():
            return
        # Rename first so a half-deleted entry is never mistaken for a whole one.
        trash = self.root / "tmp" / f"discard-{key}-{os.getpid()}"
        trash.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.rename(entry, trash)
        except OSError:
            return
        shutil.rmtree(trash, ignore_errors=True)


def _fsync_dir_files(directory: Path) -> None:
    for path in directory.iterdir():
        with open(path, "rb") as f:
            os.fsync(f.fileno())


def materialize(blob: Path, target: Path) -> None:
    """Copy a verified blob to its working-tree path atomically."""
    atomic_copy(blob, target)
