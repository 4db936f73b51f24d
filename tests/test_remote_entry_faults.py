"""Hostile cache entries (issue 18): a manifest of the wrong shape is a miss, never a crash.

``MANIFEST_DAMAGES``, name -> damage(store_root, key), each leaves the manifest of entry ``key``
of a store (local, or a shared-directory remote: the layout is the same) in one hostile shape.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from tasks.store.entries import ENTRY_MANIFEST as MANIFEST, read_entry
from tasks.store.local import Store

OUTSIDE_BYTES = b"etforge test: bytes that live outside the remote cache\n"


# -- damages -----------------------------------------------------------------------------------

def outside_dir(remote_root: Path) -> Path:
    """Beside the remote root, never inside it: where damages put what their links point to."""
    path = remote_root.parent / f"{remote_root.name}-outside"
    path.mkdir(exist_ok=True)
    secret = path / "secret.txt"
    if not secret.exists():
        secret.write_bytes(OUTSIDE_BYTES)
    return path


def _entry(root: Path, key: str) -> Path:
    return root / key[:2] / key


def _load(entry: Path) -> dict:
    return json.loads((entry / MANIFEST).read_bytes())


def _save(entry: Path, manifest) -> None:
    (entry / MANIFEST).write_text(json.dumps(manifest))


def _victim(manifest: dict) -> str:
    """The blob a damage aims at: export.json when there is one (what the working tree shows)."""
    return "export.json" if "export.json" in manifest["files"] else sorted(manifest["files"])[0]


def _meta(data: bytes) -> dict:
    return {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}


def _raw_manifest(data: bytes):
    def damage(root, key):
        (_entry(root, key) / MANIFEST).write_bytes(data)
    return damage


def _rewritten(change):
    """A damage that edits the parsed manifest with ``change(manifest, victim)``."""
    def damage(root, key):
        entry = _entry(root, key)
        manifest = _load(entry)
        _save(entry, change(manifest, _victim(manifest)) or manifest)
    return damage


def _parent_blob(root, key):
    """The manifest names '../evil', and '<shard>/evil' holds bytes matching it."""
    entry = _entry(root, key)
    (entry.parent / "evil").write_bytes(OUTSIDE_BYTES)
    manifest = _load(entry)
    manifest["files"]["../evil"] = _meta(OUTSIDE_BYTES)
    _save(entry, manifest)


def _absolute_blob(root, key):
    entry = _entry(root, key)
    manifest = _load(entry)
    manifest["files"][str(outside_dir(root) / "secret.txt")] = _meta(OUTSIDE_BYTES)
    _save(entry, manifest)


# Manifest damages: a bad manifest.json in an otherwise real entry (they apply to a local store too).
MANIFEST_DAMAGES = {
    "null file meta": _rewritten(lambda m, v: m["files"].update({v: None})),
    "files is a list": _rewritten(lambda m, v: m.update(files=sorted(m["files"]))),
    "size is a string": _rewritten(lambda m, v: m["files"][v].update(size=str(m["files"][v]["size"]))),
    "size is negative": _rewritten(lambda m, v: m["files"][v].update(size=-1)),
    "size is a float": _rewritten(lambda m, v: m["files"][v].update(size=float(m["files"][v]["size"]))),
    "size is a boolean": _rewritten(lambda m, v: m["files"][v].update(size=True)),
    "sha256 is missing": _rewritten(lambda m, v: m["files"][v].pop("sha256")),
    "sha256 in upper case": _rewritten(lambda m, v: m["files"][v].update(sha256=m["files"][v]["sha256"].upper())),
    "info is a list": _rewritten(lambda m, v: m.update(info=["ok"])),
    "key is a number": _rewritten(lambda m, v: m.update(key=42)),
    "manifest is a list": _rewritten(lambda m, v: [m]),
    "manifest is not JSON": _raw_manifest(b'{"files": {'),
    "manifest is not UTF-8": _raw_manifest(b'{"files": {}, "info": "\xff\xfe"}'),
    "manifest nested too deep": _raw_manifest(b"[" * 200_000 + b"]" * 200_000),
    "manifest names a ../ blob": _parent_blob,
    "manifest names an absolute blob": _absolute_blob,
}


# -- the store, in process ----------------------------------------------------------------------

KEY = hashlib.sha256(b"a hostile entry").hexdigest()
BLOBS = {"export.json": b'{"program": "linreg"}\n', "program.pte": os.urandom(5000) + b"PTE"}


def build_blobs(directory: Path) -> dict:
    directory.mkdir(parents=True, exist_ok=True)
    for name, data in BLOBS.items():
        (directory / name).write_bytes(data)
    return {name: directory / name for name in BLOBS}


@pytest.mark.parametrize("damage", MANIFEST_DAMAGES)
def test_a_malformed_local_manifest_is_a_miss_and_is_discarded(tmp_path, damage):
    store = Store(tmp_path / "cache", state_dir=tmp_path / ".etforge")
    store.put(KEY, build_blobs(tmp_path / "built"), {"status": "ok"})
    MANIFEST_DAMAGES[damage](tmp_path / "cache", KEY)
    assert store.get(KEY) is None  # never a TypeError out of read_entry
    assert not store.entry_dir(KEY).exists()
