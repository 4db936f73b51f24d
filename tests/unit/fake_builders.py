"""Fake stage builders for the unit tier: small blobs and typed results, no torch.

The engine tests hand etforge the stage table :data:`TABLE` (``etforge.app.cli.main(args, TABLE)``):
its builders are these, named by dotted path, so a run's worker imports this module as
``unit.fake_builders``. Keys stay the real stages' (they cover the code of etforge's builders).
The fake export writes a program that carries etforge's metadata (what the manifests read
back), so the whole default run works: manifests and report included.

They read ``fakes.json`` in the project directory (written by the test; a later run may
change it) and append one line per call to ``calls.log`` there:
``<task> <builder> heavy=<the heavy packages imported in this process, comma-separated>``.

    {"fail": {"<task name>": "raise" | "exit" | "os_exit" | "kill" | "sleep" | "status"},
     "edit": {"<task name>": {"path": "models/a.py", "text": "..."}},  # written as the task starts
     "sqnr_db": 99.0,                # what every fake validation measures
     "omit": ["max_abs_error"],      # metrics its verdict leaves out (as an older record may)
     "inputs": "random (seeded)"}    # what it says it measured on
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import struct
import sys
import time
from pathlib import Path

from etforge.checks.delegation import Delegation
from etforge.checks.numerics import Numerics
from etforge.checks.size import SizeGate
from etforge.config.model import ModelKind
from etforge.pipeline.results import BuildResult, TaskStatus
from etforge.pipeline.stage_results import (
    BenchmarkResult,
    CaptureResult,
    ExportResult,
    GateResult,
    QuantizeResult,
    Verdict,
)
from etforge.pipeline.stages import PARTS, STAGE, Kind, StageTable, task_name
from etforge.program.metadata import encode, program_meta

CONTROL = "fakes.json"
CALLS = "calls.log"
HEAVY = ("torch", "executorch", "torchao", "torchvision", "transformers", "coremltools")


def heavy_modules() -> set:
    """The heavy packages (what the unit tier must never import) this process has imported."""
    return {name for name in HEAVY if name in sys.modules}


def control(root: Path) -> dict:
    try:
        return json.loads((Path(root) / CONTROL).read_text())
    except FileNotFoundError:
        return {}


def calls(root: Path) -> list:
    """(task, builder) of every fake call so far, in order."""
    try:
        lines = (Path(root) / CALLS).read_text().splitlines()
    except FileNotFoundError:
        return []
    return [tuple(line.split()[:2]) for line in lines]


def torch_seen(root: Path, already: set = frozenset()) -> bool:
    """Whether any fake call ran in a process that had imported a heavy package besides ``already``
    (what the test process had loaded before: under xdist an earlier test file may have, and the
    run's worker is its fork)."""
    try:
        lines = (Path(root) / CALLS).read_text().splitlines()
    except FileNotFoundError:
        return False
    seen = {m for line in lines for m in line.partition(" heavy=")[2].split(",") if m}
    return bool(seen - set(already))


def _enter(request, stage: str, builder: str) -> str:
    """Log the call, then misbehave as fakes.json says for this task."""
    name = task_name(STAGE[stage], request.subject)
    root = request.plan.root
    with open(root / CALLS, "a") as log:
        log.write(f"{name} {builder} heavy={','.join(sorted(heavy_modules()))}\n")
    settings = control(root)
    edit = settings.get("edit", {}).get(name)
    if edit:  # someone edits a file the task's key covers while it runs
        (root / edit["path"]).write_text(edit["text"])
    how = settings.get("fail", {}).get(name)
    if how == "raise":
        raise RuntimeError(f"fake {stage} broke on purpose\nsecond line")
    if how == "exit":
        sys.exit(7)
    if how == "os_exit":
        os._exit(0)  # what a model's code or an abort in native code does to its worker
    if how == "kill":
        os.kill(os.getpid(), signal.SIGKILL)  # what the OOM killer does
    if how == "sleep":
        time.sleep(30)  # a long task (the test kills something meanwhile)
    return how


def _write(workdir: Path, blob: str, data: bytes) -> Path:
    path = Path(workdir) / blob
    path.write_bytes(data)
    return path


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def capture(request, builder="capture"):
    _enter(request, "capture", builder)
    model = request.subject
    # What a real capture captures: the model's code as it is on disk now (it imports it).
    code = (request.plan.root / model.source["file"]).read_bytes() if "file" in model.source else b""
    graph = f"graph of {json.dumps(model.canonical(), sort_keys=True)} from code {_sha(code)}".encode()
    files = {
        "model.pt2": _write(request.workdir, "model.pt2", graph),
        "reference.npz": _write(request.workdir, "reference.npz", b"eager outputs " + graph[:32]),
    }
    result = CaptureResult(
        inputs="random (seeded)", samples=1, outputs=({"path": "", "shape": [1, 1], "dtype": "float32"},)
    )
    return BuildResult(files=files, result=result)


def quantize(request, builder="quantize"):
    _enter(request, "quantize", builder)
    graph = request.upstream["capture"].files["model.pt2"].read_bytes()
    data = f"{request.subject.transform.label} of ".encode() + graph
    files = {"model.pt2": _write(request.workdir, "model.pt2", data)}
    return BuildResult(files=files, result=QuantizeResult(method=request.subject.transform.method))


def export(request, builder="export"):
    how = _enter(request, "export", builder)
    cell = request.subject
    graph = request.upstream["graph"].files["model.pt2"].read_bytes()
    # What a real program carries (etforge.program.metadata): a flatbuffer string, its length first
    # and a NUL after it, that the manifests read back and check against the cell.
    meta = encode(program_meta(cell, None, request.upstream["capture"].result(CaptureResult), False)).encode()
    program = (
        f"program {cell.name} from {hashlib.sha256(graph).hexdigest()}\n".encode()
        + struct.pack("<I", len(meta))
        + meta
        + b"\0"
    )
    files = {
        "program.pte": _write(request.workdir, "program.pte", program),
        "export.json": _write(request.workdir, "export.json", json.dumps({"cell": cell.name}).encode()),
        "selected_operators.yaml": _write(request.workdir, "selected_operators.yaml", b"operators: {}\n"),
    }
    if cell.backend.host_runnable:  # the real export keeps an ETRecord for the benchmark's profile
        files["program.etrecord"] = _write(request.workdir, "program.etrecord", b"etrecord " + program[:32])
    # the fake coverage gate: missed when fakes.json says "status" for this task
    coverage = Delegation(backend=cell.backend.name, minimum=0.5, compute_coverage=0.0 if how == "status" else 1.0)
    checks = (coverage.judged(),)
    result = ExportResult(
        size_bytes=len(program), sha256=_sha(program), delegates=tuple(cell.backend.delegates), checks=checks
    )
    if checks[0].failed:
        return BuildResult(files=files, result=result, status=TaskStatus.FAILED, reason=checks[0].reason())
    return BuildResult(files=files, result=result)


def validate(request, builder="validate"):
    how = _enter(request, "validate", builder)
    cell = request.subject
    program = request.upstream["export"].files["program.pte"].read_bytes()
    settings = control(request.plan.root)
    sqnr = float(settings.get("sqnr_db", 99.0))
    bound = cell.thresholds.get("sqnr_db")
    passed = how != "status" and (bound is None or sqnr >= bound)
    numerics = {"cell": cell.name, "sqnr_db": sqnr, "threshold": bound}
    files = {"numerics.json": _write(request.workdir, "numerics.json", json.dumps(numerics).encode())}
    metrics = {"sqnr_db": sqnr, "max_abs_error": 0.001, "cosine": 0.9999}
    check = Numerics(
        passed=passed,
        inputs=settings.get("inputs", "random (seeded)"),
        samples=1,
        misses=() if passed else (f"sqnr_db {sqnr} < {bound}",),
        **{k: v for k, v in metrics.items() if k not in settings.get("omit", ())},
    )
    verdict = Verdict(program_sha256=_sha(program), checks=(check,))
    if not passed:
        return BuildResult(files=files, result=verdict, status=TaskStatus.FAILED, reason=check.reason())
    return BuildResult(files=files, result=verdict)


def sizegate(request, builder="sizegate"):
    _enter(request, "sizegate", builder)
    own = request.upstream["export"].result(ExportResult).size_bytes
    fp32 = request.upstream["fp32_export"].result(ExportResult).size_bytes
    check = SizeGate(passed=True, size_vs_fp32=own / fp32, saved_bytes=fp32 - own)
    return BuildResult(result=GateResult(checks=(check,)))


def benchmark(request, builder="benchmark"):
    _enter(request, "benchmark", builder)
    program = request.upstream["export"].files["program.pte"].read_bytes()
    result = BenchmarkResult(program_sha256=_sha(program), latency_p50_ms=1.25, iterations=3, host="unit test host")
    files = {
        "bench.json": _write(request.workdir, "bench.json", json.dumps(result.to_json()).encode()),
        "program.etdump": _write(request.workdir, "program.etdump", b"etdump " + program[:32]),
    }
    return BuildResult(files=files, result=result)


# The LLM kind's builders: the same fakes, logged under another name.
def llm_capture(request):
    return capture(request, "llm_capture")


def llm_quantize(request):
    return quantize(request, "llm_quantize")


def llm_export(request):
    return export(request, "llm_export")


def llm_validate(request):
    return validate(request, "llm_validate")


def llm_benchmark(request):
    return benchmark(request, "llm_benchmark")


def _kind(prefix: str) -> Kind:
    return Kind(*(f"unit.fake_builders:{prefix}{part}" for part in PARTS))


# The stage table the engine tests hand to etforge.app.cli main: every builder a fake (the LLM
# kind's logged under their own names), and no setup (it would load ExecuTorch's libraries).
TABLE = StageTable(
    kinds={ModelKind.MODULE: _kind(""), ModelKind.LLM: _kind("llm_"), ModelKind.SEQ2SEQ: _kind("")},
    builders={"sizegate": "unit.fake_builders:sizegate"},
    setup=None,
)
