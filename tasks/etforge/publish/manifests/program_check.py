"""`etforge manifest` checks that what it writes of a variant is what the program says of itself.

Every .pte etforge lowers carries its identity and interface (etforge.program.metadata,
written by etforge.program.metadata from the same describe_io the manifests use). Before
the manifests name a program, :func:`check_program` reads that metadata from the file (no
ExecuTorch: etforge.program.metadata.read_meta) and compares it, field by field, with the
variant: model, backend, scheme, each method with its inputs (name, dtype, shape, dynamic
dims, range) and outputs (name, pytree path, shape, dtype), and the .ptd it needs. The first
disagreement is one line naming the cell and the field.

This module must not import torch or executorch.
"""

from __future__ import annotations

import mmap
from pathlib import Path

from etforge.program.metadata import ProgramMetaError, read_meta, required_data_sha256

INPUT_FIELDS = ("name", "dtype", "shape", "dynamic", "range")
OUTPUT_FIELDS = ("name", "path", "shape", "dtype")


def read_program_meta(pte: Path) -> dict | None:
    """The metadata of the .pte at ``pte`` (mapped, not read into memory), or None when it has none."""
    with open(pte, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
        return read_meta(data)


def disagreement(meta: dict | None, variant: dict) -> str | None:
    """The first field where the program's metadata and the manifest's variant differ
    (``field: the program says A, the manifest B``), or None when they agree."""
    if meta is None:
        return "the program carries no etforge metadata (made by another tool or an older etforge)"
    expected = {"model": variant["model"], "backend": variant["backend"], "scheme": variant["quantization"]}
    for field, value in expected.items():
        if meta.get(field) != value:
            return _differs(field, meta.get(field), value)
    said = {m.get("name"): m for m in meta.get("methods") or [] if isinstance(m, dict)}
    written = [m["name"] for m in variant["methods"]]
    if list(said) != written:
        return _differs("methods", list(said), written)
    for method in variant["methods"]:
        for kind, fields in (("inputs", INPUT_FIELDS), ("outputs", OUTPUT_FIELDS)):
            found = _tensors(said[method["name"]].get(kind), method[kind], fields, f"{method['name']}.{kind}")
            if found:
                return found
    data = variant.get("data_file")
    needed, shipped = required_data_sha256(meta), data["sha256"] if data else None
    if needed != shipped:
        return _differs("data_file.sha256", needed, shipped)
    return None


def _tensors(said, written: list, fields: tuple, where: str) -> str | None:
    said = said if isinstance(said, list) else []
    if len(said) != len(written):
        return _differs(f"{where} (count)", len(said), len(written))
    for i, (a, b) in enumerate(zip(said, written)):
        for field in fields:
            if (a or {}).get(field) != b.get(field):
                return _differs(f"{where}[{b.get('name') or i}].{field}", (a or {}).get(field), b.get(field))
    return None


def _differs(field: str, said, written) -> str:
    return f"{field}: the program says {said!r}, the manifest {written!r}"


def check_program(cell_name: str, pte: Path, variant: dict) -> str | None:
    """One line (``<cell>: <field>: ...``) when ``pte`` disagrees with ``variant`` or cannot be read."""
    try:
        found = disagreement(read_program_meta(pte), variant)
    except (OSError, ValueError, ProgramMetaError) as exc:
        found = f"cannot read its metadata from {Path(pte).name}: {exc}"
    return f"{cell_name}: {found}" if found else None
