"""The arrays of an ``.npz`` file and their shapes, read from its zip directory and ``.npy``
headers without numpy, so that planning can refuse a data file that cannot feed a model.

An ``.npy`` header is the magic ``\\x93NUMPY``, a version (1.0: 2-byte header length,
2.0/3.0: 4-byte), then a Python dict literal with ``shape`` (numpy's format spec,
``numpy/lib/format.py``).
"""

from __future__ import annotations

import ast
import struct
import zipfile
from pathlib import Path

from etforge.core.errors import BadValue

MAGIC = b"\x93NUMPY"


class NpzError(BadValue):
    """The file is not an ``.npz`` numpy could read; the message says why in one line."""


def array_shapes(path: Path) -> dict:
    """{array name: shape as a list} of the ``.npz`` at ``path``, in the file's order."""
    try:
        with zipfile.ZipFile(path) as archive:
            shapes = {}
            for info in archive.infolist():
                if not info.filename.endswith(".npy"):
                    continue
                with archive.open(info) as member:
                    shapes[info.filename[: -len(".npy")]] = _header_shape(member.read(16 + 65536))
            return shapes
    except (zipfile.BadZipFile, OSError, EOFError) as exc:
        raise NpzError(f"is not an .npz archive ({type(exc).__name__}: {exc})") from None


def _header_shape(head: bytes) -> list:
    if not head.startswith(MAGIC) or len(head) < 10:
        raise NpzError("holds a member that is not an .npy array")
    major = head[6]
    size_format, start = ("<H", 10) if major == 1 else ("<I", 12)
    (length,) = struct.unpack_from(size_format, head, 8)
    try:
        header = ast.literal_eval(head[start : start + length].decode("latin-1"))
        return [int(d) for d in header["shape"]]
    except (ValueError, SyntaxError, KeyError, TypeError) as exc:
        raise NpzError(f"holds an .npy header that cannot be read ({type(exc).__name__})") from None


def feeding_problem(shapes: dict, inputs) -> str | None:
    """Why arrays of ``shapes`` cannot give samples for model ``inputs`` (InputSpecs), or None.

    Each input is read from the array named like it, else ``input_<i>`` (etforge.builders.capture.samples);
    its first axis counts samples.
    """
    if not shapes:
        return "holds no arrays"
    for i, item in enumerate(inputs):
        name = item.name if item.name in shapes else f"input_{i}"
        if name not in shapes:
            return f"has no array {item.name!r} or 'input_{i}' (has: {', '.join(shapes)})"
        if not shapes[name] or shapes[name][0] < 1:
            return f"array {name!r} has shape {shapes[name]}: no samples along its first axis"
    return None
