"""Content-addressed store: ``artifacts/cache/<k[:2]>/<k>/``, optionally backed by a remote.

An entry is a directory of blobs plus ``manifest.json`` (etforge.cache.entries) (sha256 and size of
each blob, and the task's info). It is assembled in a temp directory and
renamed into place, so an entry either exists whole or not at all. Every
``get`` verifies each blob; a mismatch discards the entry and reports a miss.
A local miss is looked up in the remote store (etforge.cache.remote), verified the
same way, and kept locally; a built entry is uploaded unless the remote is
read-only. A remote entry nobody can use (damaged: a link, a special file, a
malformed manifest, a blob that does not match) is a miss, named in one warning
per run and set aside when the remote is writable.

The remote only ever speeds things up. The first time it fails in a run
(unreachable, refusing, misconfigured), one warning says so, and every worker
of that run carries on with the local store alone: a marker file under
``artifacts/.etforge/`` holding the run's id tells the others. Entries that
could not be uploaded are listed in ``artifacts/.etforge/pending-uploads/`` (one
empty file per key) and uploaded by a later run (``upload_pending``).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import sys
import tempfile
import uuid
from pathlib import Path

from etforge.cache.entries import ENTRY_MANIFEST, KEY_PATTERN, CorruptEntry, read_entry, seconds_of
from etforge.cache.records import signature, trusted
from etforge.cache.remote import DamagedEntry, RemoteError, UntrustedEntry
from etforge.core.atomic import atomic_copy
from etforge.core.digest import canonical_json, sha256_file
from etforge.core.text import one_line

REMOTE_DOWN = "remote-down"  # holds the id of the run that found the remote failing
REMOTE_WARNED = "remote-warned"  # the run's id, then one line per remote entry already warned about
PENDING = "pending-uploads"  # one empty file per key whose upload is owed to the remote


class Store:
    def __init__(self, root: Path, remote=None, state_dir: Path | None = None):
        self.root = Path(root)
        self.remote = remote  # a etforge.cache.remote.RemoteStore, or None
        self.state_dir = Path(state_dir) if state_dir else self.root.parent / ".etforge"
        # One store per doit invocation, made before process workers fork: they share this id.
        self.run_id = uuid.uuid4().hex
        self._remote_ok = True  # False once this process saw the remote fail (or was told so)
        # Entries this process verified (or stored) in this run: key -> (stat signatures of the
        # manifest and every blob, blob -> path, info, blob -> sha256). A second read of an entry
        # whose files kept their signatures is not hashed again (a capture every cell of a model reads).
        self._verified: dict = {}
        self._sha256: dict = {}  # key -> blob -> sha256 of the entry last verified or stored under it

    def entry_dir(self, key: str) -> Path:
        return self.root / key[:2] / key

    def has(self, key: str) -> bool:
        """Cheap local existence check (a stat); ``get`` does the verification."""
        return (self.entry_dir(key) / ENTRY_MANIFEST).is_file()

    def manifest(self, key: str) -> dict | None:
        """The local entry's manifest as stored (not verified), or None."""
        try:
            return json.loads((self.entry_dir(key) / ENTRY_MANIFEST).read_text(encoding="utf-8"))
        except (OSError, ValueError, RecursionError):
            return None

    def build_seconds(self, key: str) -> float | None:
        """The seconds entry ``key`` took to build, as its manifest records it: the local entry's,
        else the remote's (its manifest only); None when no entry records seconds in range (seconds_of)."""
        remote = self.remote.manifest(key) if self.remote is not None and self._remote_usable() else None
        for manifest in (self.manifest(key), remote):
            seconds = seconds_of(manifest.get("build_s")) if isinstance(manifest, dict) else None
            if seconds is not None:
                return seconds
        return None

    def entry_record(self, key: str) -> dict:
        """What a state record keeps of the local entry: each blob's sha256, size and mtime and
        the manifest's size and mtime, so that "is it still there" is a stat per file.
        Empty when the entry is gone (the record then never counts as up to date)."""
        manifest = self.manifest(key)
        entry = self.entry_dir(key)
        try:
            record = {ENTRY_MANIFEST: _stat(entry / ENTRY_MANIFEST)}
            for name, meta in (manifest or {}).get("files", {}).items():
                record[name] = {"sha256": meta["sha256"], **_stat(entry / name)}
        except (OSError, KeyError, TypeError, AttributeError):
            return {}
        return record if manifest is not None else {}

    def blob_sha256(self, key: str, name: str) -> str | None:
        """sha256 of blob ``name`` of the local entry, as its manifest records it."""
        meta = ((self.manifest(key) or {}).get("files") or {}).get(name)
        return meta.get("sha256") if isinstance(meta, dict) else None

    @contextlib.contextmanager
    def lock(self, key: str):
        """Exclusive across processes: one worker rebuilds a missing entry, the others wait for it."""
        path = self.root / "locks" / key
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)  # released by the kernel if the holder dies
            yield

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
            self._share(key)
            return hit
        if self._remote_usable() and self._fetch(key):
            hit = self._get_local(key)
        return hit

    def _get_local(self, key: str) -> tuple[dict, dict] | None:
        entry = self.entry_dir(key)
        try:
            seen = entry.stat().st_ino
        except OSError:
            return None
        kept = self._verified.get(key)
        if kept is not None and kept[0] == _signatures(entry, kept[1]):
            self._sha256[key] = kept[3]
            return kept[1], kept[2]
        try:
            files, info, shas = read_entry(entry)
        except (CorruptEntry, ValueError, KeyError, OSError):
            self.discard(key, only=seen)
            return None
        self._keep(key, entry, files, info, shas)
        return files, info

    def _keep(self, key: str, entry: Path, files: dict, info: dict, shas: dict) -> None:
        """Remember a verified entry while none of its files is too fresh to vouch for its bytes."""
        self._sha256[key] = shas
        signatures = _signatures(entry, files)
        if all(trusted(sig) for _, sig in signatures):
            self._verified[key] = (signatures, files, info, shas)
        else:
            self._verified.pop(key, None)

    def sha256_of(self, key: str) -> dict:
        """blob name -> sha256 of the entry this process last verified or stored under ``key`` ({}: none)."""
        return dict(self._sha256.get(key) or {})

    def _fetch(self, key: str) -> bool:
        staging = self.new_workdir()
        try:
            try:
                if not self.remote.fetch(key, staging):
                    return False
            except RemoteError as exc:
                self._remote_failed(exc)
                return False
            except UntrustedEntry as exc:
                if self._first_in_run(REMOTE_WARNED, key):
                    warn(str(exc))
                return False
            except DamagedEntry as exc:
                self._remote_damaged(key, str(exc))
                return False
            try:
                read_entry(staging)  # (verified again once installed: its paths change)
            except (CorruptEntry, ValueError, KeyError, OSError) as exc:
                self._remote_damaged(
                    key,
                    f"remote cache {self.remote.name()}: entry {key[:12]} is damaged: "
                    f"{one_line(exc) or type(exc).__name__}",
                )
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

    def put(
        self, key: str, files: dict, info: dict, expect: dict | None = None, build_s: float | None = None
    ) -> tuple[dict, dict]:
        """Store ``files`` (blob name -> path) under ``key``; return (stored paths, info).

        The info is the stored entry's: another writer may have installed the same key first.
        ``expect``: blob name -> sha256 the copies must have (CorruptEntry otherwise).
        ``build_s``: the seconds the build took, kept in the entry for whoever plans CI jobs later
        (``etforge ci-matrix``); never part of the info, so it changes no output.
        """
        staging = self.new_workdir()
        try:
            manifest: dict = {"key": key, "files": {}, "info": info}
            if build_s is not None:
                manifest["build_s"] = round(build_s, 3)
            for name, src in sorted(files.items()):
                dst = staging / name
                shutil.copyfile(src, dst)
                manifest["files"][name] = {"sha256": sha256_file(dst), "size": dst.stat().st_size}
                if expect is not None and expect.get(name) != manifest["files"][name]["sha256"]:
                    raise CorruptEntry(f"{src} does not have the expected sha256")
            (staging / ENTRY_MANIFEST).write_text(canonical_json(manifest), encoding="utf-8")
            entry = self._install(staging, key)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        self._share(key)
        stored = self.manifest(key) or manifest
        paths = {name: entry / name for name in files}
        shas = {n: m["sha256"] for n, m in (stored.get("files") or {}).items() if isinstance(m, dict)}
        self._keep(key, entry, paths, stored.get("info", info), shas)
        return paths, stored.get("info", info)

    def discard(self, key: str, only: int | None = None) -> None:
        """Remove the local entry; ``only``: the inode of the entry directory that failed
        verification, so that an entry another worker has just reinstalled is left alone."""
        self._verified.pop(key, None)
        self._sha256.pop(key, None)
        entry = self.entry_dir(key)
        try:
            if only is not None and entry.stat().st_ino != only:
                return
        except OSError:
            return
        # Rename first so a half-deleted entry is never mistaken for a whole one.
        trash = self.root / "tmp" / f"discard-{key}-{uuid.uuid4().hex[:12]}"
        trash.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.rename(entry, trash)
        except OSError:
            return
        shutil.rmtree(trash, ignore_errors=True)

    def reject(self, key: str) -> None:
        """Discard an entry that verified but must not be used: locally and on a writable remote."""
        self.discard(key)
        if self.remote is not None and not self.remote.read_only and self._remote_usable():
            self.remote.discard(key)  # best effort; a rebuilt entry replaces it anyway

    # -- the remote: an accelerator that may fail ---------------------------

    def check_remote(self) -> None:
        """Say now, once per run, when the remote cannot be used at all (a shared directory
        that does not exist): the run then goes on without it, owing its uploads."""
        try:
            self.remote.check()
        except RemoteError as exc:
            self._remote_failed(exc)

    def _remote_usable(self) -> bool:
        if self.remote is None or not self._remote_ok:
            return False
        try:
            if (self.state_dir / REMOTE_DOWN).read_bytes() == self.run_id.encode():
                self._remote_ok = False  # another worker of this run found it failing
        except OSError:
            pass
        return self._remote_ok

    def _remote_failed(self, exc: RemoteError) -> None:
        """Stop using the remote for the rest of this run, in every worker; warn once."""
        self._remote_ok = False
        if self._first_in_run(REMOTE_DOWN):
            owed = "" if self.remote.read_only else ", what it cannot upload is uploaded by a later run"
            warn(f"{exc}; carrying on with the local cache for this run (misses are built here{owed})")

    def _remote_damaged(self, key: str, message: str) -> None:
        """A remote entry nobody can use: a miss, set aside when the remote is writable (so that
        no one tries it again), and named in one warning per run, whichever worker finds it."""
        self.remote.discard(key)  # a no-op when read-only
        if self._first_in_run(REMOTE_WARNED, key):
            done = "the remote is read-only: left in place" if self.remote.read_only else "set aside on the remote"
            warn(f"{message}; treating it as a miss ({done})")

    def _first_in_run(self, name: str, item: str = "") -> bool:
        """Mark ``name`` (or ``item`` in it) for this run; True for the one caller, of any worker,
        that marked it. The file holds the run's id, then one line per item."""
        path = self.state_dir / name
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(path, "a+", encoding="utf-8") as handle:
                fcntl.flock(handle, fcntl.LOCK_EX)
                handle.seek(0)
                lines = handle.read().split("\n")
                if lines[0] != self.run_id:
                    handle.seek(0)
                    handle.truncate()
                    handle.write(self.run_id)
                elif not item or item in lines[1:]:
                    return False
                if item:
                    handle.write(f"\n{item}")
                return True
        except OSError:
            return True

    def _share(self, key: str) -> None:
        """Offer a local entry to a writable remote; owe it (pending) when the remote cannot take it."""
        if self.remote is None or self.remote.read_only:
            return
        if self._remote_usable():
            try:
                self.remote.upload(key, self.entry_dir(key))
                return
            except RemoteError as exc:
                self._remote_failed(exc)
        try:
            pending = self.state_dir / PENDING
            pending.mkdir(parents=True, exist_ok=True)
            (pending / key).touch()
        except OSError:
            pass  # only a reminder: the next run that uses this entry offers it again

    def has_pending(self) -> bool:
        try:
            return any(os.scandir(self.state_dir / PENDING))
        except OSError:
            return False

    def upload_pending(self) -> int:
        """Upload what earlier runs owe a writable remote; return how many entries went up.
        Stops at the first remote failure (warned once); the rest stays pending."""
        if self.remote is None or self.remote.read_only:
            return 0
        pending = self.state_dir / PENDING
        try:
            keys = sorted(os.listdir(pending))
        except OSError:
            return 0
        uploaded = 0
        for key in keys:
            if not self._remote_usable():
                break
            if KEY_PATTERN.fullmatch(key) and self._get_local(key) is not None:  # verified: a corrupt entry is dropped
                try:
                    self.remote.upload(key, self.entry_dir(key))
                except RemoteError as exc:
                    self._remote_failed(exc)
                    break
                except ValueError:
                    pass  # not a cache key, or not an entry: nothing to share
                else:
                    uploaded += 1
            try:
                (pending / key).unlink(missing_ok=True)
            except OSError:  # not a reminder etforge wrote (a directory...): a reminder of nothing
                shutil.rmtree(pending / key, ignore_errors=True)
        return uploaded


def warn(message: str) -> None:
    print(f"etforge: warning: {message}", file=sys.stderr, flush=True)


def _stat(path: Path) -> dict:
    st = path.stat()
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns}


def _fsync_dir_files(directory: Path) -> None:
    for path in directory.iterdir():
        with open(path, "rb") as f:
            os.fsync(f.fileno())


def _signatures(entry: Path, files: dict) -> tuple:
    """(name, stat signature) of an entry's manifest and of each of its blobs."""
    names = (ENTRY_MANIFEST, *sorted(files))
    return tuple((name, signature(entry / name)) for name in names)


def materialize(blob: Path, target: Path) -> None:
    """Copy a verified blob to its working-tree path atomically."""
    atomic_copy(blob, target)
