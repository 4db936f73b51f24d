"""The baseline of ``etforge diff``: a release archive, a release directory, or a git revision.

    load(plan, given) -> Baseline       or BaselineError: one line saying which of
                                        missing, truncated/damaged, another pipeline, newer etforge

A release keeps its deterministic figures in ``provenance.json`` (inside the archive or the
directory) and its host timings beside it, in ``<name>-<version>.bench.json`` (not
reproducible, so not in the archive). A git revision names the release built from that
revision: the one under ``artifacts/release/`` whose provenance records it.

A release made before provenance carried ``metrics`` is read as far as it goes: its cells'
status, sha256, size, delegated op counts and verdict.
"""

from __future__ import annotations

import json
import re
import subprocess
import tarfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path

from etforge.checks.base import finite
from etforge.core.errors import EtforgeError
from etforge.pipeline.layout import layout_of
from etforge.publish.cell_metrics import PROVENANCE_FORMAT

PROVENANCE = "provenance.json"
FORMAT = re.compile(r"^etforge-provenance/(\d+)$")
KNOWN_FORMAT = int(PROVENANCE_FORMAT.rsplit("/", 1)[1])  # the newest format this etforge reads


class BaselineError(EtforgeError):
    """A baseline that cannot be compared with: one line, exit status 2."""

    exit_code = 2


@dataclass(frozen=True)
class Baseline:
    label: str  # how the diff names it: the release and where it came from
    source: Path  # the archive or directory read
    cells: dict  # cell name -> {"status", "sha256"?, "cell"?, "metrics"?}
    timings: dict = field(default_factory=dict)  # cell name -> the benchmark result recorded then
    toolchain: dict = field(default_factory=dict)
    etforge_version: str | None = None


def load(plan, given: str) -> Baseline:
    """The baseline ``given`` names (a path relative to the current directory or the project)."""
    path = _existing(plan, given) or _from_revision(plan, given)
    bench: Path | None = None
    if path.is_dir():
        provenance = _read_json(path / PROVENANCE, given, "release directory")
        bench = path.parent / f"{path.name}.bench.json"
    else:
        provenance = _from_archive(path, given)
        if path.name.endswith(".tar.gz"):
            bench = path.with_name(path.name[: -len(".tar.gz")] + ".bench.json")
    return _baseline(plan, given, path, provenance, bench)


def _existing(plan, given: str) -> Path | None:
    for candidate in (Path(given), plan.root / given):
        if candidate.exists():
            return candidate
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
    except (OSError, subprocess.SubprocessError):
        run = None
    if run is None or run.returncode != 0 or not run.stdout.strip():
        raise BaselineError(f"baseline {given} is missing: no such release archive, directory or git revision")
    revision = run.stdout.strip()
    releases = layout_of(plan).release_root
    for candidate in sorted(releases.glob("*")) if releases.is_dir() else ():
        if candidate.is_dir() and (candidate / PROVENANCE).is_file():
            try:
                recorded = json.loads((candidate / PROVENANCE).read_text(encoding="utf-8")).get("git_revision")
            except (OSError, ValueError, AttributeError):
                continue
            if isinstance(recorded, str) and recorded.split("-")[0] == revision:
                return candidate
    raise BaselineError(
        f"baseline {given} is missing: no release of revision {revision[:12]} under "
        f"{_shown(plan, releases)}/ (build one there with `etforge release`, or name an archive)"
    )


def _shown(plan, path: Path) -> str:
    try:
        return path.relative_to(plan.root).as_posix()
    except ValueError:
        return str(path)


def _read_json(path: Path, given: str, what: str) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise BaselineError(f"baseline {given} is not an etforge release: the {what} has no {PROVENANCE}") from None
    except (OSError, ValueError) as exc:
        raise BaselineError(f"baseline {given} is damaged: {PROVENANCE} cannot be read ({exc})") from None
    if not isinstance(data, dict):
        raise BaselineError(f"baseline {given} is damaged: {PROVENANCE} is not a JSON object")
    return data


def _from_archive(path: Path, given: str) -> dict:
    """provenance.json of a release archive, read to its end (a truncated archive is named as such)."""
    found = None
    try:
        with tarfile.open(path, "r:gz") as tar:
            for member in tar:  # every member: the gzip stream is read to its end
                if member.isfile() and member.name.count("/") == 1 and member.name.endswith("/" + PROVENANCE):
                    f = tar.extractfile(member)
                    found = f.read() if f else None
    except (tarfile.TarError, EOFError, zlib.error, OSError) as exc:
        raise BaselineError(f"baseline {given} is truncated or damaged: {str(exc) or type(exc).__name__}") from None
    if found is None:
        raise BaselineError(f"baseline {given} is not an etforge release: the archive has no {PROVENANCE}")
    try:
        data = json.loads(found.decode("utf-8"))
    except (ValueError, UnicodeDecodeError):
        raise BaselineError(f"baseline {given} is damaged: its {PROVENANCE} is not JSON") from None
    if not isinstance(data, dict):
        raise BaselineError(f"baseline {given} is damaged: {PROVENANCE} is not a JSON object")
    return data


def _baseline(plan, given: str, path: Path, provenance: dict, bench: Path | None) -> Baseline:
    found = FORMAT.match(str(provenance.get("format", "")))
    if found is None:
        raise BaselineError(f"baseline {given} is not an etforge release: {PROVENANCE} has no etforge format")
    version = provenance.get("etforge_version")
    if int(found.group(1)) > KNOWN_FORMAT:
        raise BaselineError(
            f"baseline {given} was made by a newer etforge ({version}, {provenance['format']}); "
            f"this etforge reads up to etforge-provenance/{KNOWN_FORMAT}: upgrade etforge to compare with it"
        )
    release = str(provenance.get("release") or "")
    named = (provenance.get("pipeline") or {}).get("name") if isinstance(provenance.get("pipeline"), dict) else None
    if named is not None and named != plan.name or named is None and not release.startswith(f"{plan.name}-"):
        raise BaselineError(
            f"baseline {given} is a release of another pipeline ({named or release}), not of {plan.name!r}"
        )
    cells: dict = {}
    for entry in provenance.get("cells") or ():
        if isinstance(entry, dict) and entry.get("model"):
            name = f"{entry.get('model')}/{entry.get('backend')}/{entry.get('quantization')}"
            cells[name] = {
                "status": entry.get("status"),
                "sha256": entry.get("sha256"),
                "cell": {k: entry.get(k) for k in ("thresholds", "delegates", "inputs") if k in entry},
                "metrics": entry.get("metrics") if isinstance(entry.get("metrics"), dict) else _older(entry),
            }
    for key in ("failures", "not_shipped"):
        for entry in provenance.get(key) or ():
            if isinstance(entry, dict) and isinstance(entry.get("cell"), str):
                cells.setdefault(entry["cell"], {"status": entry.get("status")})
    return Baseline(
        label=f"{release or path.name} ({given})" if release and release not in given else given,
        source=path,
        cells=cells,
        timings=_timings(bench),
        toolchain=dict(provenance["toolchain"]) if isinstance(provenance.get("toolchain"), dict) else {},
        etforge_version=version if isinstance(version, str) else None,
    )


def _older(entry: dict) -> dict:
    """The figures of a cell recorded before provenance carried ``metrics``: as far as they go."""
    verdict: dict = entry["verdict"] if isinstance(entry.get("verdict"), dict) else {}
    d, n = finite(entry.get("delegated_ops")), finite(entry.get("non_delegated_ops"))
    numerics = {k: verdict.get(k) for k in ("sqnr_db", "top1_agreement", "top5_agreement", "exact") if k in verdict}
    out: dict = {"size": {"bytes": entry.get("size_bytes")}, "numerics": numerics, "delegation": {}}
    if d is not None and n is not None and d + n > 0:
        out["delegation"] = {"coverage": round(d / (d + n), 4), "delegated_ops": d, "non_delegated_ops": n}
    return out


def _timings(bench: Path | None) -> dict:
    """The release's host timings (cell -> benchmark result), {} when absent or unreadable: timings
    are compared only where both sides have them."""
    if bench is None:
        return {}
    try:
        data = json.loads(bench.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return {k: v for k, v in data.items() if isinstance(v, dict)} if isinstance(data, dict) else {}
