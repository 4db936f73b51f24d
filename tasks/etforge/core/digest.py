"""Canonical serialization and content digests: what every cache key is made of.

A key is sha256 of canonical JSON (sorted keys, no whitespace, relative
paths, no timestamps); a file is named by the sha256 of its bytes.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

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
