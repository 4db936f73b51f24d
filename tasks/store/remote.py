"""A shared remote cache: the local store's entries mirrored under an fsspec URL.

Layout is the local one: ``<url>/<k[:2]>/<k>/<blob>`` and ``.../manifest.json``.
The URL is a plain path or ``file://`` (a shared directory, e.g. an NFS mount),
``s3://bucket/prefix`` (through s3fs) or ``gs://bucket/prefix`` (through gcsfs).

Readers trust nothing: ``fetch`` downloads only the blob names a manifest lists,
refuses names that could leave the target directory, and leaves the sha256
verification to the caller (the local store), which discards a mismatch.
Writers publish the manifest last, so a reader never sees a manifest whose
blobs are missing; on a filesystem remote the whole entry is renamed into place.

With a shared secret (``ETFORGE_CACHE_KEY``), a writer stores an HMAC-SHA256 of
the manifest's bytes beside it (``manifest.json.hmac``) and a reader accepts only
entries whose HMAC verifies: the manifest names every blob's sha256, so the
HMAC vouches for the whole entry. Without the secret nothing is signed or checked.

fsspec (and s3fs/gcsfs) is imported on first use, never at import time or in the
constructor, so planning stays fast when nothing needs the remote.
"""

from __future__ import annotations

import hashlib
import hmac
import importlib.util
import json
import os
import re
import shutil
import uuid
from pathlib import Path

from tasks.core.text import one_line
from tasks.store.entries import ENTRY_MANIFEST, KEY_PATTERN, SIGNATURE, safe_blob_name

_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
# Protocols whose implementation lives in a separate package: (package, pip name).
_EXTERNAL = {
    "s3": ("s3fs", "s3fs"), "s3a": ("s3fs", "s3fs"),
    "gs": ("gcsfs", "gcsfs"), "gcs": ("gcsfs", "gcsfs"),
    "abfs": ("adlfs", "adlfs"), "az": ("adlfs", "adlfs"),
}


class RemoteError(Exception):
    """The remote is unreachable, misconfigured or read-only; the message is one line."""


class UntrustedEntry(Exception):
    """A remote entry that is unsigned, or signed with another secret (only with a secret set)."""


def _one_line(exc: BaseException) -> str:
    return one_line(exc, 300) or type(exc).__name__


def _redact(url: str) -> str:
    return re.sub(r"//[^/@]*@", "//***@", url)


class RemoteStore:
    def __init__(self, url: str, read_only: bool = False, storage_options: dict | None = None,
                 secret: bytes | None = None):
        if not isinstance(url, str) or not url.strip():
            raise RemoteError("remote cache: empty URL")
        url = url.strip()
        match = _SCHEME.match(url)
        self.protocol = match.group(1).lower() if match else "file"
        if not match:  # a plain path: resolve now, so a later chdir changes nothing
            url = os.path.abspath(os.path.expanduser(url))
        self.url = url
        self.read_only = bool(read_only)
        self.storage_options = dict(storage_options or {})
        self.secret = secret or None  # signs uploads and is required of downloads; never printed
        self._fs = None
        self._root = None
        self._pid = None
        pkg = _EXTERNAL.get(self.protocol)
        if pkg and importlib.util.find_spec(pkg[0]) is None:  # no import, just a lookup
            raise RemoteError(f"remote cache {self._name()}: {self.protocol}:// needs {pkg[0]}: "
                              f"pip install {pkg[1]}")

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

    # -- filesystem ---------------------------------------------------------

    def _filesystem(self):
        """(fs, root path) for this URL; rebuilt in a forked worker (async clients don't survive fork)."""
        if self._fs is None or self._pid != os.getpid():
            try:
                from fsspec.core import url_to_fs

                fs, root = url_to_fs(self.url, **self.storage_options)
            except ImportError as exc:
                pkg = _EXTERNAL.get(self.protocol, (None, None))[1]
                hint = f"pip install {pkg}" if pkg else _one_line(exc)
                raise RemoteError(f"remote cache {self._name()}: {self.protocol}:// needs {hint}") from exc
            except Exception as exc:
                raise self._error("cannot open", exc) from exc
            self._fs, self._root, self._pid = fs, root.rstrip("/"), os.getpid()
        return self._fs, self._root

    def _is_local(self, fs) -> bool:
        from fsspec.implementations.local import LocalFileSystem

        return isinstance(fs, LocalFileSystem)

    def _entry(self, key: str) -> str:
        if not isinstance(key, str) or not KEY_PATTERN.fullmatch(key):
            raise ValueError(f"not a cache key: {key!r}")
        _, root = self._filesystem()
        return f"{root}/{key[:2]}/{key}"

    # -- reading ------------------------------------------------------------

    def _read_manifest(self, fs, entry: str) -> tuple[bytes, dict] | None:
        """The manifest's bytes and its parsed, checked form; None when absent or unusable."""
        try:
            raw = fs.cat_file(f"{entry}/{ENTRY_MANIFEST}")
        except FileNotFoundError:
            return None
        try:
            manifest = json.loads(raw.decode("utf-8"))
            files = manifest["files"]
            if not isinstance(files, dict) or not all(safe_blob_name(n) for n in files):
                return None
        except (ValueError, KeyError, TypeError, AttributeError):
            return None
        return raw, manifest

    def _signature(self, raw: bytes) -> bytes:
        return hmac.new(self.secret, raw, hashlib.sha256).hexdigest().encode("ascii")

    def _signature_problem(self, fs, entry: str, raw: bytes) -> str | None:
        """Why the entry's HMAC does not vouch for ``raw`` (None: it does, or no secret is set)."""
        if self.secret is None:
            return None
        try:
            stored = fs.cat_file(f"{entry}/{SIGNATURE}")
        except FileNotFoundError:
            return "is not signed"
        if not hmac.compare_digest(bytes(stored).strip(), self._signature(raw)):
            return "has a signature that does not match ETFORGE_CACHE_KEY"
        return None

    def fetch(self, key: str, dest: Path) -> bool:
        """Download entry ``key`` (all blobs + manifest.json) into the empty local dir ``dest``.

        False when the remote has no complete, well-formed entry (including a manifest naming
        a blob outside its entry). Raises RemoteError for an unreachable/misconfigured remote,
        UntrustedEntry (before downloading any blob) when a secret is set and the entry's HMAC
        does not verify. The caller verifies every blob's sha256 against the manifest.
        """
        dest = Path(dest)
        fs, _ = self._filesystem()
        entry = self._entry(key)
        written: list[Path] = []
        try:
            found = self._read_manifest(fs, entry)
            if found is None:
                return False
            raw, manifest = found
            if manifest.get("key", key) != key:
                return False
            problem = self._signature_problem(fs, entry, raw)
            if problem:
                raise UntrustedEntry(f"remote cache {self._name()}: entry {key[:12]} {problem}; "
                                     "treating it as a miss")
            dest.mkdir(parents=True, exist_ok=True)
            real_dest = dest.resolve()
            for name in sorted(manifest["files"]):
                target = dest / name
                if target.resolve().parent != real_dest or os.path.lexists(target):
                    raise _Refused(name)
                written.append(target)
                fs.get_file(f"{entry}/{name}", str(target))
            target = dest / ENTRY_MANIFEST
            written.append(target)
            with open(target, "xb") as f:  # x: never through a planted file or link
                f.write(raw)
            return True
        except (FileNotFoundError, _Refused):
            _remove(written)
            return False
        except UntrustedEntry:
            raise
        except Exception as exc:
            _remove(written)
            raise self._error(f"cannot fetch {key[:12]}", exc) from exc

    def _complete(self, fs, entry: str, files: dict) -> bool:
        """Whether the remote holds this entry with the same blobs (names, sha256, sizes),
        signed with our secret when we have one."""
        found = self._read_manifest(fs, entry)
        if found is None or self._signature_problem(fs, entry, found[0]):
            return False
        remote_files = found[1]["files"]
        if {n: (m.get("sha256"), m.get("size")) for n, m in remote_files.items() if isinstance(m, dict)} != \
                {n: (m["sha256"], m["size"]) for n, m in files.items()}:
            return False
        try:
            for name, meta in files.items():
                if fs.size(f"{entry}/{name}") != meta["size"]:
                    return False
        except FileNotFoundError:
            return False
        return True

    # -- writing ------------------------------------------------------------

    def upload(self, key: str, entry: Path) -> None:
        """Upload a complete local entry dir; blobs first (then its HMAC), manifest.json last.

        On a filesystem remote the entry is assembled in ``<url>/tmp/`` and renamed into
        place. No-op when the remote already holds the same blobs. RemoteError when read-only.
        """
        if self.read_only:
            raise RemoteError(f"remote cache {self._name()} is read-only: not uploading {key[:12]}")
        entry = Path(entry)
        try:
            raw = (entry / ENTRY_MANIFEST).read_bytes()
            files = json.loads(raw.decode("utf-8"))["files"]
        except (OSError, ValueError, KeyError) as exc:
            raise ValueError(f"not a cache entry: {entry}: {_one_line(exc)}") from exc
        for name in files:
            if not safe_blob_name(name) or not (entry / name).is_file():
                raise ValueError(f"not a cache entry: {entry}: bad or missing blob {name!r}")
        fs, root = self._filesystem()
        remote = self._entry(key)
        try:
            if self._complete(fs, remote, files):
                return
            signature = self._signature(raw) if self.secret is not None else None
            if self._is_local(fs):
                self._upload_dir(key, entry, files, signature, Path(root), Path(remote))
            else:
                self._upload_objects(fs, entry, files, signature, remote)
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

    def _upload_dir(self, key: str, entry: Path, files: dict, signature: bytes | None, root: Path,
                    remote: Path) -> None:
        tmp = root / "tmp"
        tmp.mkdir(parents=True, exist_ok=True)
        staging = tmp / f"upload-{key}-{uuid.uuid4().hex[:12]}"
        staging.mkdir()
        try:
            for name in sorted(files):
                shutil.copyfile(entry / name, staging / name)
            if signature is not None:
                (staging / SIGNATURE).write_bytes(signature)
            shutil.copyfile(entry / ENTRY_MANIFEST, staging / ENTRY_MANIFEST)
            for path in staging.iterdir():
                with open(path, "rb") as f:
                    os.fsync(f.fileno())
            remote.parent.mkdir(parents=True, exist_ok=True)
            if remote.exists():  # stale or corrupt (else _complete said so): move it aside first
                self._discard_dir(key, root, remote)
            try:
                os.rename(staging, remote)
            except OSError:
                fs, _ = self._filesystem()
                if not self._complete(fs, str(remote), files):  # lost a race: theirs is as good
                    raise
        finally:
            shutil.rmtree(staging, ignore_errors=True)

    def discard(self, key: str) -> None:
        """Delete a corrupt remote entry (best effort; no-op when read-only)."""
        if self.read_only:
            return
        try:
            fs, root = self._filesystem()
            remote = self._entry(key)
            if self._is_local(fs):
                self._discard_dir(key, Path(root), Path(remote))
                return
            try:  # the manifest first: from then on the entry is a miss
                fs.rm_file(f"{remote}/{ENTRY_MANIFEST}")
            except FileNotFoundError:
                pass
            fs.rm(remote, recursive=True)
        except Exception:
            pass

    def _discard_dir(self, key: str, root: Path, remote: Path) -> None:
        if not remote.exists():
            return
        # Rename first so a half-deleted entry is never mistaken for a whole one.
        trash = root / "tmp" / f"discard-{key}-{uuid.uuid4().hex[:12]}"
        trash.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.rename(remote, trash)
        except OSError:
            return
        shutil.rmtree(trash, ignore_errors=True)


class _Refused(Exception):
    """A manifest names a blob that would land outside the target directory."""


def _remove(paths: list[Path]) -> None:
    for path in paths:
        try:
            path.unlink()
        except OSError:
            pass


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
