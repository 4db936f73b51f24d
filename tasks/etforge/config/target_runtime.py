"""What runs a program on an aarch64 target here, where it lives, and its fingerprint for keys.

``etforge setup-targets`` (etforge.builders.targets.setup) installs it under :func:`home`
($ETFORGE_TARGETS_HOME, else ``share/etforge-targets`` of this Python environment):

    executorch-<version>-aarch64/executorch/   the aarch64 wheel (WHEEL, pinned by sha256), unpacked;
                                               include/ links to this environment's x86 wheel's headers
    runner-<sources digest>/                   cpp/program_runner cross-built against it (RUNNER_BINARY)
        runner.json                            how it was built, and what its runtime registers

:func:`fingerprint` is what a target task's key holds of it (etforge.pipeline.keys ``targets``):
the wheel's version and sha256, the runner's sources, its build record (compiler, binary sha256)
and qemu's version; :func:`missing` says in one line what this host lacks to run targets. Both
are read without running anything but ``qemu-aarch64 --version``, memoised by the binary's digest.

This module must not import torch or executorch.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from etforge.core.digest import digest, sha256_file
from etforge.core.paths import PACKAGE_DIR


@dataclass(frozen=True)
class Wheel:
    """The aarch64 ExecuTorch wheel on PyPI: its runtime libraries, for the cross-built runner."""

    version: str
    platform: str
    python: str  # the wheel's CPython tag: its lib/ does not depend on it, but its sha256 does
    sha256: str

    @property
    def file(self) -> str:
        return f"executorch-{self.version}-cp{self.python}-cp{self.python}-{self.platform}.whl"


# Measured 2026-12: 17,810,491 bytes, from `pip download --no-deps --platform manylinux_2_28_aarch64
# --python-version 311 --implementation cp --abi cp311 --only-binary=:all: executorch==1.5.1`.
WHEEL = Wheel(
    "1.5.1", "manylinux_2_28_aarch64", "311", "8ee02348a3ea80ddf770822911ebf78da616b73afce0fbaaa79f23311c88c66a"
)
QEMU = "qemu-aarch64"
SYSROOT = Path("/usr/aarch64-linux-gnu")  # Debian's aarch64 libc and libstdc++ (qemu -L)
CXX = "aarch64-linux-gnu-g++"
APT_PACKAGES = ("qemu-user", "g++-aarch64-linux-gnu", "cmake")
CPP_DIR = PACKAGE_DIR / "cpp"  # the repository's cpp/ (a link in a checkout, package data in a wheel)
RUNNER_SOURCES = ("program_runner/CMakeLists.txt", "program_runner/main.cpp", "toolchains/aarch64-linux-gnu.cmake")
RUNNER_BINARY = "etforge_program_runner"
RUNNER_RECORD = "runner.json"
SETUP_COMMAND = "etforge setup-targets"


def home() -> Path:
    """Where the aarch64 runtime and the runner live: $ETFORGE_TARGETS_HOME, else this environment's."""
    return Path(os.environ.get("ETFORGE_TARGETS_HOME") or Path(sys.prefix) / "share" / "etforge-targets")


def wheel_dir() -> Path:
    """The unpacked wheel's package directory (share/cmake, lib, include)."""
    return home() / f"executorch-{WHEEL.version}-aarch64" / "executorch"


def sources_digest(digests=None) -> str:
    """The digest of the runner's sources and toolchain file, and of the wheel it links."""
    hashed = {name: (digests.file_digest if digests else sha256_file)(CPP_DIR / name) for name in RUNNER_SOURCES}
    return digest({"sources": hashed, "wheel": WHEEL.sha256})


def runner_dir(digests=None) -> Path:
    return home() / f"runner-{sources_digest(digests)[:16]}"


def runner_record(digests=None) -> dict | None:
    """What setup recorded of the runner built from these sources (None: not built)."""
    try:
        found = json.loads((runner_dir(digests) / RUNNER_RECORD).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return found if isinstance(found, dict) and (runner_dir(digests) / RUNNER_BINARY).is_file() else None


def qemu_version(digests=None) -> str | None:
    """``qemu-aarch64 --version``'s first line (None: not on PATH), memoised by the binary's digest."""
    path = shutil.which(QEMU)
    if path is None:
        return None

    def ask() -> str | None:
        try:
            run = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.SubprocessError):
            return None
        return run.stdout.splitlines()[0].strip() if run.returncode == 0 and run.stdout else None

    if digests is None:
        return ask()
    return digests.derived("qemu_version", digests.file_digest(Path(path)), ask)


def fingerprint(digests=None) -> dict:
    """What a target task's key holds of the runtime that judges it (see the module docstring)."""
    record = runner_record(digests) or {}
    return {
        "wheel": {"version": WHEEL.version, "sha256": WHEEL.sha256},
        "runner": sources_digest(digests),
        "build": {k: record.get(k) for k in ("compiler", "binary_sha256")} if record else None,
        "qemu": qemu_version(digests),
        "host": f"{platform.system()} {platform.machine()}",
    }


def missing(found: dict) -> str | None:
    """One line on what this host lacks to run aarch64 targets (``found``: a :func:`fingerprint`), or None."""
    if found["host"].split()[0] != "Linux":
        return f"aarch64 targets run under qemu-user on Linux; this host is {found['host']}"
    if found["qemu"] is None:
        return f"{QEMU} is not on PATH (Debian's qemu-user; run `{SETUP_COMMAND}`)"
    if found["build"] is None:
        return f"the aarch64 runner is not built for these sources (run `{SETUP_COMMAND}`)"
    return None
