"""Canonical serialization and content digests for cache keys.

A key is sha256 of canonical JSON (sorted keys, no whitespace, relative
paths, no timestamps). File digests are memoised by (size, mtime_ns, inode)
in a small state file, so a no-op run hashes nothing it has hashed before.
"""

from __future__ import annotations

import hashlib
import json
from importlib import metadata
from pathlib import Path

from tasks.core.atomic import atomic_write_text

# Bump when the meaning of any cached output changes without its inputs changing.
SCHEMA_VERSION = 1
# Distributions every task uses; a backend's or scheme's own tools (coremltools,
# openvino, an SDK...) are declared in its recipe and join only its tasks' keys.
TOOLCHAIN_PACKAGES = ("torch", "torchvision", "executorch", "torchao")
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


def toolchain_versions(version=None) -> dict:
    """Installed versions, read from package metadata (never imports torch).

    ``version``: a memoising ``name -> version or None`` lookup (tasks.config.tools.ToolVersions).
    """
    out = {"etforge_schema": SCHEMA_VERSION}
    for name in TOOLCHAIN_PACKAGES:
        if version is not None:
            out[name] = version(name)
            continue
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


class DigestCache:
    """sha256 of files, memoised by stat signature in a JSON state file.

    It also memoises small JSON values derived from a file's content (its
    imports, for tasks/code_deps.py), keyed by the content's sha256, so a no-op
    run neither hashes nor parses a file it has seen before.
    """

    def __init__(self, state_file: Path):
        self.state_file = state_file
        self.entries: dict = {}
        self.derived_entries: dict = {}  # kind -> content sha256 -> value
        self.used: set = set()  # (kind, sha256) read or computed by this run
        self.dirty = False
        try:
            data = json.loads(state_file.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            data = {}
        if not isinstance(data, dict):
            data = {}
        if isinstance(data.get("files"), dict):
            self.entries = data["files"]
            self.derived_entries = data.get("derived") if isinstance(data.get("derived"), dict) else {}
        else:  # the first format: the file table alone
            self.entries = data

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

    def derived(self, kind: str, content_sha256: str, compute):
        """``compute()`` for content ``content_sha256``, memoised (a JSON-serialisable value)."""
        table = self.derived_entries.setdefault(kind, {})
        self.used.add((kind, content_sha256))
        if content_sha256 not in table:
            table[content_sha256] = compute()
            self.dirty = True
        return table[content_sha256]

    def save(self) -> None:
        if not self.dirty:
            return
        # Values of contents no longer seen would pile up with every edit: keep this run's.
        derived = {kind: {sha: v for sha, v in table.items() if (kind, sha) in self.used}
                   for kind, table in self.derived_entries.items()}
        try:
            atomic_write_text(self.state_file, canonical_json({"files": self.entries, "derived": derived}))
        except OSError:
            pass  # only a memo: losing it costs a re-hash, never correctness
        self.dirty = False
