"""Canonical serialization and content digests for cache keys.

A key is sha256 of canonical JSON (sorted keys, no whitespace, relative
paths, no timestamps). File digests are memoised by (size, mtime_ns, inode)
in a small state file, so a no-op run hashes nothing it has hashed before.
"""

from __future__ import annotations

import hashlib
import json
import os
from importlib import metadata
from pathlib import Path

from tasks.atomic import atomic_write_text

# Bump when the meaning of any cached output changes without its inputs changing.
SCHEMA_VERSION = 1
TOOLCHAIN_PACKAGES = ("torch", "torchvision", "executorch", "torchao", "coremltools")
CHUNK = 1 << 20


def canonical_json(obj) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def digest(obj) -> str:
    return hashlib.sha256(canonical_json(obj).encode("utf-8")).hexdigest()


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
    return h.hexdigest()


def toolchain_versions() -> dict:
    """Installed versions, read from package metadata (never imports torch)."""
    out = {"etforge_schema": SCHEMA_VERSION}
    for name in TOOLCHAIN_PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


class DigestCache:
    """sha256 of files, memoised by stat signature in a JSON state file."""

    def __init__(self, state_file: Path):
        self.state_file = state_file
        self.entries: dict = {}
        self.dirty = False
        try:
            self.entries = json.loads(state_file.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            self.entries = {}

    def file_digest(self, path: Path) -> str:
        st = path.stat()
        signature = [st.st_size, st.st_mtime_ns, st.st_ino]
        key = str(path.resolve())
        cached = self.entries.get(key)
        if cached and cached[:3] == signature:
            return cached[3]
        value = sha256_file(path)
        self.entries[key] = signature + [value]
        self.dirty = True
        return value

    def save(self) -> None:
        if not self.dirty:
            return
        try:
            atomic_write_text(self.state_file, canonical_json(self.entries))
        except OSError:
            pass  # only a memo: losing it costs a re-hash, never correctness
        self.dirty = False
