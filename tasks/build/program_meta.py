"""The metadata constant methods every lowered program carries (format: tasks/store/program_meta.py).

The interface it records is tasks/config/io_spec.py's describe_io over the same facts the
manifests use (tasks/publish/manifests/interface.py cell_interface): the model's declared
inputs, the dtypes the program takes, the capture's outputs. One description, so that the
program, index.json, Dart and the C++ header say the same of every method.
"""

from __future__ import annotations

from importlib import metadata

import tasks
from tasks.config.io_spec import describe_io
from tasks.store.program_meta import (
    DATA_SHA256_PLACEHOLDER,
    META_METHOD,
    META_VERSION,
    VERSION_METHOD,
    ProgramMetaError,
    encode,
)


def program_meta(cell, input_dtypes: list, capture_info: dict, external_data: bool) -> dict:
    """The cell's identity and interface; with ``external_data``, a placeholder for the .ptd's
    sha256 that :func:`stamp_data_sha256` fills in once the data file exists.

    ``input_dtypes``: the first method's as the program takes them (export.json's ``input_dtypes``);
    ``capture_info``: the capture record's info (its ``outputs`` and, for several methods, ``methods``)."""
    methods = capture_info.get("methods") or {}
    method_outputs = {m: v.get("outputs") or [] for m, v in methods.items()} if methods else None
    io = describe_io(cell.model, capture_info.get("outputs") or [], input_dtypes, method_outputs)
    return {
        "model": cell.model.name,
        "backend": cell.backend.name,
        "scheme": cell.quant.name,
        "etforge_version": tasks.__version__,
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
