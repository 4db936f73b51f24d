"""sha256 of files, memoised by stat signature, so a no-op run hashes nothing it has hashed before.

File digests are kept by (size, mtime_ns, inode) in a small JSON state file
(``artifacts/.etforge/digests.json``), with small JSON values derived from a
file's content (its imports, for config/code_deps.py) keyed by that content's
sha256.
"""

from __future__ import annotations

import json
from pathlib import Path

from tasks.core.atomic import atomic_write_text
from tasks.core.digest import canonical_json, sha256_file

PROJECT_MEMO = Path("artifacts") / ".etforge" / "digests.json"  # relative to the project directory


class DigestCache:
    """sha256 of files, memoised by stat signature in a JSON state file.

    It also memoises small JSON values derived from a file's content (its
    imports, for tasks/config/code_deps.py), keyed by the content's sha256, so a no-op
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


def digest_cache_for(pipeline_file: Path) -> DigestCache:
    """The file-digest memo of the project that ``pipeline_file`` belongs to."""
    return DigestCache(Path(pipeline_file).absolute().parent / PROJECT_MEMO)
