"""A shared remote cache: the local store's entries mirrored under an fsspec URL.

Layout is the local one: ``<url>/<k[:2]>/<k>/<blob>`` and ``.../manifest.json``.
The URL is a plain path or ``file://`` (a shared directory, e.g. an NFS mount),
``s3://bucket/prefix`` (through s3fs) or ``gs://bucket/prefix`` (through gcsfs).

Readers trust nothing: ``fetch`` reads a manifest of at most a few MB, checks its
whole shape (etforge.cache.entries), downloads only the blob names it lists, each
only when it has the size the manifest says, and leaves the sha256 verification to
the caller (the local store), which discards a mismatch. An entry that fails any of
this is a DamagedEntry (one line naming it); the caller treats it as a miss.
Writers publish the manifest last, so a reader never sees a manifest whose
blobs are missing; on a filesystem remote the whole entry is renamed into place.

A shared directory is read and written through etforge.cache.remote_dir: never
through a link, never opening anything but a regular file, so nothing outside its
root is read or written through an entry and no reader blocks on a FIFO. A root
that does not exist is a RemoteError: etforge never creates it (an unmounted share
would otherwise fill the local disk).

With a shared secret (``ETFORGE_CACHE_KEY``), a writer stores an HMAC-SHA256 of
the manifest's bytes beside it (``manifest.json.hmac``) and a reader accepts only
entries whose HMAC verifies: the manifest names every blob's sha256, so the
HMAC vouches for the whole entry. Without the secret nothing is signed or checked.

fsspec (and s3fs/gcsfs) is imported on first use, never at import time or in the
constructor, and never for a shared directory, so planning stays fast.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import importlib.util
import os
import re
import shutil
import stat
import uuid
from pathlib import Path

from etforge.cache.entries import ENTRY_MANIFEST, KEY_PATTERN, SIGNATURE, CorruptEntry, parse_manifest
from etforge.cache.remote_dir import (
    DirEntry,
    UnsafePath,
    copy_into,
    dir_fds,
    discard_dir,
    open_dir,
    set_aside,
    write_into,
)
from etforge.config.remote_url import EXTERNAL, LOCAL, SCHEME
from etforge.core.errors import BadValue, EtforgeError
from etforge.core.text import one_line

# What each protocol needs: EXTERNAL (etforge.config.remote_url; the plan is checked against it too).
MANIFEST_LIMIT = 4 << 20  # a manifest is a few KB; one this large is damage and is never read whole
SIGNATURE_LIMIT = 4 << 10  # 64 hex digits


class RemoteError(EtforgeError):
    """The remote is unreachable, misconfigured or read-only; the message is one line."""


class UntrustedEntry(EtforgeError):
    """A remote entry that is unsigned, or signed with another secret (only with a secret set)."""


class DamagedEntry(EtforgeError):
    """A remote entry no reader can use (a link or special file in it, an oversized or malformed
    manifest, a blob of another size than its manifest says); the message is one line naming it."""


def _one_line(exc: BaseException) -> str:
    return one_line(exc, 300) or type(exc).__name__


def _redact(url: str) -> str:
    return re.sub(r"//[^/@]*@", "//***@", url)


class RemoteStore:
    def __init__(
        self, url: str, read_only: bool = False, storage_options: dict | None = None, secret: bytes | None = None
    ):
        if not isinstance(url, str) or not url.strip():
            raise RemoteError("remote cache: empty URL")
        url = url.strip()
        match = SCHEME.match(url)
        self.protocol = match.group(1).lower() if match else "file"
        if not match:  # a plain path: resolve now, so a later chdir changes nothing
            url = os.path.abspath(os.path.expanduser(url))
        self.url = url
        self.read_only = bool(read_only)
        self.storage_options = dict(storage_options or {})
        self.secret = secret or None  # signs uploads and is required of downloads; never printed
        # A shared directory is handled with plain os calls (no links, no special files), never fsspec.
        self._dir = _local_path(url) if self.protocol in LOCAL else None
        self._fs = None
        self._root: str | None = None
        self._pid: int | None = None
        pkg = EXTERNAL.get(self.protocol)
        if pkg and importlib.util.find_spec(pkg[0]) is None:  # no import, just a lookup
            raise RemoteError(f"remote cache {self._name()}: {self.protocol}:// needs {pkg[0]}: pip install {pkg[1]}")

    def __repr__(self) -> str:
        return f"RemoteStore({self._name()!r}, read_only={self.read_only}, signed={self.secret is not None})"

    def __getstate__(self):  # picklable for process workers; the filesystem is rebuilt
        state = dict(self.__dict__)
        state.update(_fs=None, _root=None, _pid=None)
        return state

    def _name(self) -> str:
        return _redact(self.url)

    def name(self) -> str:
        """The URL with any credentials hidden, for messages."""
        return self._name()

    def _error(self, what: str, exc: BaseException | None = None) -> RemoteError:
        detail = f": {type(exc).__name__}: {_one_line(exc)}" if exc is not None else ""
        return RemoteError(f"remote cache {self._name()}: {what}{detail}")

    def _damaged(self, key: str, problem) -> DamagedEntry:
        return DamagedEntry(f"remote cache {self._name()}: entry {key[:12]} is damaged: {problem}")

    # -- where entries are ----------------------------------------------------

    def check(self) -> None:
        """RemoteError when a shared directory's root is not an existing directory: etforge never
        creates it (a share that is not mounted would fill the local disk instead)."""
        if self._dir is None:
            return
        try:
            st = os.stat(self._dir)
        except FileNotFoundError:
            raise RemoteError(
                f"remote cache {self._name()}: no such directory (is the share mounted?); etforge does not create it"
            ) from None
        except OSError as exc:
            raise self._error("cannot open", exc) from exc
        if not stat.S_ISDIR(st.st_mode):
            raise RemoteError(f"remote cache {self._name()}: not a directory")

    def _filesystem(self):
        """(fs, root path) for this URL; rebuilt in a forked worker (async clients don't survive fork)."""
        if self._fs is None or self._pid != os.getpid():
            try:
                from fsspec.core import url_to_fs

                fs, root = url_to_fs(self.url, **self.storage_options)
            except ImportError as exc:
                pkg = EXTERNAL.get(self.protocol, (None, None))[1]
                hint = f"pip install {pkg}" if pkg else _one_line(exc)
                raise RemoteError(f"remote cache {self._name()}: {self.protocol}:// needs {hint}") from exc
            except Exception as exc:
                raise self._error("cannot open", exc) from exc
            self._fs, self._root, self._pid = fs, root.rstrip("/"), os.getpid()
        return self._fs, self._root

    def _entry(self, key: str) -> str:
        _check_key(key)
        _, root = self._filesystem()
        return f"{root}/{key[:2]}/{key}"

    @contextlib.contextmanager
    def _open(self, key: str):
        """The entry ``key`` as a reader (DirEntry or _ObjectEntry), whether it exists or not."""
        _check_key(key)
        if self._dir is None:
            fs, _ = self._filesystem()
            yield _ObjectEntry(fs, self._entry(key))
            return
        self.check()
        entry = DirEntry(self._dir, key)
        try:
            yield entry
        finally:
            entry.close()

    # -- reading ------------------------------------------------------------

    def _read_manifest(self, entry, key: str) -> tuple[bytes, dict] | None:
        """The manifest's bytes and its parsed, checked form; None when absent. UnsafePath when unusable."""
        raw = entry.read(ENTRY_MANIFEST, MANIFEST_LIMIT)
        if raw is None:
            return None
        try:
            manifest = parse_manifest(raw)
        except CorruptEntry as exc:
            raise UnsafePath(str(exc)) from None
        if manifest.get("key", key) != key:
            raise UnsafePath(f"{ENTRY_MANIFEST} is for another key")
        return raw, manifest

    def _signature(self, raw: bytes) -> bytes:
        assert self.secret is not None  # (only called with a secret set)
        return hmac.new(self.secret, raw, hashlib.sha256).hexdigest().encode("ascii")

    def _signature_problem(self, entry, raw: bytes) -> str | None:
        """Why the entry's HMAC does not vouch for ``raw`` (None: it does, or no secret is set)."""
        if self.secret is None:
            return None
        stored = entry.read(SIGNATURE, SIGNATURE_LIMIT)
        if stored is None:
            return "is not signed"
        if not hmac.compare_digest(bytes(stored).strip(), self._signature(raw)):
            return "has a signature that does not match ETFORGE_CACHE_KEY"
        return None

    def manifest(self, key: str) -> dict | None:
        """Entry ``key``'s checked manifest (signature verified when a secret is set), or None when
        it is absent, unusable or the remote cannot be read: for facts about an entry (its build
        seconds) without downloading its blobs."""
        try:
            with self._open(key) as entry:
                read = self._read_manifest(entry, key)
                if read is None or self._signature_problem(entry, read[0]) is not None:
                    return None
                return read[1]
        except (RemoteError, UnsafePath, OSError, ValueError):
            return None

    def fetch(self, key: str, dest: Path) -> bool:
        """Download entry ``key`` (all blobs + manifest.json) into the empty local dir ``dest``.

        False when the remote has no complete entry. Raises RemoteError for an unreachable or
        misconfigured remote, DamagedEntry for an entry no reader can use (a link or special
        file, a malformed or oversized manifest, a blob of another size than it says),
        UntrustedEntry when a secret is set and the entry's HMAC does not verify; these before
        downloading any blob they concern. The caller verifies every blob's sha256.
        """
        _check_key(key)
        dest = Path(dest)
        written: list[Path] = []
        try:
            with self._open(key) as entry:
                found = self._read_manifest(entry, key)
                if found is None:
                    return False
                raw, manifest = found
                problem = self._signature_problem(entry, raw)
                if problem:
                    raise UntrustedEntry(
                        f"remote cache {self._name()}: entry {key[:12]} {problem}; treating it as a miss"
                    )
                dest.mkdir(parents=True, exist_ok=True)
                for name, meta in sorted(manifest["files"].items()):
                    target = dest / name
                    if os.path.lexists(target):
                        raise _Refused(name)
                    written.append(target)
                    entry.get(name, meta["size"], target)
            target = dest / ENTRY_MANIFEST
            written.append(target)
            with open(target, "xb") as f:  # x: never through a planted file or link
                f.write(raw)
            return True
        except (FileNotFoundError, _Refused):  # a blob gone meanwhile (a discard racing us)
            _remove(written)
            return False
        except UnsafePath as exc:
            _remove(written)
            raise self._damaged(key, exc) from None
        except (UntrustedEntry, RemoteError):
            _remove(written)
            raise
        except Exception as exc:
            _remove(written)
            raise self._error(f"cannot fetch {key[:12]}", exc) from exc

    def _complete(self, key: str, files: dict) -> bool:
        """Whether the remote holds this entry, undamaged, with the same blobs (names, sha256,
        sizes), signed with our secret when we have one."""
        try:
            with self._open(key) as entry:
                found = self._read_manifest(entry, key)
                if found is None or self._signature_problem(entry, found[0]):
                    return False
                remote_files = {n: (m["sha256"], m["size"]) for n, m in found[1]["files"].items()}
                if remote_files != {n: (m["sha256"], m["size"]) for n, m in files.items()}:
                    return False
                return all(entry.size(name) == meta["size"] for name, meta in files.items())
        except (FileNotFoundError, UnsafePath):
            return False

    # -- writing ------------------------------------------------------------

    def upload(self, key: str, entry: Path) -> None:
        """Upload a complete local entry dir; blobs first (then its HMAC), manifest.json last.

        On a filesystem remote the entry is assembled in ``<url>/tmp/`` and renamed into
        place. No-op when the remote already holds the same blobs. RemoteError when read-only.
        """
        if self.read_only:
            raise RemoteError(f"remote cache {self._name()} is read-only: not uploading {key[:12]}")
        _check_key(key)
        entry = Path(entry)
        try:
            raw = (entry / ENTRY_MANIFEST).read_bytes()
            files = parse_manifest(raw)["files"]
        except (OSError, CorruptEntry) as exc:
            raise BadValue(f"not a cache entry: {entry}: {_one_line(exc)}") from exc
        for name in files:
            if not (entry / name).is_file():
                raise BadValue(f"not a cache entry: {entry}: missing blob {name!r}")
        try:
            if self._complete(key, files):
                return
            signature = self._signature(raw) if self.secret is not None else None
            if self._dir is not None:
                self._upload_dir(key, entry, files, signature)
            else:
                fs, _ = self._filesystem()
                self._upload_objects(fs, entry, files, signature, self._entry(key))
        except RemoteError:
            raise
        except Exception as exc:
            raise self._error(f"cannot upload {key[:12]}", exc) from exc

    def _upload_objects(self, fs, entry: Path, files: dict, signature: bytes | None, remote: str) -> None:
        try:  # a stale manifest must not vouch for the blobs we are about to replace
            fs.rm_file(f"{remote}/{ENTRY_MANIFEST}")
        except FileNotFoundError:
            pass
        for name in sorted(files):
            fs.put_file(str(entry / name), f"{remote}/{name}")
        if signature is not None:
            fs.pipe_file(f"{remote}/{SIGNATURE}", signature)
        fs.put_file(str(entry / ENTRY_MANIFEST), f"{remote}/{ENTRY_MANIFEST}")

    def _upload_dir(self, key: str, entry: Path, files: dict, signature: bytes | None) -> None:
        """Assemble the entry in ``<root>/tmp/`` and rename it into place, every step relative to a
        directory opened without following links (a link planted in the share is removed, never used)."""
        staging = f"upload-{key}-{uuid.uuid4().hex[:12]}"
        assert self._dir is not None  # (a shared directory: _upload_dir is its upload)
        with dir_fds(self._dir, "tmp", key[:2]) as (_, tmp, shard):
            os.mkdir(staging, dir_fd=tmp)
            try:
                stage = open_dir(staging, tmp)
                try:
                    for name in sorted(files):
                        copy_into(entry / name, name, stage)
                    if signature is not None:
                        write_into(signature, SIGNATURE, stage)
                    copy_into(entry / ENTRY_MANIFEST, ENTRY_MANIFEST, stage)
                finally:
                    os.close(stage)
                set_aside(key, shard, tmp)  # stale or damaged (else _complete said so)
                try:
                    os.rename(staging, key, src_dir_fd=tmp, dst_dir_fd=shard)
                except OSError:
                    if not self._complete(key, files):  # lost a race: theirs is as good
                        raise
            finally:
                shutil.rmtree(staging, ignore_errors=True, dir_fd=tmp)

    def discard(self, key: str) -> None:
        """Delete a corrupt remote entry (best effort; no-op when read-only)."""
        if self.read_only:
            return
        try:
            _check_key(key)
            if self._dir is not None:
                self.check()
                discard_dir(self._dir, key)
                return
            fs, _ = self._filesystem()
            remote = self._entry(key)
            try:  # the manifest first: from then on the entry is a miss
                fs.rm_file(f"{remote}/{ENTRY_MANIFEST}")
            except FileNotFoundError:
                pass
            fs.rm(remote, recursive=True)
        except Exception:
            pass


def _check_key(key) -> None:
    if not isinstance(key, str) or not KEY_PATTERN.fullmatch(key):
        raise BadValue(f"not a cache key: {key!r}")


class _ObjectEntry:
    """One entry of an object store (no links or special files there; sizes still capped)."""

    def __init__(self, fs, path: str):
        self.fs, self.path = fs, path

    def read(self, name: str, limit: int) -> bytes | None:
        try:
            data = self.fs.cat_file(f"{self.path}/{name}", start=0, end=limit + 1)
        except FileNotFoundError:
            return None
        if len(data) > limit:
            raise UnsafePath(f"{name} is larger than {limit} bytes")
        return data

    def size(self, name: str) -> int | None:
        try:
            return self.fs.size(f"{self.path}/{name}")
        except FileNotFoundError:
            return None

    def get(self, name: str, size: int, target: Path) -> None:
        actual = self.fs.size(f"{self.path}/{name}")
        if actual != size:
            raise UnsafePath(f"{name} has {actual} bytes, its manifest says {size}")
        self.fs.get_file(f"{self.path}/{name}", str(target))


class _Refused(EtforgeError):
    """A blob would be written over something already in the target directory."""


def _remove(paths: list[Path]) -> None:
    for path in paths:
        try:
            path.unlink()
        except OSError:
            pass


def _local_path(url: str) -> str:
    """The directory of a plain path or file:// URL, as fsspec's LocalFileSystem takes it."""
    match = SCHEME.match(url)
    return os.path.abspath(url[match.end() :] if match else url)


def remote_from_url(url: str | None, read_only: bool = False, secret: bytes | None = None) -> RemoteStore | None:
    """A RemoteStore for ``url``, or None when no remote is configured (None or blank).

    ``secret``: the shared signing key (``ETFORGE_CACHE_KEY``), or None for unsigned entries.

    Credentials and endpoints come from the environment, as each backend reads them
    (for S3: AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_ENDPOINT_URL or AWS_ENDPOINT_URL_S3,
    AWS_DEFAULT_REGION; fsspec's own FSSPEC_S3_* variables work too).
    """
    if url is None or not str(url).strip():
        return None
    return RemoteStore(str(url), read_only=read_only, secret=secret)
