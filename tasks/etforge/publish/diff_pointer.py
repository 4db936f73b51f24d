"""Where ``etforge diff`` leaves the baseline it compared with, for the report (publish/diff_section.py).

    path(plan)                 the pointer file, in the pipeline's artifact directory
    remembered_source(plan)    the release it names (its provenance.json for a directory), or None
    remembered_files(plan)     every file that release was read from (provenance or archive, bench.json)
    stat_target(source)        the file whose stat stands for a release (a directory's provenance.json)
    release_files(source)      every file a release is read from: that one and its timings
    Seen.of(files)             their stat signatures, taken before they are read

Apart from diff_section so that the memo of the report's key (publish/content_reads.py) can
watch that release without importing the comparison code on every run.

A release is known unchanged while every file it was read from keeps the stat signature it had
before it was read (size, mtime, ctime, inode: etforge.cache.records ``signature``, as the rest of
etforge) and each was old enough then to vouch for its bytes (records ``trusted``, git's racily
clean rule): a release replaced at the same path by one of the same size and mtime (``tar x``,
``cp -p``) has another ctime and inode, and one written just before it was read is read again.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from etforge.cache.records import signature, trusted
from etforge.core.errors import BadValue
from etforge.core.jsonfile import parse_json, read_regular
from etforge.pipeline.layout import layout_of

PROVENANCE = "provenance.json"


def path(plan) -> Path:
    return layout_of(plan).out_dir / ".diff-baseline.json"


def stat_target(source: Path) -> Path:
    """The file whose stat stands for a baseline release: a directory's provenance.json, or the archive."""
    return source / PROVENANCE if source.is_dir() else source


def bench_beside(source: Path) -> Path | None:
    """The release's host timings, beside it (``<name>-<version>.bench.json``); None for a file
    that is not a .tar.gz (no name to find them by)."""
    if source.is_dir():
        return source.parent / f"{source.name}.bench.json"
    if source.name.endswith(".tar.gz"):
        return source.with_name(source.name[: -len(".tar.gz")] + ".bench.json")
    return None


def release_files(source: Path) -> tuple[Path, ...]:
    """Every file a release at ``source`` is read from: its provenance (or archive), its timings."""
    bench = bench_beside(source)
    return (stat_target(source),) + ((bench,) if bench is not None else ())


@dataclass(frozen=True)
class Seen:
    """The stat signatures of the files a release was read from, taken before reading them."""

    files: tuple  # ((path, signature or None: there was none), ...)
    trusted: bool  # every file old enough, when seen, for its signature to vouch for its bytes

    @classmethod
    def of(cls, files) -> Seen:
        seen = tuple((str(f), signature(f)) for f in files)
        return cls(files=seen, trusted=all(trusted(sig) for _, sig in seen))

    def unchanged(self) -> bool:
        """Whether every file is still what was read: the same signature, and one that vouches."""
        return self.trusted and all(signature(f) == sig for f, sig in self.files)

    def to_json(self) -> dict:
        return {"files": [[f, list(sig) if sig else None] for f, sig in self.files], "trusted": self.trusted}

    @classmethod
    def from_json(cls, data) -> Seen:
        """The form :meth:`to_json` writes, else BadValue."""
        files = data.get("files") if isinstance(data, dict) else None
        if not isinstance(files, list) or not isinstance(data.get("trusted"), bool):
            raise BadValue("not a record of files seen")
        seen = []
        for entry in files:
            if not (isinstance(entry, list) and len(entry) == 2 and isinstance(entry[0], str)):
                raise BadValue("not a record of files seen")
            sig = entry[1]
            if sig is not None and not (isinstance(sig, list) and all(type(n) is int for n in sig)):
                raise BadValue("not a record of files seen")
            seen.append((entry[0], tuple(sig) if sig is not None else None))
        return cls(files=tuple(seen), trusted=data["trusted"])


def kept(plan) -> dict | None:
    """The pointer as ``etforge diff`` wrote it (an object), or None: none, or not one etforge wrote."""
    try:
        data = parse_json(read_regular(path(plan)))
    except (OSError, BadValue):
        return None
    return data if isinstance(data, dict) else None


def remembered_files(plan) -> tuple[Path, ...]:
    """Every file the release the last diff named was read from (none when there is none)."""
    data = kept(plan)
    try:
        return tuple(Path(f) for f, _ in Seen.from_json(data.get("seen")).files) if data else ()
    except BadValue:
        return ()


def remembered_source(plan) -> Path | None:
    """The file whose stat decides whether the report shows its "changes since" section."""
    files = remembered_files(plan)
    return files[0] if files else None
