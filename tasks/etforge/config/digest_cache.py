"""sha256 of files, memoised by stat signature, so a no-op run hashes nothing it has hashed before.

File digests are kept by stat signature (size, mtime_ns, ctime_ns, inode) in a
small JSON state file (``artifacts/.etforge/digests.json``), with small JSON
values derived from a file's content (its imports, for config/code_deps.py)
keyed by that content's sha256.

The signature holds ctime for the reason git's index does: ``cp -p``, ``touch -r``
and ``os.utime`` can give a changed file its old size and mtime, but no user can
set ctime. A file changed less than RACY_NS before it was hashed is not memoised
(git's "racily clean" rule): a second write within one timestamp tick would keep
every stat field, so such a file is hashed again on the next run.

The file is a cache: its first line carries the sha256 of the rest, so a damaged memo (a
flipped byte inside a kept parse) is set aside with one warning and the run hashes afresh.

The cache also remembers, per process, each file's signature and sha256 when it was first
hashed: what the plan's keys were computed from. After a task ran, ``changed_since_seen``
says whether a file it read was edited meanwhile (etforge.engine.cached_run discards
such a result: it would be stored under the key of content it did not read).
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from etforge.core.atomic import atomic_write_text
from etforge.core.damaged import set_aside
from etforge.core.digest import canonical_json, sha256_file
from etforge.core.errors import BadValue
from etforge.core.jsonfile import read_regular

PROJECT_MEMO = Path("artifacts") / ".etforge" / "digests.json"  # relative to the project directory
# Coarser than the timestamp tick of the file systems a checkout lives on (ext4, xfs, tmpfs:
# one kernel jiffy, at most 10 ms; APFS: 1 ns). A file must have been written this long
# before it is hashed for its digest to be memoised.
RACY_NS = 100_000_000
MEMO_FORMAT = "etforge-digests/2"


class DigestCache:
    """sha256 of files, memoised by stat signature in a JSON state file.

    It also memoises small JSON values derived from a file's content (its
    imports, for etforge.config.code_deps), keyed by the content's sha256, so a no-op
    run neither hashes nor parses a file it has seen before.
    """

    def __init__(self, state_file: Path):
        self.state_file = state_file
        data = read_memo(state_file)
        self.entries: dict = data.files
        self.derived_entries: dict = data.derived  # kind -> content sha256 -> value
        self.used: set = set()  # (kind, sha256) read or computed by this run
        self._resolved: dict = {}  # path as asked -> its resolved name, the memo's key
        # resolved name -> (signature, sha256, when hashed) as this process first saw it: what the
        # plan's keys were computed from, for :meth:`changed_since_seen` after a task ran
        self.seen: dict[str, tuple[list, str, int]] = {}
        self._recording: list[set] = []  # the open :meth:`recording` sets
        self.dirty = False

    def file_digest(self, path: Path) -> str:
        st = path.stat()
        signature = [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]
        key = self.name_of(path)
        for names in self._recording:
            names.add(key)
        cached = self.entries.get(key)
        if isinstance(cached, list) and len(cached) == 5 and cached[:4] == signature and isinstance(cached[4], str):
            self.seen.setdefault(key, (signature, cached[4], time.time_ns()))
            return cached[4]
        value = sha256_file(path)
        self.seen.setdefault(key, (signature, value, time.time_ns()))
        if time.time_ns() - max(st.st_mtime_ns, st.st_ctime_ns) >= RACY_NS:
            self.entries[key] = signature + [value]
            self.dirty = True
        elif self.entries.pop(key, None) is not None:  # racily clean: the next run hashes it again
            self.dirty = True
        return value

    def name_of(self, path: Path) -> str:
        """The name the memo keeps ``path`` under: its resolved path."""
        key = self._resolved.get(path)
        if key is None:
            key = str(path.resolve())
            if path.is_absolute():  # resolving lstats every component: once per absolute path per run
                self._resolved[path] = key
        return key

    @contextmanager
    def recording(self) -> Iterator[set]:
        """The resolved names of the files hashed inside the ``with`` block (what a model's
        resolution read: its code, weights, data), for :meth:`changed_since_seen`."""
        names: set = set()
        self._recording.append(names)
        try:
            yield names
        finally:
            self._recording.remove(names)

    def changed_since_seen(self, files: Iterable[str]) -> str | None:
        """The first of ``files`` (resolved names) whose content is no longer what this process
        first hashed, or None. A file whose stat signature is unchanged, and was old enough when
        hashed to vouch for it (the racy-window rule), is not read again."""
        for name in files:
            seen = self.seen.get(name)
            if seen is None:
                continue  # never hashed by this process: no key was computed from it
            signature, value, hashed_at = seen
            try:
                st = os.stat(name)
            except OSError:
                return name  # gone (or unreadable) since
            now = [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]
            if now == signature and hashed_at - max(st.st_mtime_ns, st.st_ctime_ns) >= RACY_NS:
                continue
            try:
                if sha256_file(Path(name)) != value:
                    return name
            except OSError:
                return name
        return None

    def derived(self, kind: str, content_sha256: str, compute):
        """``compute()`` for content ``content_sha256``, memoised (a JSON-serialisable value)."""
        table = self.derived_entries.setdefault(kind, {})
        self.used.add((kind, content_sha256))
        if content_sha256 not in table:
            table[content_sha256] = compute()
            self.dirty = True
        return table[content_sha256]

    def knows(self, kind: str, content_sha256: str) -> bool:
        """Whether a value of ``kind`` is memoised for ``content_sha256`` (kept by this run if so)."""
        if content_sha256 not in self.derived_entries.get(kind, {}):
            return False
        self.used.add((kind, content_sha256))
        return True

    def remember(self, kind: str, content_sha256: str, value=True) -> None:
        """Memoise ``value`` of ``kind`` for ``content_sha256`` (a JSON-serialisable value)."""
        self.derived_entries.setdefault(kind, {})[content_sha256] = value
        self.used.add((kind, content_sha256))
        self.dirty = True

    def save(self) -> None:
        if not self.dirty:
            return
        # Values of contents no longer seen would pile up with every edit: keep this run's.
        derived = {
            kind: {sha: v for sha, v in table.items() if (kind, sha) in self.used}
            for kind, table in self.derived_entries.items()
        }
        try:
            atomic_write_text(self.state_file, memo_text(MemoData(self.entries, derived)))
        except OSError:
            pass  # only a memo: losing it costs a re-hash, never correctness
        self.dirty = False


@dataclass(frozen=True)
class MemoData:
    """What the memo file holds: stat-keyed file digests, and values derived from contents."""

    files: dict = field(default_factory=dict)  # resolved path -> [size, mtime_ns, ctime_ns, inode, sha256]
    derived: dict = field(default_factory=dict)  # kind -> content sha256 -> JSON value


def memo_text(data: MemoData) -> str:
    """The memo file: a header line with the format and the sha256 of the body, then the body.
    The checksum turns any damage (a flipped byte inside a kept parse) into a miss, not a wrong plan."""
    body = canonical_json({"files": data.files, "derived": data.derived})
    header = canonical_json({"format": MEMO_FORMAT, "sha256": hashlib.sha256(body.encode()).hexdigest()})
    return f"{header}\n{body}\n"


def read_memo(state_file: Path) -> MemoData:
    """The memo in ``state_file``; empty when there is none. A damaged one (a wrong checksum, a
    body of the wrong shape) is set aside as ``<name>.damaged`` with one warning: it is a cache."""
    try:
        raw = read_regular(state_file)
    except OSError:
        return MemoData()
    except BadValue as exc:  # a FIFO, a directory, a huge file in its place
        set_aside(state_file, str(exc))
        return MemoData()
    header, _, body = raw.partition(b"\n")
    try:
        head = json.loads(header)
        if isinstance(head, dict) and "files" in head:  # the format before the checksum: start afresh
            return MemoData()
        if not isinstance(head, dict) or head.get("format") != MEMO_FORMAT:
            raise BadValue("not an etforge digest memo")
        if hashlib.sha256(body.rstrip(b"\n")).hexdigest() != head.get("sha256"):
            raise BadValue("its checksum does not match its content")
        data = json.loads(body)
        if not (
            isinstance(data, dict)
            and isinstance(data.get("files"), dict)
            and isinstance(data.get("derived"), dict)
            and all(isinstance(table, dict) for table in data["derived"].values())
        ):
            raise BadValue("its content has the wrong shape")
        return MemoData(data["files"], data["derived"])
    except (ValueError, RecursionError) as exc:  # (UnicodeDecodeError is a ValueError)
        set_aside(state_file, "is damaged" if isinstance(exc, RecursionError) else str(exc))
        return MemoData()


def digest_cache_for(pipeline_file: Path) -> DigestCache:
    """The file-digest memo of the project that ``pipeline_file`` belongs to."""
    return DigestCache(Path(pipeline_file).absolute().parent / PROJECT_MEMO)
