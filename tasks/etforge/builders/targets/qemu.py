"""Run a program in the aarch64 ExecuTorch runtime under qemu-user: one process per program and core.

:func:`run_samples` writes each sample's inputs as raw bytes, runs the cross-built
cpp/program_runner on them under ``qemu-aarch64 -cpu <core>`` and reads its outputs back as numpy
arrays, in the form the host runtime gives them (etforge.builders.runtime.program_io
run_program_samples), so that etforge.builders.numerics.validate judges both alike. A program the
runtime cannot load or run raises :class:`NotRunnable` with the runner's one line; no time is
measured (under emulation it says nothing of a device).

torch is imported inside the functions.
"""

from __future__ import annotations

import subprocess
import tempfile
from pathlib import Path

from etforge.config import target_runtime as tr
from etforge.core.errors import BuildError, EtforgeError

RUN_TIMEOUT_S = 3600  # a mobilenet-sized program takes seconds per sample under emulation
# numpy dtypes of the runner's dtype names (bfloat16 travels as its bits, read back as float32).
NUMPY = {
    "float32": "<f4",
    "float64": "<f8",
    "float16": "<f2",
    "bfloat16": "<u2",
    "uint8": "u1",
    "int8": "i1",
    "int16": "<i2",
    "int32": "<i4",
    "int64": "<i8",
    "bool": "?",
}


class NotRunnable(EtforgeError):
    """The target's runtime cannot load or run the program: the message says why (one line)."""


def qemu_command(cpu: str, binary: Path, *args: str) -> list:
    """The command that runs ``binary`` on an emulated aarch64 ``cpu`` with the wheel's libraries."""
    return [
        tr.QEMU,
        "-L",
        str(tr.SYSROOT),
        "-cpu",
        cpu,
        "-E",
        f"LD_LIBRARY_PATH={tr.wheel_dir() / 'lib'}",
        str(binary),
        *args,
    ]


def records(stdout: str) -> list:
    """The runner's stdout records: (kind, {key: value}) per line."""
    out = []
    for line in stdout.splitlines():
        kind, *fields = line.split("\t")
        out.append((kind, dict(f.split("=", 1) for f in fields if "=" in f)))
    return out


def run_samples(binary: Path, cpu: str, pte: Path, samples: list, method: str = "forward", data: Path | None = None):
    """Outputs of ``pte``'s ``method`` for each sample (a list of input tensors), computed on ``cpu``."""
    import numpy as np

    with tempfile.TemporaryDirectory(prefix="etforge-target-") as work:
        root = Path(work)
        lines = []
        for n, inputs in enumerate(samples):
            for i, tensor in enumerate(inputs):
                name, raw = _raw(tensor)
                path = root / f"s{n}_i{i}.bin"
                path.write_bytes(raw)
                shape = ",".join(str(d) for d in tensor.shape)
                lines.append(f"input\tsample={n}\tindex={i}\tdtype={name}\tshape={shape}\tfile={path}\n")
        (root / "samples.tsv").write_text("".join(lines))
        args = ["--program", str(pte), "--method", method, "--samples", str(root / "samples.tsv"), "--out", str(root)]
        if data is not None:
            args += ["--data", str(data)]
        try:
            run = subprocess.run(
                qemu_command(cpu, binary, *args), capture_output=True, text=True, timeout=RUN_TIMEOUT_S
            )
        except subprocess.TimeoutExpired:
            raise BuildError(f"{tr.QEMU} -cpu {cpu} ran the program for over {RUN_TIMEOUT_S} s") from None
        found = records(run.stdout)
        error = next((f for k, f in found if k == "error"), None)
        if error is not None:
            raise NotRunnable(_why(error, run.stderr))
        if run.returncode != 0:  # a crash of the runtime (a signal): its last words
            raise BuildError(
                f"the aarch64 runtime exited with status {run.returncode} on -cpu {cpu}: {_tail(run.stderr)}"
            )
        results: list = [[] for _ in samples]
        for kind, f in found:
            if kind != "output":
                continue
            dims = tuple(int(d) for d in f["shape"].split(",") if d)
            value = np.fromfile(f["file"], dtype=NUMPY[f["dtype"]]).reshape(dims)
            if f["dtype"] == "bfloat16":
                value = (value.astype(np.uint32) << 16).view(np.float32)
            results[int(f["sample"])].append(value)
    return results


def _raw(tensor) -> tuple[str, bytes]:
    """(dtype name, little-endian C-order bytes) of an input tensor."""
    import torch

    tensor = tensor.contiguous()
    if tensor.dtype == torch.bfloat16:
        return "bfloat16", tensor.view(torch.int16).numpy().tobytes()
    array = tensor.numpy()
    name = "bool" if array.dtype.kind == "b" else str(array.dtype)
    return name, array.astype(array.dtype.newbyteorder("<")).tobytes()


def _why(error: dict, stderr: str) -> str:
    """The runner's error line, with what the runtime logged of a missing operator."""
    reason = error.get("reason", "the runtime refused the program")
    missing = sorted(
        {line.split("Missing operator:")[1].split()[-1] for line in stderr.splitlines() if "Missing operator:" in line}
    )
    if missing:
        reason += f" (missing operators: {', '.join(missing)})"
    return reason


def _tail(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.strip() and "midr" not in line]
    return lines[-1].strip() if lines else "no output"
