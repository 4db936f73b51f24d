"""Arm programs run here on the TOSA reference model (the ``tosa-tools`` package), as the
ExecuTorch Arm tests do (``backends/arm/test/runner_utils.py`` ``run_tosa_graph``).

A TOSA delegate's payload in the .pte is the TOSA flatbuffer itself. An Ethos-U delegate's
payload is Vela's command stream, which nothing here runs: its cell is checked through the
TOSA flatbuffer Vela compiled it from, which the export stage keeps (``delegates.tosa.npz``,
etforge.builders.arm.ethos_u_vela), matched to the payload by its sha256. That is a proxy: the
partition, the quantization and every TOSA op's integer semantics are the program's own,
Vela's TOSA-to-NPU compilation is not checked.

The runners below are named by recipes (``runtime.validated_by.runner``) and called by the
validate stage as ``runner(pte, samples, export_files)`` -> outputs per sample.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from etforge.core.errors import BuildError, Unsupported

TOSA_DELEGATES = "delegates.tosa.npz"  # the export's TOSA form of each Ethos-U delegate


def tosa_program(pte: Path, samples: list, export_files: dict, method: str = "forward") -> list:
    """A TOSA program's outputs per sample: its TOSABackend delegates on the reference model, the
    ops outside them through etforge.builders.runtime.pte_interpreter."""
    from etforge.builders.runtime.pte_interpreter import run_samples

    def delegate(backend_id: str, payload: bytes) -> bytes:
        if backend_id != "TOSABackend":
            raise Unsupported(f"a {backend_id} delegate in a TOSA program")
        return payload

    return run_samples(pte, samples, delegate, method)


def ethos_u_via_tosa(pte: Path, samples: list, export_files: dict, method: str = "forward") -> list:
    """An Ethos-U program's outputs per sample, each EthosUBackend delegate replaced by the TOSA
    graph Vela compiled it from (the export's delegates.tosa.npz)."""
    import numpy as np

    from etforge.builders.runtime.pte_interpreter import run_samples

    stored = export_files.get(TOSA_DELEGATES)
    if stored is None:
        raise BuildError(f"the export kept no {TOSA_DELEGATES}: no TOSA form of the Ethos-U delegates")
    with np.load(stored) as data:
        by_payload = {name: data[name].tobytes() for name in data.files}

    def delegate(backend_id: str, payload: bytes) -> bytes:
        digest = hashlib.sha256(payload).hexdigest()
        if digest not in by_payload:
            raise BuildError(f"no TOSA form of the {backend_id} delegate with payload sha256 {digest[:12]}")
        return by_payload[digest]

    return run_samples(pte, samples, delegate, method)
