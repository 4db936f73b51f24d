"""The baseline of ``etforge diff``: a release archive, a release directory, or a git revision.

    load(plan, given) -> Baseline       or BaselineError: one line saying which of
                                        missing, truncated/damaged, another pipeline, newer etforge
    read(plan, given, source)           the release at ``source`` (the report reads it again so)

A release keeps its deterministic figures in ``provenance.json`` (inside the archive or the
directory) and its host timings beside it, in ``<name>-<version>.bench.json`` (not
reproducible, so not in the archive). A git revision names the release built from that
revision: the one under ``artifacts/release/`` whose provenance records it.

A release made before provenance carried ``metrics`` is read as far as it goes: its cells'
status, sha256, size, delegated op counts and verdict.

Nothing in a baseline is trusted. Its files are read only when they are regular files (a FIFO
or a device is refused without blocking) and only so far (etforge.publish.baseline read_regular);
its JSON is parsed with nesting and integers bounded (parse_json); and every field the diff
reads is checked for its type (PROVENANCE here, the cells' figures and timings in
etforge.publish.cell_metrics). Whatever is wrong is one BaselineError naming the file and the
key: exit status 2, never a traceback or a hang.
"""

from __future__ import annotations

import re
import subprocess
import tarfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path

from etforge.core import swap
from etforge.core.errors import BadValue, EtforgeError
from etforge.core.jsonfile import MAX_BYTES, open_regular, parse_json, read_regular
from etforge.core.text import one_line
from etforge.pipeline.layout import layout_of
from etforge.publish import cell_metrics
from etforge.publish.baseline import shown
from etforge.publish.cell_metrics import FLAG, NUMBER, SCALAR, TEXT, ListOf, MapOf, Record
from etforge.publish.diff_pointer import PROVENANCE, Seen, bench_beside, release_files

FORMAT = re.compile(r"etforge-provenance/([0-9]{1,6})")  # (a 5,000-digit "version" is no format)
KNOWN_FORMAT = int(cell_metrics.PROVENANCE_FORMAT.rsplit("/", 1)[1])  # the newest format this etforge reads

# What a diff reads of provenance.json (the cells' metrics: cell_metrics.read_measured).
_LISTED = Record({"cell": TEXT, "status": TEXT}, required=("cell", "status"))
_VERDICT = Record({"sqnr_db": NUMBER, "top1_agreement": NUMBER, "top5_agreement": NUMBER, "exact": FLAG})
_CELL = Record(
    {
        "model": TEXT,
        "backend": TEXT,
        "quantization": TEXT,
        "status": TEXT,
        "sha256": TEXT,
        "thresholds": MapOf(SCALAR),
        # a release before ``metrics``: what _older reads
        "size_bytes": NUMBER,
        "delegated_ops": NUMBER,
        "non_delegated_ops": NUMBER,
        "verdict": _VERDICT,
    },
    required=("model", "backend", "quantization", "status"),
)
PROVENANCE_SHAPE = Record(
    {
        "release": TEXT,
        "etforge_version": TEXT,
        "git_revision": TEXT,
        "toolchain": MapOf(SCALAR),
        "pipeline": Record({"name": TEXT}),
        "cells": ListOf(_CELL),
        "failures": ListOf(_LISTED),
        "not_shipped": ListOf(_LISTED),
    }
)


class BaselineError(EtforgeError):
    """A baseline that cannot be compared with: one line, exit status 2."""

    exit_code = 2


@dataclass(frozen=True)
class Baseline:
    label: str  # how the diff names it: the release and where it came from
    source: Path  # the archive or directory read
    cells: dict  # cell name -> {"status", "sha256"?, "cell"?, "metrics"?} (cell_metrics.BASELINE_CELL)
    timings: dict = field(default_factory=dict)  # cell name -> the benchmark result recorded then
    toolchain: dict = field(default_factory=dict)
    etforge_version: str | None = None
    given: str = ""  # as the user named it
    seen: Seen = field(default_factory=lambda: Seen(files=(), trusted=False))  # its files, before reading


def load(plan, given: str) -> Baseline:
    """The baseline ``given`` names (a path relative to the current directory or the project)."""
    return read(plan, given, _existing(plan, given) or _from_revision(plan, given))


def read(plan, given: str, source: Path) -> Baseline:
    """The release at ``source`` (an archive or a directory), named ``given``."""
    if swap.pending(source):  # a release replaced halfway: its directory and archive may differ
        raise BaselineError(
            f"baseline {given} is being replaced, or its replacement was interrupted: "
            "run `etforge` (any command that builds) to finish it, then diff again"
        )
    seen = Seen.of(release_files(source))  # before reading: a file written meanwhile differs next time
    if source.is_dir():
        provenance, where = _provenance_file(source / PROVENANCE, given), str(source / PROVENANCE)
    else:
        provenance, where = _from_archive(source, given)
    return _baseline(plan, given, source, provenance, where, seen)


def _existing(plan, given: str) -> Path | None:
    for candidate in (Path(given), plan.root / given):
        try:
            if candidate.exists():
                return candidate
        except (OSError, ValueError):  # a name too long for a path, or not one at all: maybe a revision
            continue
    return None


def _from_revision(plan, given: str) -> Path:
    try:
        run = subprocess.run(
            ["git", "rev-parse", "--verify", "--quiet", f"{given}^{{commit}}"],
            cwd=plan.root,
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, ValueError, subprocess.SubprocessError):
        run = None
    if run is None or run.returncode != 0 or not run.stdout.strip():
        raise BaselineError(f"baseline {given} is missing: no such release archive, directory or git revision")
    revision = run.stdout.strip()
    releases = layout_of(plan).release_root
    for candidate in sorted(releases.glob("*")) if releases.is_dir() else ():
        if candidate.is_dir() and _revision_of(candidate).split("-")[0] == revision:
            return candidate
    raise BaselineError(
        f"baseline {given} is missing: no release of revision {revision[:12]} under "
        f"{_shown(plan, releases)}/ (build one there with `etforge release`, or name an archive)"
    )


def _revision_of(release: Path) -> str:
    """The git revision a release directory's provenance records ("" when it records none, or
    cannot be read: that one is not the release asked for)."""
    try:
        recorded = parse_json(read_regular(release / PROVENANCE))
    except (OSError, BadValue):
        return ""
    revision = recorded.get("git_revision") if isinstance(recorded, dict) else None
    return revision if isinstance(revision, str) else ""


def _shown(plan, path: Path) -> str:
    try:
        return path.relative_to(plan.root).as_posix()
    except ValueError:
        return str(path)


def _text(value) -> str:
    """A string of a baseline as a message shows it (cut); anything else by shown()."""
    return one_line(value, 60) if isinstance(value, str) else shown(value)


def _damaged(given: str, where: str, what) -> BaselineError:
    return BaselineError(f"baseline {given} is damaged: {where}: {what}")


def _provenance_file(path: Path, given: str):
    try:
        return parse_json(read_regular(path))
    except FileNotFoundError:
        raise BaselineError(
            f"baseline {given} is not an etforge release: the release directory has no {PROVENANCE}"
        ) from None
    except OSError as exc:
        raise _damaged(given, str(path), f"cannot be read ({exc.strerror or exc})") from None
    except BadValue as exc:
        raise _damaged(given, str(path), exc) from None


def _from_archive(path: Path, given: str) -> tuple:
    """(provenance.json of a release archive, what names it), the archive read to its end (a
    truncated archive is named as such)."""
    found, where = None, str(path)
    try:
        with open_regular(path) as raw, tarfile.open(fileobj=raw, mode="r:gz") as tar:
            for member in tar:  # every member: the gzip stream is read to its end
                if member.isfile() and member.name.count("/") == 1 and member.name.endswith("/" + PROVENANCE):
                    where = f"{member.name} in {path}"
                    if member.size > MAX_BYTES:
                        raise BadValue(f"is {member.size:,} bytes, more than the {MAX_BYTES:,} read")
                    f = tar.extractfile(member)
                    found = f.read() if f else None
    except BadValue as exc:
        raise _damaged(given, where, exc) from None
    except (tarfile.TarError, EOFError, zlib.error, OSError) as exc:
        raise BaselineError(f"baseline {given} is truncated or damaged: {str(exc) or type(exc).__name__}") from None
    if found is None:
        raise BaselineError(f"baseline {given} is not an etforge release: the archive has no {PROVENANCE}")
    try:
        return parse_json(found), where
    except BadValue as exc:
        raise _damaged(given, where, exc) from None


def _baseline(plan, given: str, path: Path, provenance, where: str, seen: Seen) -> Baseline:
    """The Baseline of ``provenance`` (read from ``where``), checked."""
    if not isinstance(provenance, dict):
        raise _damaged(given, where, "not a JSON object")
    fmt = provenance.get("format")
    found = FORMAT.fullmatch(fmt) if isinstance(fmt, str) else None
    if found is None:
        said = f" (format {shown(fmt)})" if fmt is not None else ""
        raise BaselineError(f"baseline {given} is not an etforge release: {PROVENANCE} has no etforge format{said}")
    version = provenance.get("etforge_version")
    if int(found.group(1)) > KNOWN_FORMAT:
        raise BaselineError(
            f"baseline {given} was made by a newer etforge ({_text(version)}, {fmt}); "
            f"this etforge reads up to etforge-provenance/{KNOWN_FORMAT}: upgrade etforge to compare with it"
        )
    try:  # every field read below, of the type it is read as
        cell_metrics.check(provenance, PROVENANCE_SHAPE)
        cells = _cells(provenance)
    except BadValue as exc:
        raise _damaged(given, where, exc) from None
    release = provenance.get("release") or ""
    named = (provenance.get("pipeline") or {}).get("name")
    if named is not None and named != plan.name or named is None and not release.startswith(f"{plan.name}-"):
        raise BaselineError(
            f"baseline {given} is a release of another pipeline ({_text(named or release)}), not of {plan.name!r}"
        )
    return Baseline(
        label=f"{release or path.name} ({given})" if release and release not in given else given,
        source=path,
        cells=cells,
        timings=_timings(bench_beside(path), given),
        toolchain=dict(provenance.get("toolchain") or {}),
        etforge_version=version,
        given=given,
        seen=seen,
    )


def _cells(provenance: dict) -> dict:
    """The baseline's cells by name, each as cell_metrics.BASELINE_CELL (its metrics in today's form)."""
    cells: dict = {}
    for i, entry in enumerate(provenance.get("cells") or ()):
        name = f"{entry['model']}/{entry['backend']}/{entry['quantization']}"
        metrics = entry.get("metrics")
        cells[name] = {
            "status": entry["status"],
            "sha256": entry.get("sha256"),
            "cell": {"thresholds": entry.get("thresholds")},  # what a diff reads of the cell's definition
            "metrics": cell_metrics.read_measured(
                metrics if metrics is not None else _older(entry), ("cells", i, "metrics")
            ),
        }
    for key in ("failures", "not_shipped"):
        for entry in provenance.get(key) or ():
            cells.setdefault(entry["cell"], {"status": entry["status"]})
    return cells


def _older(entry: dict) -> dict:
    """The figures of a cell recorded before provenance carried ``metrics``: as far as they go."""
    verdict: dict = entry.get("verdict") or {}
    d, n = entry.get("delegated_ops"), entry.get("non_delegated_ops")
    numerics = {k: verdict.get(k) for k in ("sqnr_db", "top1_agreement", "top5_agreement", "exact") if k in verdict}
    out: dict = {"size": {"bytes": entry.get("size_bytes")}, "numerics": numerics, "delegation": {}}
    if d is not None and n is not None and d + n > 0:
        out["delegation"] = {"coverage": round(d / (d + n), 4), "delegated_ops": d, "non_delegated_ops": n}
    return out


def _timings(bench: Path | None, given: str) -> dict:
    """The release's host timings (cell -> benchmark result), {} when there are none: timings are
    compared only where both sides have them. A file there that cannot be read is an error."""
    if bench is None:
        return {}
    try:
        data = parse_json(read_regular(bench))
        cell_metrics.check(data, MapOf(cell_metrics.TIMING))
    except FileNotFoundError:
        return {}
    except OSError as exc:
        raise _damaged(given, str(bench), f"cannot be read ({exc.strerror or exc})") from None
    except BadValue as exc:
        raise _damaged(given, str(bench), exc) from None
    return data
