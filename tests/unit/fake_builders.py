"""Fake stage builders for the unit tier: small blobs and typed results, no torch.

The engine tests put them in the stage table (``STAGE[name] = replace(stage, builder=...)``);
the run's worker is a fork of the test process, so it imports this module as ``unit.fake_builders``.

They read ``fakes.json`` in the project directory (written by the test; a later run may
change it) and append one line per call to ``calls.log`` there:
``<task> <builder> torch=<whether torch is imported in this process>``.

    {"fail": {"<task name>": "raise" | "exit" | "os_exit" | "status"},
     "sqnr_db": 99.0,                # what every fake validation measures
     "inputs": "random (seeded)"}    # what it says it measured on
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

from etforge.pipeline.results import BuildResult, TaskStatus
from etforge.pipeline.stage_results import CaptureResult, ExportResult, QuantizeResult, Verdict
from etforge.pipeline.stages import STAGE, task_name

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


def torch_seen(root: Path) -> bool:
    """Whether any fake call ran in a process that had imported a heavy package."""
    try:
        return "torch=True" in (Path(root) / CALLS).read_text()
    except FileNotFoundError:
        return False


def _enter(request, stage: str, builder: str) -> str:
    """Log the call, then misbehave as fakes.json says for this task."""
    name = task_name(STAGE[stage], request.subject)
    root = request.plan.root
    with open(root / CALLS, "a") as log:
        log.write(f"{name} {builder} torch={bool(heavy_modules())}\n")
    how = control(root).get("fail", {}).get(name)
    if how == "raise":
        raise RuntimeError(f"fake {stage} broke on purpose\nsecond line")
    if how == "exit":
        sys.exit(7)
    if how == "os_exit":
        os._exit(0)  # what a model's code or an abort in native code does to its worker
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
    graph = f"graph of {json.dumps(model.canonical(), sort_keys=True)}".encode()
    files = {
        "model.pt2": _write(request.workdir, "model.pt2", graph),
        "reference.npz": _write(request.workdir, "reference.npz", b"eager outputs " + graph[:32]),
    }
    result = CaptureResult(inputs="random (seeded)", samples=1, outputs=({"path": "0", "shape": [1, 1]},))
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
    program = f"program {cell.name} from ".encode() + hashlib.sha256(graph).hexdigest().encode()
    files = {
        "program.pte": _write(request.workdir, "program.pte", program),
        "export.json": _write(request.workdir, "export.json", json.dumps({"cell": cell.name}).encode()),
    }
    result = ExportResult(size_bytes=len(program), sha256=_sha(program), delegates=tuple(cell.backend.delegates))
    if how == "status":
        return BuildResult(files=files, result=result, status=TaskStatus.FAILED, reason="fake coverage gate missed")
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
    verdict = Verdict(
        program_sha256=_sha(program),
        passed=passed,
        inputs=settings.get("inputs", "random (seeded)"),
        samples=1,
        sqnr_db=sqnr,
    )
    if not passed:
        return BuildResult(files=files, result=verdict, status=TaskStatus.FAILED, reason=f"sqnr_db {sqnr} < {bound}")
    return BuildResult(files=files, result=verdict)


# The LLM kind's builders (Stage.llm_builder): the same fakes, logged under another name.
def llm_capture(request):
    return capture(request, "llm_capture")


def llm_quantize(request):
    return quantize(request, "llm_quantize")


def llm_export(request):
    return export(request, "llm_export")


def llm_validate(request):
    return validate(request, "llm_validate")


BUILDERS = {
    "capture": ("unit.fake_builders:capture", "unit.fake_builders:llm_capture"),
    "quantize": ("unit.fake_builders:quantize", "unit.fake_builders:llm_quantize"),
    "export": ("unit.fake_builders:export", "unit.fake_builders:llm_export"),
    "validate": ("unit.fake_builders:validate", "unit.fake_builders:llm_validate"),
}
