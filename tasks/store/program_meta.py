"""What a .pte says about itself: etforge's metadata constant methods, read without ExecuTorch.

Every program etforge lowers carries two constant methods (tasks/build/program_meta.py
writes them):

    etforge_meta_version   int: META_VERSION, the shape of the JSON below
    etforge_meta_json      str: {"etforge_meta_version", "model", "backend", "scheme",
                                 "etforge_version", "executorch_version",
                                 "methods": [{"name", "inputs", "outputs"}],
                                 "data_file": null | {"sha256": <hex of the .ptd it needs>}}

``methods`` is tasks/config/io_spec.py describe_io's, the same description every manifest
carries (inputs: name, dtype, shape, range, dynamic dims; outputs: name, pytree path,
shape, dtype).

An app reads them by executing the method (``load_method("etforge_meta_json").execute([])``);
that works without the .ptd and off-Apple (research 7). etforge itself reads the string
straight from the file (:func:`read_meta`), so that the manifests (tasks/publish, which must
not import ExecuTorch) and the pre-load check of tasks/build/program_io.py share one reader:
a flatbuffer string is a little-endian uint32 length, the bytes and a NUL, and the JSON
always starts with MARKER.
"""

from __future__ import annotations

import json
import struct

META_METHOD = "etforge_meta_json"
VERSION_METHOD = "etforge_meta_version"
META_VERSION = 1
DATA_SHA256_PLACEHOLDER = "0" * 64  # stamped with the .ptd's sha256 once the .ptd exists
MARKER = b'{"etforge_meta_version": '


class ProgramMetaError(Exception):
    """A program's metadata is missing, unreadable or disagrees with what etforge expects."""


PAD = 128  # the JSON is padded with spaces to a multiple of this


def encode(meta: dict) -> str:
    """The JSON string a program carries: the version first (MARKER), the rest sorted, padded to a
    multiple of PAD bytes so that two cells whose names differ by a few characters get programs of
    one layout (:func:`without_meta` then tells whether a scheme changed anything else)."""
    body = {k: meta[k] for k in sorted(meta) if k != "etforge_meta_version"}
    text = json.dumps({"etforge_meta_version": META_VERSION, **body}, ensure_ascii=True)
    return text + " " * (-len(text) % PAD)


def meta_span(pte) -> tuple[int, int] | None:
    """(start, end) of the metadata JSON in the .pte's bytes, or None when it carries none."""
    start = pte.find(MARKER)
    while start >= 4:
        (length,) = struct.unpack_from("<I", pte, start - 4)
        end = start + length
        if end < len(pte) and pte[end] == 0:
            try:
                json.loads(pte[start:end].decode("ascii"))
                return start, end
            except (UnicodeDecodeError, ValueError):
                pass
        start = pte.find(MARKER, start + 1)
    return None


def read_meta(pte: bytes) -> dict | None:
    """The metadata a .pte carries, or None when it has none (a program etforge did not make)."""
    span = meta_span(pte)
    return None if span is None else json.loads(pte[span[0] : span[1]].decode("ascii"))


def without_meta(pte: bytes) -> bytes:
    """The program with its metadata blanked (same length): what two cells' programs share when
    they differ only in the names they carry (a scheme that changed nothing)."""
    span = meta_span(pte)
    return pte if span is None else pte[: span[0]] + b" " * (span[1] - span[0]) + pte[span[1] :]


def required_data_sha256(meta: dict | None) -> str | None:
    """The sha256 of the .ptd the program needs, or None when its weights are inline."""
    data = (meta or {}).get("data_file")
    return data.get("sha256") if isinstance(data, dict) else None
