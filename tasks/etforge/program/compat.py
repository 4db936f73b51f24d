"""Which ExecuTorch runtimes a program loads on: its schema version, and the policy's window as data.

    program_schema_version(pte) -> int     Program.version, read from the flatbuffer's bytes
    load_window(executorch_version) -> (first, last) release lines guaranteed to load it, or None
    outside_window(exporter, runtime) -> why a runtime is outside the window, or None

The window comes from schemas/executorch_compat.json (ExecuTorch's runtime/COMPATIBILITY.md
as a table: per exporter release line, the runtime lines guaranteed to load its programs),
never from branches here. The .pte identifier (``ET12``) and Program.version (0) have not
changed from 0.1 to 1.5.1, so the bytes do not tell which ExecuTorch wrote a program: the
version that built it is recorded beside it (export.json, the program's own metadata).

No ExecuTorch needed: only ``struct`` and the table.
"""

from __future__ import annotations

import json
import re
import struct
from functools import cache

from etforge.core.paths import SCHEMA_DIR

TABLE = "executorch_compat.json"
VERSION = re.compile(r"^(\d+)\.(\d+)(?:\.(\d+))?")


def program_schema_version(pte: bytes) -> int:
    """Program.version (field 0 of the flatbuffer's root table; absent means its default, 0)."""
    (root,) = struct.unpack_from("<I", pte, 0)
    vtable = root - struct.unpack_from("<i", pte, root)[0]
    if struct.unpack_from("<H", pte, vtable)[0] < 6:  # the vtable has no slot for field 0
        return 0
    (offset,) = struct.unpack_from("<H", pte, vtable + 4)
    return 0 if offset == 0 else struct.unpack_from("<I", pte, root + offset)[0]


@cache
def table() -> dict:
    return json.loads((SCHEMA_DIR / TABLE).read_text(encoding="utf-8"))


def release_line(version: str | None) -> str | None:
    """'1.5' of '1.5.1', '1.5.1+cpu' or '1.5'; None for what is not a version."""
    m = VERSION.match(str(version or ""))
    return f"{int(m.group(1))}.{int(m.group(2))}" if m else None


def _line_key(line: str) -> tuple:
    return tuple(int(p) for p in line.split("."))


def load_window(executorch_version: str | None) -> tuple[str, str] | None:
    """(first, last) runtime release lines the policy guarantees for a program this version
    exported, or None when the table has no row for its line (no guarantee is known)."""
    line = release_line(executorch_version)
    row = next((r for r in table()["exporters"] if r["line"] == line), None)
    return (row["window"][0], row["window"][-1]) if row else None


def outside_window(exporter: str | None, runtime: str) -> str | None:
    """Why runtime version ``runtime`` is not guaranteed to load a program ``exporter`` built, or None."""
    window = load_window(exporter)
    if window is None:
        return f"built by ExecuTorch {exporter or '(unknown)'}, whose load window the compatibility table does not know"
    line = release_line(runtime)
    if line is None or not _line_key(window[0]) <= _line_key(line) <= _line_key(window[1]):
        return (
            f"built by ExecuTorch {exporter}: runtime {runtime} is outside its load window "
            f"{window[0]}.x-{window[1]}.x (ExecuTorch's compatibility policy)"
        )
    return None
