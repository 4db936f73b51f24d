"""Set up what runs programs on aarch64 targets here: ``etforge setup-targets`` (and ``make setup``).

Three steps, each done once and skipped when what it makes is already there:

1. Debian's packages (etforge.config.target_runtime APT_PACKAGES: qemu-user, the aarch64 cross
   compiler, cmake), with apt-get as root or through ``sudo -n``; otherwise one line naming the
   command to run.
2. The aarch64 ExecuTorch wheel from PyPI (WHEEL: pinned version and sha256), unpacked under the
   targets home: its runtime libraries and CMake package. It ships no headers; headers do not
   depend on the architecture, so ``include`` links to this environment's x86 wheel's, which must be
   the same version.
3. cpp/program_runner cross-built against it with cpp/toolchains/aarch64-linux-gnu.cmake, once per
   content (its sources, the toolchain file, the wheel), then asked under qemu what its runtime
   registers (delegates, kernels): ``runner.json`` records that and how it was built (compiler,
   binary sha256), which the target tasks' keys hold.

Each step builds in a staging directory beside its target and renames it into place, so an
interrupted setup leaves nothing half-made.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path

from etforge.config import target_runtime as tr
from etforge.config.tools import installed_version
from etforge.core.atomic import atomic_write_text
from etforge.core.digest import sha256_file
from etforge.core.errors import BuildError, Unsupported

# What of the wheel is unpacked: the runtime libraries and CMake package, and every native library
# (etforge.builders.targets.needs names the one that registers an operator the runtime lacks).
WHEEL_MEMBERS = ("executorch/lib/", "executorch/share/", "executorch/version.py")
PROBE_CPU = "cortex-a76"  # any named core: what the runtime registers does not depend on it


def setup_targets(say: Callable[[str], None] = print) -> dict:
    """Make sure everything aarch64 targets need is here (see the module docstring); the runner's record."""
    if platform.system() != "Linux":
        raise Unsupported(f"aarch64 targets run under qemu-user on Linux; this host is {platform.system()}")
    install_packages(say)
    unpack_wheel(say)
    return build_runner(say)


def install_packages(say: Callable[[str], None]) -> None:
    needed = {"qemu-user": tr.QEMU, "g++-aarch64-linux-gnu": tr.CXX, "cmake": "cmake"}
    missing = [package for package, command in needed.items() if shutil.which(command) is None]
    if not missing:
        say(f"packages: {', '.join(needed)} present")
        return
    command = ["apt-get", "install", "-y", "-q", "--no-install-recommends", *missing]
    prefix: list = []
    if shutil.which("apt-get") is None:
        raise BuildError(f"missing {', '.join(missing)} and this host has no apt-get: install them by hand")
    if os.geteuid() != 0:
        if shutil.which("sudo") is None or subprocess.run(["sudo", "-n", "true"], capture_output=True).returncode:
            raise BuildError(f"missing {', '.join(missing)}: run `sudo {' '.join(command)}`")
        prefix = ["sudo", "-n"]
    say(f"packages: installing {', '.join(missing)} (apt-get)")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for step in (["apt-get", "update", "-q"], command):
        run = subprocess.run(prefix + step, capture_output=True, text=True, env=env)
        if run.returncode != 0:
            raise BuildError(f"`{' '.join(step)}` failed: {_last_line(run.stderr or run.stdout)}")


def unpack_wheel(say: Callable[[str], None]) -> Path:
    """The unpacked aarch64 wheel's package directory (tr.wheel_dir), made when it is not there."""
    target = tr.wheel_dir()
    stamp = target.parent / ".sha256"
    if target.is_dir() and stamp.is_file() and stamp.read_text().strip() == tr.WHEEL.sha256:
        say(f"wheel: {tr.WHEEL.file} already unpacked in {target.parent}")
        return target
    host = installed_version("executorch")
    if host != tr.WHEEL.version:
        raise BuildError(
            f"this environment has executorch {host}, the aarch64 runtime is {tr.WHEEL.version}: "
            "the runner compiles against this environment's headers, so they must match"
        )
    headers = _host_executorch_dir() / "include"
    if not (headers / "executorch").is_dir():
        raise BuildError(f"no ExecuTorch headers in {headers}")
    tr.home().mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=tr.home(), prefix=".download-") as download:
        wheel = _download(Path(download), say)
        staging = Path(tempfile.mkdtemp(dir=tr.home(), prefix=".wheel-"))
        os.chmod(staging, 0o755)  # readable like any installed package
        try:
            with zipfile.ZipFile(wheel) as archive:
                for member in archive.namelist():
                    if member.startswith(WHEEL_MEMBERS) or member.endswith(".so"):
                        archive.extract(member, staging)
            (staging / "executorch" / "include").symlink_to(headers)
            atomic_write_text(staging / ".sha256", tr.WHEEL.sha256 + "\n")
            shutil.rmtree(target.parent, ignore_errors=True)
            os.replace(staging, target.parent)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    say(f"wheel: {tr.WHEEL.file} (sha256 {tr.WHEEL.sha256[:12]}) unpacked in {target.parent}")
    return target


def _host_executorch_dir() -> Path:
    """This environment's executorch package directory, found without importing it."""
    import importlib.util

    spec = importlib.util.find_spec("executorch")
    if spec is None or not spec.submodule_search_locations:
        raise BuildError("executorch is not installed in this environment")
    return Path(list(spec.submodule_search_locations)[0])


def _download(into: Path, say: Callable[[str], None]) -> Path:
    say(f"wheel: downloading {tr.WHEEL.file} from PyPI")
    command = [
        sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
        "--platform", tr.WHEEL.platform, "--python-version", tr.WHEEL.python, "--implementation", "cp",
        "--abi", f"cp{tr.WHEEL.python}", "--dest", str(into), f"executorch=={tr.WHEEL.version}",
    ]  # fmt: skip
    run = subprocess.run(command, capture_output=True, text=True, timeout=1800)
    wheel = into / tr.WHEEL.file
    if run.returncode != 0 or not wheel.is_file():
        raise BuildError(f"pip could not download {tr.WHEEL.file}: {_last_line(run.stderr or run.stdout)}")
    actual = sha256_file(wheel)
    if actual != tr.WHEEL.sha256:
        raise BuildError(f"{tr.WHEEL.file} has sha256 {actual}, etforge pins {tr.WHEEL.sha256}: not used")
    return wheel


def build_runner(say: Callable[[str], None]) -> dict:
    """Cross-build cpp/program_runner (once per content and compiler) and record what its runtime registers."""
    target = tr.runner_dir()
    compiler = _first_output_line([tr.CXX, "--version"])
    recorded = tr.runner_record()
    if recorded is not None and recorded.get("compiler") == compiler:
        say(f"runner: {target / tr.RUNNER_BINARY} already built ({compiler})")
        return recorded
    staging = Path(tempfile.mkdtemp(dir=tr.home(), prefix=".runner-"))
    os.chmod(staging, 0o755)
    try:
        build = staging / "build"
        configure = [
            "cmake", "-S", str(tr.CPP_DIR / "program_runner"), "-B", str(build), "-DCMAKE_BUILD_TYPE=Release",
            f"-DCMAKE_TOOLCHAIN_FILE={tr.CPP_DIR / 'toolchains' / 'aarch64-linux-gnu.cmake'}",
            f"-DEXECUTORCH_ROOT={tr.wheel_dir()}",
        ]  # fmt: skip
        if shutil.which("ninja"):
            configure += ["-G", "Ninja"]
        say(f"runner: cross-building cpp/program_runner with {compiler}")
        for step in (configure, ["cmake", "--build", str(build), "--parallel", "2"]):
            run = subprocess.run(step, capture_output=True, text=True, timeout=1800)
            if run.returncode != 0:
                raise BuildError(
                    f"`{' '.join(step[:2])}` of cpp/program_runner failed: {_last_line(run.stdout + run.stderr)}"
                )
        binary = staging / tr.RUNNER_BINARY
        shutil.copy2(build / tr.RUNNER_BINARY, binary)
        shutil.rmtree(build)
        record = {
            "compiler": compiler,
            "cmake": _first_output_line(["cmake", "--version"]),
            "qemu": tr.qemu_version(),
            "wheel": {"version": tr.WHEEL.version, "sha256": tr.WHEEL.sha256},
            "sources": tr.sources_digest(),
            "binary_sha256": sha256_file(binary),
            **probe_runtime(binary),
        }
        atomic_write_text(staging / tr.RUNNER_RECORD, json.dumps(record, indent=2, sort_keys=True) + "\n")
        shutil.rmtree(target, ignore_errors=True)
        os.replace(staging, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    say(f"runner: built {target / tr.RUNNER_BINARY}; its runtime registers {', '.join(record['backends'])}")
    return record


def probe_runtime(binary: Path) -> dict:
    """What the runner's runtime registers, asked under qemu: {"backends": {name: available}, "kernels": [...]}."""
    from etforge.builders.targets.qemu import qemu_command, records

    run = subprocess.run(qemu_command(PROBE_CPU, binary, "--list"), capture_output=True, text=True, timeout=300)
    found = records(run.stdout)
    if run.returncode != 0 or not found:
        raise BuildError(f"the cross-built runner does not run under {tr.QEMU}: {_last_line(run.stderr or run.stdout)}")
    return {
        "runtime_version": next((f.get("runtime_version") for k, f in found if k == "etforge-program-runner"), None),
        "backends": {f["name"]: f.get("available") == "1" for k, f in found if k == "backend"},
        "kernels": sorted(f["name"] for k, f in found if k == "kernel"),
    }


def _first_output_line(command: list) -> str | None:
    try:
        run = subprocess.run(command, capture_output=True, text=True, timeout=60)
    except OSError:
        return None
    return run.stdout.splitlines()[0].strip() if run.returncode == 0 and run.stdout.strip() else None


def _last_line(text: str) -> str:
    lines = [line for line in (text or "").splitlines() if line.strip()]
    return lines[-1].strip()[:300] if lines else "no output"


def main() -> int:
    """``python -m etforge.builders.targets.setup``: the same as ``etforge setup-targets``."""
    setup_targets()
    return 0


if __name__ == "__main__":
    sys.exit(main())
