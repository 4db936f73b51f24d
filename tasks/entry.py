"""What dodo.py needs: find the pipeline file, resolve it, select cells, configure doit."""

from __future__ import annotations

import os
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from tasks import doit_tasks
from tasks.cache import Store
from tasks.errors import PipelineError
from tasks.hostinfo import host_fingerprint
from tasks.remote import RemoteError
from tasks.plan import Plan, digest_cache_for, resolve
from tasks.reporter import make_reporter

REPO_ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Selection:
    plan: Plan
    cells: tuple
    store: Store
    host: dict  # tasks.hostinfo.host_fingerprint(): benchmark results are only valid on it


def pipeline_path(get_var, initial_workdir: str | None) -> Path:
    """``doit pipeline=FILE`` wins over $ETFORGE_PIPELINE, then the repo's pipeline.yaml.

    doit has already changed into dodo.py's directory, so a relative path is
    taken from the directory doit was started in.
    """
    value = get_var("pipeline", None) or os.environ.get("ETFORGE_PIPELINE")
    if not value:
        return REPO_ROOT / "pipeline.yaml"
    return Path(initial_workdir or os.getcwd(), value).absolute()


def load_selection(get_var, initial_workdir: str | None = None) -> Selection:
    """Resolve the pipeline and the command-line sub-matrix, or exit with a one-line error.

    Exit code 3 is doit's own code for "error before task execution starts".
    """
    try:
        path = pipeline_path(get_var, initial_workdir)
        digests = digest_cache_for(path)
        plan = resolve(path, digests)
        cells = plan.select(model=get_var("model", None), backend=get_var("backend", None),
                            quantization=get_var("quant", None) or get_var("quantization", None))
        if get_var("shard", None):
            cells = plan.shard(cells, get_var("shard", None))
        ensure_writable(plan.artifacts_dir)
        digests.save()  # only once everything checked out: a bad input writes nothing
    except PipelineError as exc:
        sys.stderr.write(f"etforge: error: {exc}\n")
        raise SystemExit(3) from None
    if not cells:
        sys.stderr.write("etforge: error: the command-line selection matches no cell of the matrix\n")
        raise SystemExit(3)
    try:
        store = doit_tasks.plan_store(plan)
    except RemoteError as exc:  # e.g. gs:// without gcsfs installed
        sys.stderr.write(f"etforge: error: {exc}\n")
        raise SystemExit(3) from None
    return Selection(plan=plan, cells=cells, store=store, host=host_fingerprint())


def ensure_writable(directory: Path) -> None:
    """Fail now, naming the path, rather than halfway through a build."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=directory, prefix=".write-test-"):
            pass
    except OSError as exc:
        raise PipelineError(f"cannot write to {exc.filename or directory}: {exc.strerror or exc}") from None


def doit_config(selection: Selection) -> dict:
    plan = selection.plan
    state_files, cells_by_task = {}, {}
    for cell in selection.cells:
        for spec in (doit_tasks.export_spec(plan, cell), doit_tasks.validate_spec(plan, cell),
                     doit_tasks.benchmark_spec(plan, cell, selection.host)):
            state_files[spec.name] = spec.state_file
            cells_by_task[spec.name] = cell
    for model in {c.model.name: c.model for c in selection.cells}.values():
        spec = doit_tasks.capture_spec(plan, model)
        state_files[spec.name] = spec.state_file
    for cell in selection.cells:
        if cell.transform is not None:
            spec = doit_tasks.quantize_spec(plan, cell)
            state_files[spec.name] = spec.state_file
        if plan.fp32_sibling(cell) in selection.cells:
            spec = doit_tasks.size_gate_spec(plan, cell)
            state_files[spec.name] = spec.state_file
            cells_by_task[spec.name] = cell
    state_files["manifest"] = plan.state_dir / "manifest.json"  # tasks/manifest.py's record
    state_files["report"] = plan.state_dir / "report.json"
    state_files["release"] = plan.state_dir / "release.json"  # tasks/release.py's record: its one-line reason
    return {
        "default_tasks": ["export", "sizegate", "validate", "benchmark", "manifest", "report"],
        "continue": True,  # one failing cell never stops the others
        "dep_file": str(plan.artifacts_dir / ".doit.db"),
        "backend": "json",
        "reporter": make_reporter(plan, state_files, cells_by_task, selection.host),
        "verbosity": 2,
    }
