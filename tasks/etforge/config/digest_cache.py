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
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from etforge.core.atomic import atomic_write_text
from etforge.core.digest import canonical_json, sha256_file

PROJECT_MEMO = Path("artifacts") / ".etforge" / "digests.json"  # relative to the project directory
# Coarser than the timestamp tick of the file systems a checkout lives on (ext4, xfs, tmpfs:
# one kernel jiffy, at most 10 ms; APFS: 1 ns). A file must have been written this long
# before it is hashed for its digest to be memoised.
RACY_NS = 100_000_000


class DigestCache:
    """sha256 of files, memoised by stat signature in a JSON state file.

    It also memoises small JSON values derived from a file's content (its
    imports, for etforge.config.code_deps), keyed by the content's sha256, so a no-op
    run neither hashes nor parses a file it has seen before.
    """

    def __init__(self, state_file: Path):
        self.state_file = state_file
        self.entries: dict = {}
        self.derived_entries: dict = {}  # kind -> content sha256 -> value
        self.used: set = set()  # (kind, sha256) read or computed by this run
        self._resolved: dict = {}  # path as asked -> its resolved name, the memo's key
        self.dirty = False
        try:
            data = json.loads(state_file.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            data = {}
        if not isinstance(data, dict):
            data = {}
        if isinstance(data.get("files"), dict):
            self.entries = data["files"]
            derived = data.get("derived")
            self.derived_entries = derived if isinstance(derived, dict) else {}
        else:  # the first format: the file table alone
            self.entries = data

    def file_digest(self, path: Path) -> str:
        st = path.stat()
        signature = [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]
        key = self._resolved.get(path)
        if key is None:
            key = str(path.resolve())
            if path.is_absolute():  # resolving lstats every component: once per absolute path per run
                self._resolved[path] = key
        cached = self.entries.get(key)
        if isinstance(cached, list) and cached[:4] == signature:
            return cached[4]
        value = sha256_file(path)
        if time.time_ns() - max(st.st_mtime_ns, st.st_ctime_ns) >= RACY_NS:
            self.entries[key] = signature + [value]
            self.dirty = True
        elif self.entries.pop(key, None) is not None:  # racily clean: the next run hashes it again
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
            atomic_write_text(self.state_file, canonical_json({"files": self.entries, "derived": derived}))
        except OSError:
            pass  # only a memo: losing it costs a re-hash, never correctness
        self.dirty = False


def digest_cache_for(pipeline_file: Path) -> DigestCache:
    """The file-digest memo of the project that ``pipeline_file`` belongs to."""
    return DigestCache(Path(pipeline_file).absolute().parent / PROJECT_MEMO)
