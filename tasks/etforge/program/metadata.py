"""What a .pte says about itself: etforge's metadata constant methods, read without ExecuTorch.

Every program etforge lowers carries two constant methods (:func:`program_meta` and
:func:`constant_methods` make them):

    etforge_meta_version   int: META_VERSION, the shape of the JSON below
    etforge_meta_json      str: {"etforge_meta_version", "model", "backend", "scheme",
                                 "etforge_version", "executorch_version",
                                 "methods": [{"name", "inputs", "outputs"}],
                                 "data_file": null | {"sha256": <hex of the .ptd it needs>}}

``methods`` is etforge.config.io_spec describe_io's, the same description every manifest
carries (inputs: name, dtype, shape, range, dynamic dims; outputs: name, pytree path,
shape, dtype).

An app reads them by executing the method (``load_method("etforge_meta_json").execute([])``);
that works without the .ptd and off-Apple. etforge itself reads the string
straight from the file (:func:`read_meta`), so that the manifests (etforge.publish, which must
not import ExecuTorch) and the pre-load check of etforge.builders.runtime.program_io share one reader:
a flatbuffer string is a little-endian uint32 length, the bytes and a NUL, and the JSON
always starts with MARKER.
"""

from __future__ import annotations

import json
import mmap
import struct
from importlib import metadata

import etforge
from etforge.config.io_spec import describe_io
from etforge.core.errors import EtforgeError

META_METHOD = "etforge_meta_json"
VERSION_METHOD = "etforge_meta_version"
META_VERSION = 1
DATA_SHA256_PLACEHOLDER = "0" * 64  # stamped with the .ptd's sha256 once the .ptd exists
MARKER = b'{"etforge_meta_version": '


class ProgramMetaError(EtforgeError):
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


def read_meta(pte: bytes | mmap.mmap) -> dict | None:
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


# ---------------------------------------------------------------- writing (at lowering)


def program_meta(cell, input_dtypes: list, capture, external_data: bool) -> dict:
    """The cell's identity and interface; with ``external_data``, a placeholder for the .ptd's
    sha256 that :func:`stamp_data_sha256` fills in once the data file exists.

    ``input_dtypes``: the first method's as the program takes them (the export's ``input_dtypes``);
    ``capture``: the capture's CaptureResult (its ``outputs`` and, for several methods, ``methods``)."""
    method_outputs = {m: v.get("outputs") or [] for m, v in capture.methods.items()} if capture.methods else None
    io = describe_io(cell.model, list(capture.outputs), input_dtypes, method_outputs)
    return {
        "model": cell.model.name,
        "backend": cell.backend.name,
        "scheme": cell.quant.name,
        "etforge_version": etforge.__version__,
        "executorch_version": metadata.version("executorch"),
        **io,
        "data_file": {"sha256": DATA_SHA256_PLACEHOLDER} if external_data else None,
    }


def constant_methods(meta: dict) -> dict:
    """``constant_methods=`` of to_edge_transform_and_lower (ExecuTorch silently drops one named
    like a real method, so the names carry the etforge_ prefix)."""
    return {META_METHOD: encode(meta), VERSION_METHOD: META_VERSION}


def stamp_data_sha256(pte: bytes, sha256: str) -> bytes:
    """The program with its metadata naming the .ptd it needs (same length: the flatbuffer stays valid)."""
    placeholder = f'"sha256": "{DATA_SHA256_PLACEHOLDER}"'.encode()
    if pte.count(placeholder) != 1:
        raise ProgramMetaError(
            f"cannot name the .ptd in the program: its metadata placeholder occurs {pte.count(placeholder)} times"
        )
    return pte.replace(placeholder, f'"sha256": "{sha256}"'.encode())
