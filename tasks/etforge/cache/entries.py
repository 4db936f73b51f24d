"""The format of a store entry, shared by the local store and the remote.

An entry is a directory ``<k[:2]>/<k>/`` of blobs plus ``manifest.json``
(ENTRY_MANIFEST: each blob's sha256 and size, and the task's info); on a signed
remote, ``manifest.json.hmac`` (SIGNATURE) beside it. (The app manifests of
etforge.publish.manifests are another thing.)

A manifest is checked for its whole shape before anything in it is used
(``parse_manifest``): whatever is wrong with it, from bytes that are not JSON to
a blob whose size is null or a build of 1e308 seconds, is one CorruptEntry saying
what, which every reader treats as a miss: one machine's entry never breaks another.

Manifests are parsed by etforge.core.jsonfile (as task records are), so that no reader
meets a RecursionError or an OverflowError later; ``seconds_of`` is the one
range check of a duration read from elsewhere (``build_s``, a record's ``elapsed_s``,
``ci-matrix --durations``).
"""

from __future__ import annotations

import re
import stat
from pathlib import Path

from etforge.core.digest import sha256_file
from etforge.core.errors import BadValue, EtforgeError
from etforge.core.jsonfile import parse_json

ENTRY_MANIFEST = "manifest.json"
SIGNATURE = "manifest.json.hmac"  # hex HMAC-SHA256 of the manifest's bytes under the shared secret
KEY_PATTERN = re.compile(r"[A-Za-z0-9_-]{3,128}")
SHA256_HEX = re.compile(r"[0-9a-f]{64}")
MAX_SECONDS = 7 * 24 * 3600  # a week: no task builds longer; a larger number is damage, and sums of it overflow
MAX_BLOB_SIZE = (1 << 63) - 1  # what a file's size (off_t) can be


def seconds_of(value) -> float | None:
    """``value`` as seconds when it is a number from 0 to MAX_SECONDS (not a bool), else None: NaN,
    infinities and huge integers fail the comparison, and no float() is taken before it."""
    if isinstance(value, int | float) and not isinstance(value, bool) and 0 <= value <= MAX_SECONDS:
        return float(value)
    return None


class CorruptEntry(EtforgeError):
    """An entry that must not be used; the message (one line) says what is wrong with it."""


def read_entry(entry: Path) -> tuple[dict, dict, dict]:
    """(blob name -> path, info, blob name -> sha256) of a complete entry whose blobs all match;
    raises otherwise."""
    if not stat.S_ISREG((entry / ENTRY_MANIFEST).lstat().st_mode):  # a FIFO would block the read
        raise CorruptEntry(f"{ENTRY_MANIFEST} is not a regular file")
    manifest = parse_manifest((entry / ENTRY_MANIFEST).read_bytes())
    files = {}
    for name, meta in manifest["files"].items():
        blob = entry / name
        st = blob.lstat()
        if not stat.S_ISREG(st.st_mode):
            raise CorruptEntry(f"{name} is not a regular file")
        if st.st_size != meta["size"]:
            raise CorruptEntry(f"{name} has {st.st_size} bytes, its manifest says {meta['size']}")
        if sha256_file(blob) != meta["sha256"]:
            raise CorruptEntry(f"{name} does not match its sha256")
        files[name] = blob
    return files, manifest.get("info", {}), {name: meta["sha256"] for name, meta in manifest["files"].items()}


def parse_manifest(raw: bytes) -> dict:
    """The manifest in ``raw``, checked for its whole shape (check_manifest); CorruptEntry otherwise."""
    try:
        manifest = parse_json(raw)
    except BadValue as exc:  # not UTF-8, not JSON, too deep, an absurd integer
        raise CorruptEntry(f"{ENTRY_MANIFEST} {exc}") from None
    return check_manifest(manifest)


def check_manifest(manifest) -> dict:
    """``manifest`` when it has an entry manifest's shape, else CorruptEntry naming the first flaw:
    ``files`` maps safe blob names to {"sha256": 64 lowercase hex digits, "size": an int >= 0},
    ``info`` (optional) is an object, ``key`` (optional) a string and ``build_s`` (optional) a number
    of seconds (seconds_of: a number from another machine is range-checked like the rest)."""
    if not isinstance(manifest, dict):
        raise CorruptEntry(f"{ENTRY_MANIFEST} is not a JSON object")
    files = manifest.get("files")
    if not isinstance(files, dict):
        raise CorruptEntry(f'{ENTRY_MANIFEST} has no "files" object')
    for name, meta in files.items():
        if not safe_blob_name(name):
            raise CorruptEntry(f"{ENTRY_MANIFEST} names a blob outside its entry: {_shown(name)}")
        if not _blob_meta(meta):
            raise CorruptEntry(
                f'{ENTRY_MANIFEST}: {_shown(name)} needs a "sha256" (64 lowercase hex digits) '
                'and a "size" (an integer >= 0)'
            )
    if not isinstance(manifest.get("info", {}), dict):
        raise CorruptEntry(f'{ENTRY_MANIFEST}: "info" is not an object')
    if not isinstance(manifest.get("key", ""), str):
        raise CorruptEntry(f'{ENTRY_MANIFEST}: "key" is not a string')
    if "build_s" in manifest and seconds_of(manifest["build_s"]) is None:
        raise CorruptEntry(f'{ENTRY_MANIFEST}: "build_s" is not a number of seconds from 0 to {MAX_SECONDS}')
    return manifest


def _blob_meta(meta) -> bool:
    if not isinstance(meta, dict):
        return False
    sha, size = meta.get("sha256"), meta.get("size")
    return (
        isinstance(sha, str)
        and SHA256_HEX.fullmatch(sha) is not None
        and type(size) is int  # type(): True is an int too
        and 0 <= size <= MAX_BLOB_SIZE
    )


def _shown(name) -> str:
    """A hostile name, safe to print on one line."""
    text = repr(name)
    return text if len(text) <= 80 else text[:77] + "..."


def safe_blob_name(name) -> bool:
    """A blob name that stays inside its entry directory."""
    return (
        isinstance(name, str)
        and name not in ("", ENTRY_MANIFEST, SIGNATURE)
        and "/" not in name
        and "\\" not in name
        and "\0" not in name
        and ".." not in name
        and not name.startswith(".")
    )
