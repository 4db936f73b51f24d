"""What an Ethos-U program needs on the device, from Vela, and the TOSA form its check runs on.

Named by the Ethos-U recipes (``lowering.after``) and called by the export stage once the
program is lowered. For each EthosUBackend delegate of the lowered graph it rebuilds the TOSA
flatbuffer from the delegate's own partition and compile specs (what EthosUBackend.preprocess
does first) and compiles it with Vela again, with the .pte's own Vela flags and an output
directory, so that:

- the Vela output must equal the delegate's payload byte for byte, which proves the TOSA is
  the one Vela compiled (else the export fails: the proxy would check another program);
- Vela's summary CSV (``out_summary_<system config>.csv``) and its printed operator split give
  the NPU/CPU op split, SRAM and flash use, cycles and inference time for the configured
  accelerator, system config and memory mode (the export's Vela check, etforge.checks.vela);
- ``delegates.tosa.npz`` keeps each TOSA flatbuffer under its payload's sha256, for the
  validate stage (etforge.builders.arm.tosa_reference ethos_u_via_tosa).

Nothing here changes the program: the .pte is written from the first lowering. Vela takes
0.01-0.05 s per delegate on the small models; the TOSA rebuild about 1 s.
"""

from __future__ import annotations

import contextlib
import copy
import csv
import hashlib
import io
import re
import tempfile
from pathlib import Path

from etforge.builders.arm.tosa_reference import TOSA_DELEGATES
from etforge.checks.vela import Vela
from etforge.core.errors import BuildError

KIB = 1024
# Vela's summary CSV: memory used per area in KiB; the Vela check's field of each
_AREAS = {
    "sram_memory_used": "sram_bytes",
    "dram_memory_used": "dram_bytes",
    "on_chip_flash_memory_used": "onchip_flash_bytes",
    "off_chip_flash_memory_used": "offchip_flash_bytes",
}
_OPS = re.compile(r"^\s*(CPU|NPU) operators = (\d+)", re.MULTILINE)


def record_vela(edge, workdir: Path) -> tuple:
    """({blob: path}, (Vela check,)) for the Ethos-U delegates of ``edge`` (an
    EdgeProgramManager after to_edge_transform_and_lower); ({}, ()) when it has none."""
    import numpy as np
    from executorch.exir.lowered_backend_module import get_lowered_submodules

    delegates, tosa_by_payload = [], {}
    for method in edge.methods:
        for _, lowered, _ in get_lowered_submodules(edge.exported_program(method).graph_module):
            if lowered.backend_id != "EthosUBackend":
                continue
            tosa, summary = _compile_again(lowered)
            tosa_by_payload[hashlib.sha256(lowered.processed_bytes).hexdigest()] = np.frombuffer(tosa, dtype=np.uint8)
            delegates.append(summary)
    if not delegates:
        return {}, ()
    out = workdir / TOSA_DELEGATES
    with out.open("wb") as f:
        np.savez(f, **tosa_by_payload)
    return {TOSA_DELEGATES: out}, (Vela.of(summary_fields(delegates)),)


def _compile_again(lowered) -> tuple:
    """(TOSA flatbuffer, Vela summary row + op split) of one Ethos-U delegate; raises when Vela's
    output is not the delegate's payload."""
    from executorch.backends.arm.arm_vela import vela_compile
    from executorch.backends.arm.ethosu import EthosUCompileSpec
    from executorch.backends.arm.tosa.backend import TOSABackend

    spec = EthosUCompileSpec._from_list(lowered.compile_specs)
    tosa_spec = TOSABackend.filter_tosa_compile_specs(spec)
    # the partition as it was handed to the backend (preprocess may rewrite the program it is given)
    tosa = TOSABackend._preprocess(copy.deepcopy(lowered.original_module), tosa_spec).processed_bytes
    with tempfile.TemporaryDirectory(prefix="etforge-vela-") as tmp:  # no spaces: Vela splits its args on them
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):  # Vela prints its network summary
            result = vela_compile(tosa, list(spec.compiler_flags), intermediate_path=tmp)
        if result.processed_bytes != lowered.processed_bytes:
            raise BuildError(
                "Vela compiled the rebuilt TOSA graph to other bytes than the program's Ethos-U payload: "
                "its TOSA form cannot stand for it"
            )
        (csv_path,) = sorted((Path(tmp) / "output").glob("*_summary_*.csv"))
        with csv_path.open(newline="") as f:
            row = {k.strip(): _number(v.strip()) for k, v in next(csv.DictReader(f)).items()}
    ops = {kind.lower(): int(n) for kind, n in _OPS.findall(printed.getvalue())}
    if set(ops) != {"cpu", "npu"}:
        raise BuildError("Vela's output has no 'CPU operators' / 'NPU operators' lines")
    return tosa, {**row, "npu_ops": ops["npu"], "cpu_ops": ops["cpu"], "tosa_bytes": len(tosa)}


def summary_fields(delegates: list) -> dict:
    """The Vela check's fields from each delegate's summary: counts, memory, cycles and time
    added over the delegates (they run one after another, each with its own scratch area)."""

    def total(key: str):
        values = [d.get(key) for d in delegates]
        return sum(values) if all(isinstance(v, int | float) for v in values) else None

    first = delegates[0]
    fields = {
        "accelerator": first.get("accelerator_configuration"),
        "system_config": first.get("system_config"),
        "memory_mode": first.get("memory_mode"),
        "core_clock_hz": _float(first.get("core_clock")),
        "npu_ops": total("npu_ops"),
        "cpu_ops": total("cpu_ops"),
        "cycles_npu": _int(total("cycles_npu")),
        "cycles_total": _int(total("cycles_total")),
        "inference_time_s": _float(total("inference_time")),
        "delegates": tuple(delegates),
    }
    for column, name in _AREAS.items():
        kib = total(column)
        fields[name] = round(kib * KIB) if kib is not None else None
    return {k: v for k, v in fields.items() if v is not None}


def _number(text: str):
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def _int(value):
    return int(round(value)) if isinstance(value, int | float) else None


def _float(value):
    return float(value) if isinstance(value, int | float) else None
