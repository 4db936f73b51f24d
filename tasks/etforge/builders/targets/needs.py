"""What a program needs that the aarch64 runtime lacks, in one line, before it is run.

The export records the operators a program runs outside its delegates (ExportResult
``operators``) and the delegates it calls; setup recorded what the cross-built runner's runtime
registers (runner.json: its backends, whether each is available, its kernels). An operator no
library of the runtime registers (an LLM's ``llama::custom_sdpa.out``) is named with the wheel
library that does register it and what that library needs (measured from the unpacked wheel: its
strings and its ELF ``DT_NEEDED`` entries), so that the cell says exactly which library is missing.
"""

from __future__ import annotations

import struct
from pathlib import Path

from etforge.config import target_runtime as tr

# Why a delegate the aarch64 wheel registers is not available, where etforge knows it.
UNAVAILABLE = {
    "OpenvinoBackend": "OpenVINO has no aarch64 runtime here: the aarch64 wheel's OpenvinoBackend loads "
    "OpenVINO's own libopenvino_c.so at run time, and etforge installs no aarch64 OpenVINO",
}


def missing_needs(program, record: dict) -> str | None:
    """Why the runtime ``record`` describes cannot run ``program`` (an ExportResult), or None."""
    backends = record.get("backends") or {}
    for delegate in program.delegates:
        if delegate not in backends:
            return (
                f"the program calls delegate {delegate}, which the aarch64 ExecuTorch {tr.WHEEL.version} "
                f"runtime does not have (it registers {', '.join(sorted(backends)) or 'none'})"
            )
        if not backends[delegate]:
            return UNAVAILABLE.get(
                delegate, f"delegate {delegate} is registered but not available in the aarch64 runtime"
            )
    kernels = set(record.get("kernels") or ())
    lacking = sorted(op for op in program.operators if op not in kernels)
    if not lacking:
        return None
    return (
        f"needs {', '.join(lacking)}, which no library of the aarch64 ExecuTorch {tr.WHEEL.version} runtime "
        f"registers{where_registered(lacking)}"
    )


def where_registered(ops: list) -> str:
    """'': nowhere in the wheel; else which of the wheel's native libraries register ``ops`` and what
    each links that a standalone C++ program cannot (libtorch, CPython)."""
    root = tr.wheel_dir()
    found = {}
    for library in sorted(root.rglob("*.so")) if root.is_dir() else ():
        if library.parent.name == "lib" and library.parent.parent == root:
            continue  # the runtime's own libraries: they registered what they have
        content = library.read_bytes()
        hits = [op for op in ops if op.encode() in content]
        if hits:
            found[library.relative_to(root.parent).as_posix()] = needed_libraries(content)
    if not found:
        return " (nor does any library of the aarch64 wheel)"
    said = []
    for name, needs in found.items():
        heavy = [n for n in needs if n.startswith(("libtorch", "libc10", "_C.", "libpython"))]
        said.append(name + (f", which needs {', '.join(heavy)}" if heavy else ""))
    return f": the wheel registers them only in {'; '.join(said)}, not loadable by a C++ runtime without PyTorch"


def needed_libraries(elf: bytes) -> list:
    """The DT_NEEDED entries of a 64-bit little-endian ELF shared library ([] when it is not one)."""
    if elf[:4] != b"\x7fELF" or elf[4] != 2 or elf[5] != 1:
        return []
    shoff, shentsize, shnum = struct.unpack_from("<Q", elf, 0x28)[0], *struct.unpack_from("<HH", elf, 0x3A)
    sections = [struct.unpack_from("<IIQQQQIIQQ", elf, shoff + i * shentsize) for i in range(shnum)]
    dynamic = next((s for s in sections if s[1] == 6), None)  # SHT_DYNAMIC
    if dynamic is None:
        return []
    strtab = sections[dynamic[6]]  # sh_link: its string table
    names = []
    for offset in range(dynamic[4], dynamic[4] + dynamic[5], 16):
        tag, value = struct.unpack_from("<qQ", elf, offset)
        if tag == 0:
            break
        if tag == 1:  # DT_NEEDED
            start = strtab[4] + value
            names.append(elf[start : elf.index(b"\0", start)].decode(errors="replace"))
    return names


def runner_binary() -> Path:
    return tr.runner_dir() / tr.RUNNER_BINARY
