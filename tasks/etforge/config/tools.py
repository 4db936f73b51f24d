"""Versions of the tools a recipe declares, read without importing them.

A recipe's ``tools:`` block names what a stage depends on besides the
toolchain every task uses (torch, executorch, torchao): Python distributions
by their distribution names, and SDKs given by an environment variable. Their
versions join the keys of exactly the tasks of that stage, so upgrading a
backend compiler rebuilds that backend's programs and nothing else.

* a distribution: its installed version from package metadata (never imported),
  None when it is not installed;
* an SDK: the sha256 of its first version file that exists, else a digest of
  its file listing (relative names and sizes: cheap, no hashing of gigabytes),
  None when the variable is unset. The path itself is left out, so the same
  SDK installed elsewhere gives the same key (and shares the remote cache).
  A variable naming a single file contributes its name and size; one that is
  no path at all (a core name, a version string) contributes its value.
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from etforge.core.digest import sha256_file

# Bump when the meaning of any cached output changes without its inputs changing.
# 2: keys derived from the stage table (etforge.pipeline.stages), code by import closure.
# 3: the installable package (import name etforge), typed stage results, builders per model kind,
#    recipes as the one home of a backend's facts: every key changes once.
# 4: a stage's result holds its checks (etforge.checks: delegation, size, numerics on a runtime,
#    Vela), the export its costs as one record; records of 3 are not read as 4's.
SCHEMA_VERSION = 4
# Distributions every task uses; a backend's or scheme's own tools (coremltools,
# openvino, an SDK...) are declared in its recipe and join only its tasks' keys.
TOOLCHAIN_PACKAGES = ("torch", "torchvision", "executorch", "torchao")
# The Version field of a distribution's core metadata (a header line, before any description).
_VERSION_FIELD = re.compile(r"^Version:[ \t]*(\S+)", re.M)
# What each kind of recipe may declare under ``tools:``, and which task's key it joins.
STAGES = {"backend": ("lowering", "runtime"), "quantization": ("quantize",)}


@dataclass(frozen=True)
class Sdk:
    env: str  # the variable naming its root directory (or a single file, or a plain setting)
    version_files: tuple  # relative to the root; the first that exists stands for the SDK


@dataclass(frozen=True)
class ToolSet:
    python: tuple = ()  # distribution names, e.g. "openvino", "ethos-u-vela"
    sdks: tuple = ()  # of Sdk

    @classmethod
    def from_data(cls, node: dict | None) -> ToolSet:
        node = node or {}
        return cls(
            python=tuple(node.get("python", ())),
            sdks=tuple(Sdk(s["env"], tuple(s.get("version_files", ()))) for s in node.get("sdks", ())),
        )


def installed_version(name: str) -> str | None:
    """The installed version of distribution ``name`` (None: not installed): what
    ``importlib.metadata.version`` returns, read from the METADATA file's Version field.
    ``version()`` parses the whole file as an e-mail message; a no-op run makes 16 lookups,
    which this way cost a fifth as much (about 2 ms instead of 10)."""
    try:
        dist = metadata.distribution(name)
    except metadata.PackageNotFoundError:
        return None
    found = _VERSION_FIELD.search(dist.read_text("METADATA") or "")
    return found.group(1) if found else dist.version


class ToolVersions:
    """Looks each distribution and SDK up once per plan resolution (planning stays fast)."""

    def __init__(self, environ=None):
        self.environ = os.environ if environ is None else environ
        self._dists: dict = {}
        self._sdks: dict = {}

    def distribution(self, name: str) -> str | None:
        if name not in self._dists:
            self._dists[name] = installed_version(name)
        return self._dists[name]

    def sdk(self, sdk: Sdk) -> dict | None:
        root = self.environ.get(sdk.env)
        if not root:
            return None
        memo = (root, sdk.version_files)
        if memo not in self._sdks:
            self._sdks[memo] = sdk_fingerprint(Path(root), sdk.version_files)
        return self._sdks[memo]

    def versions(self, tools: ToolSet) -> dict:
        """{distribution: version, "$ENV": SDK fingerprint} for a ToolSet; {} when it names nothing."""
        out: dict = {name: self.distribution(name) for name in tools.python}
        out.update({f"${s.env}": self.sdk(s) for s in tools.sdks})
        return out


def sdk_fingerprint(root: Path, version_files: tuple = ()) -> dict:
    """What identifies the SDK at ``root`` without reading all of it."""
    try:
        if root.is_file():  # a single tool, e.g. a compiler binary named by its variable
            return {"file": root.name, "size": root.stat().st_size}
        for name in version_files:
            candidate = root / name
            if candidate.is_file():
                return {"version_file": name, "sha256": sha256_file(candidate)}
        if not root.is_dir():  # not a path: a setting such as a core name counts as is
            return {"value": str(root)}
        return {"listing": listing_digest(root)}
    except OSError as exc:  # unreadable: still a distinct, stable value
        return {"error": exc.strerror or type(exc).__name__}


def listing_digest(root: Path) -> str:
    """sha256 over the sorted (relative path, size) of every file under ``root``."""
    h = hashlib.sha256()
    entries = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        rel = os.path.relpath(dirpath, root)
        for name in filenames:
            path = os.path.join(dirpath, name)
            try:
                size = os.lstat(path).st_size
            except OSError:
                continue
            entries.append((os.path.normpath(os.path.join(rel, name)), size))
    for rel, size in sorted(entries):
        h.update(f"{rel}\0{size}\n".encode("utf-8", "surrogateescape"))
    return h.hexdigest()


def check_tools(recipe_data: dict) -> list[tuple[tuple, str]]:
    """Mistakes in a recipe's ``tools:`` the schema cannot see, as (key path, message) pairs."""
    tools = recipe_data.get("tools") or {}
    kind = str(recipe_data.get("kind"))
    problems: list = [
        (("tools", stage), f"a {kind} recipe declares tools for {', '.join(STAGES[kind])}, not {stage!r}")
        for stage in tools
        if stage not in STAGES.get(kind, ())
    ]
    entries = recipe_data.get("backends") or {}
    problems += [
        (
            ("tools", "quantize", name),
            f"tools for {name!r}, which is not an entry of 'backends' ({', '.join(entries) or 'none'})",
        )
        for name in (tools.get("quantize") or {})
        if name not in entries
    ]
    return problems


def stage_tools(recipe_data: dict, stage: str, entry: str | None = None) -> ToolSet:
    """The ToolSet a recipe declares for ``stage`` (for a scheme: for its backend ``entry``)."""
    node = (recipe_data.get("tools") or {}).get(stage) or {}
    if entry is not None:
        node = node.get(entry) or {}
    return ToolSet.from_data(node)


def toolchain_versions(version=None) -> dict:
    """Installed versions of TOOLCHAIN_PACKAGES, read from package metadata (never imports torch).

    ``version``: a memoising ``name -> version or None`` lookup (ToolVersions.distribution).
    """
    version = version or ToolVersions().distribution
    return {"etforge_schema": SCHEMA_VERSION, **{name: version(name) for name in TOOLCHAIN_PACKAGES}}
