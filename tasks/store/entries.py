"""The format of a store entry, shared by the local store and the remote.

An entry is a directory ``<k[:2]>/<k>/`` of blobs plus ``manifest.json``
(ENTRY_MANIFEST: each blob's sha256 and size, and the task's info); on a signed
remote, ``manifest.json.hmac`` (SIGNATURE) beside it. (The app manifests of
tasks/publish/manifests/ are another thing.)
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from tasks.core.digest import sha256_file

ENTRY_MANIFEST = "manifest.json"
SIGNATURE = "manifest.json.hmac"  # hex HMAC-SHA256 of the manifest's bytes under the shared secret
KEY_PATTERN = re.compile(r"[A-Za-z0-9_-]{3,128}")


class CorruptEntry(Exception):
    pass


def read_entry(entry: Path) -> tuple[dict, dict]:
    """(blob name -> path, info) of a complete entry whose blobs all match; raises otherwise."""
    manifest = json.loads((entry / ENTRY_MANIFEST).read_text(encoding="utf-8"))
    files = {}
    for name, meta in manifest["files"].items():
        blob = entry / name
        if Path(name).name != name or name in (ENTRY_MANIFEST, ".", ".."):
            raise CorruptEntry(f"bad blob name {name!r}")
        if blob.stat().st_size != meta["size"] or sha256_file(blob) != meta["sha256"]:
            raise CorruptEntry(name)
        files[name] = blob
    return files, manifest.get("info", {})



def safe_blob_name(name) -> bool:
    """A blob name that stays inside its entry directory."""
    return (isinstance(name, str) and name not in ("", ENTRY_MANIFEST, SIGNATURE) and "/" not in name
            and "\\" not in name and "\0" not in name and ".." not in name
            and not name.startswith("."))
