"""doit task dicts for a resolved plan.

    capture:<model>                     torch.export once per model, eager reference outputs
    quantize:<model>/<scheme>/<config>  once per (model, quantizer config), shared by its cells
    export:<model>/<backend>/<scheme>   lower to .pte
    validate:<model>/<backend>/<scheme> run the .pte, compare with eager

Task actions import torch/executorch lazily (inside the builders); building
the dicts and checking ``uptodate`` only reads state records and stats files.

A task reads what its upstream tasks stored through ``_stored``: when that
entry turns out missing or corrupt (it is verified on every read), the
upstream task is run again right there, through its own ``run_cached`` with
its own state record and log, and the task goes on; the same run heals the
store.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Callable

from tasks.store.local import Store
from tasks.config.model import Cell, ModelSpec, Plan
from tasks.engine.cached_run import (PROGRAM, PROGRAM_SHA256, BuildResult, Blocked, CachedTask, Skip, is_up_to_date,
                          read_state, run_cached)

NOT_RUNNABLE = "not runnable on this host"


def capture_name(model: ModelSpec) -> str:
    return f"capture:{model.name}"


def quantize_name(cell: Cell) -> str:
    return f"quantize:{cell.model.name}/{cell.quant.name}/{cell.transform.label}"


def export_name(cell: Cell) -> str:
    return f"export:{cell.name}"


def validate_name(cell: Cell) -> str:
    return f"validate:{cell.name}"


def benchmark_name(cell: Cell) -> str:
    return f"benchmark:{cell.name}"


def size_gate_name(cell: Cell) -> str:
    return f"sizegate:{cell.name}"


def _spec(plan: Plan, name: str, key: str, outputs: dict, **kw) -> CachedTask:
    safe = name.replace(":", "__").replace("/", "__")
    return CachedTask(name=name, key=key, outputs=outputs,
                      state_file=plan.state_dir / f"{safe}.json", log_file=plan.log_path(name), **kw)


# capture, quantize and export entries are read by the tasks downstream (keep_entry).
def capture_spec(plan: Plan, model: ModelSpec) -> CachedTask:
    return _spec(plan, capture_name(model), plan.capture_key(model),
                 {"model.pt2": None, "reference.npz": None}, keep_entry=True)


def quantize_spec(plan: Plan, cell: Cell) -> CachedTask:
    return _spec(plan, quantize_name(cell), plan.quantize_key(cell), {"model.pt2": None}, keep_entry=True)


def export_spec(plan: Plan, cell: Cell) -> CachedTask:
    return _spec(plan, export_name(cell), plan.export_key(cell),
                 {PROGRAM: plan.pte_path(cell), "export.json": plan.export_info_path(cell)}, keep_entry=True)


# A verdict counts only while the export's program is the one it judged (judges).
def validate_spec(plan: Plan, cell: Cell) -> CachedTask:
    if cell.backend.host_runnable:
        outputs = {"numerics.json": plan.numerics_path(cell)}
    else:  # the device checks itself: a BundledProgram with the eager outputs and tolerances
        outputs = {"program.bpte": plan.bundled_path(cell), "bundled.json": plan.bundled_info_path(cell)}
    return _spec(plan, validate_name(cell), plan.validate_key(cell), outputs, judges=export_spec(plan, cell))


def benchmark_spec(plan: Plan, cell: Cell, host: dict) -> CachedTask:
    return _spec(plan, benchmark_name(cell), plan.benchmark_key(cell, host), {"bench.json": plan.bench_path(cell)},
                 judges=export_spec(plan, cell))


def size_gate_spec(plan: Plan, cell: Cell) -> CachedTask:
    return _spec(plan, size_gate_name(cell), plan.size_gate_key(cell, plan.fp32_sibling(cell)), {})


def plan_store(plan: Plan) -> Store:
    """The local store, backed by the shared remote when one is configured.

    Uploads that failed in an earlier run (the remote was down) are retried here, once
    per doit invocation, before any task runs; when the remote is still down, that is
    the run's one warning and the tasks go on without it.
    """
    remote = None
    if plan.cache_remote:
        from tasks.store.remote import remote_from_url

        secret = os.environ.get("ETFORGE_CACHE_KEY") or None
        remote = remote_from_url(plan.cache_remote, read_only=plan.cache_read_only,
                                 secret=secret.encode("utf-8") if secret else None)
    store = Store(plan.cache_dir, remote=remote, state_dir=plan.artifacts_dir / ".etforge")
    if remote is not None and not remote.read_only and store.has_pending():
        uploaded = store.upload_pending()
        if uploaded:
            print(f"etforge: remote cache {remote.name()}: uploaded {uploaded} entr{'y' if uploaded == 1 else 'ies'} "
                  "an earlier run could not", file=sys.stderr, flush=True)
    return store


def _require(upstream: CachedTask) -> None:
    """Stop early, saying why, when the task this one consumes did not succeed."""
    record = read_state(upstream.state_file)
    if record is None or record.get("key") != upstream.key:
        return  # not run in this checkout (another shard built it): the store lookup decides
    if record["status"] in ("failed", "blocked"):
        raise Blocked(f"{upstream.name} {record['status']}")
    if record["status"] == "skipped":
        raise Skip(f"{upstream.name} skipped: {record.get('reason', '')}")


def _stored(store: Store, upstream: CachedTask, rebuild: Callable[[], bool]) -> tuple[dict, dict]:
    """The verified store entry of ``upstream``: (blob name -> path, info).

    When it is missing or fails verification, ``rebuild`` runs the upstream task again here
    (restored from the remote or the working tree when possible, else built), one worker at
    a time per key: another worker needing it meanwhile waits and then reads it.
    """
    _require(upstream)
    hit = store.get(upstream.key)
    if hit is None:
        with store.lock(upstream.key):
            hit = store.get(upstream.key)
            if hit is None:
                print(f"etforge: {upstream.name}: its cache entry is missing or corrupt; running it again",
                      file=sys.stderr, flush=True)
                rebuild()
                _require(upstream)
                hit = store.get(upstream.key)
    if hit is None:
        raise RuntimeError(f"{upstream.name} left nothing in the cache (log: {upstream.log_file})")
    return hit


def _capture_entry(plan: Plan, model: ModelSpec, store: Store) -> tuple[dict, dict]:
    return _stored(store, capture_spec(plan, model), lambda: _run_capture(plan, model, store))


def _graph_entry(plan: Plan, cell: Cell, store: Store) -> tuple[dict, dict]:
    """The graph the cell lowers: its quantized graph, or the fp32 capture."""
    if cell.transform is None:
        return _capture_entry(plan, cell.model, store)
    return _stored(store, quantize_spec(plan, cell), lambda: _run_quantize(plan, cell, store))


def _export_entry(plan: Plan, cell: Cell, store: Store) -> tuple[dict, dict]:
    return _stored(store, export_spec(plan, cell), lambda: _run_export(plan, cell, store))


def _judges_current_program(plan: Plan, cell: Cell, store: Store):
    """``accept`` of a stored validation or benchmark: it counts only for the program stored
    under the cell's current export key (a forged or stale entry judged other bytes)."""
    def accept(info: dict) -> str | None:
        _export_entry(plan, cell, store)
        current = store.blob_sha256(plan.export_key(cell), PROGRAM)
        judged = info.get(PROGRAM_SHA256)
        if judged is None or judged != current:
            return (f"it judged program sha256 {str(judged)[:12]}, but {export_name(cell)}'s program is "
                    f"{str(current)[:12]}")
        return None

    return accept


def _run_capture(plan: Plan, model: ModelSpec, store: Store) -> bool:
    from tasks.build.capture import build_capture

    return run_cached(capture_spec(plan, model), store,
                      lambda workdir: build_capture(model, plan.root, plan.seed, workdir))


def _run_quantize(plan: Plan, cell: Cell, store: Store) -> bool:
    def build(workdir: Path, capture: dict) -> BuildResult:
        from tasks.build.quantize import build_quantized

        return build_quantized(cell, plan.root, plan.seed, capture["model.pt2"], capture["reference.npz"], workdir)

    return run_cached(quantize_spec(plan, cell), store, build,
                      inputs=lambda: _capture_entry(plan, cell.model, store)[0])


def _run_export(plan: Plan, cell: Cell, store: Store) -> bool:
    def inputs() -> dict:
        if cell.backend.missing:
            raise Skip(f"cannot lower here: {cell.backend.missing}")
        return _graph_entry(plan, cell, store)[0]

    def build(workdir: Path, graph: dict) -> BuildResult:
        from tasks.build.lower import build_export

        return build_export(cell, graph["model.pt2"], workdir)

    return run_cached(export_spec(plan, cell), store, build, inputs=inputs)


def _run_validate(plan: Plan, cell: Cell, store: Store) -> bool:
    def inputs():
        if cell.backend.missing:
            raise Skip("not built on this host")
        exported, info = _export_entry(plan, cell, store)
        capture, _ = _capture_entry(plan, cell.model, store)
        return exported, info, capture

    def build(workdir: Path, given) -> BuildResult:
        exported, info, capture = given
        if not cell.backend.host_runnable:
            from tasks.build.bundle import build_bundled

            return build_bundled(cell, exported[PROGRAM], capture["reference.npz"],
                                 info.get("input_dtypes", []), workdir)
        from tasks.build.validate import build_validate

        return build_validate(cell, exported[PROGRAM], capture["reference.npz"],
                              info.get("input_dtypes", []), workdir, program=capture["model.pt2"])

    return run_cached(validate_spec(plan, cell), store, build, inputs=inputs,
                      accept=_judges_current_program(plan, cell, store))


def _run_benchmark(plan: Plan, cell: Cell, store: Store, host: dict) -> bool:
    def inputs():
        if not runs_here(cell):
            raise Skip(NOT_RUNNABLE)
        exported, info = _export_entry(plan, cell, store)
        capture, _ = _capture_entry(plan, cell.model, store)
        return exported, info, capture

    def build(workdir: Path, given) -> BuildResult:
        from tasks.build.benchmark import build_benchmark

        exported, info, capture = given
        options = plan.benchmark
        return build_benchmark(cell, exported[PROGRAM], capture["reference.npz"],
                               info.get("input_dtypes", []), options, workdir)

    return run_cached(benchmark_spec(plan, cell, host), store, build, inputs=inputs,
                      accept=_judges_current_program(plan, cell, store))


def _run_size_gate(plan: Plan, cell: Cell, store: Store) -> bool:
    def inputs() -> tuple:
        infos = [_export_entry(plan, c, store)[1] for c in (cell, plan.fp32_sibling(cell))]
        return infos, _capture_entry(plan, cell.model, store)[1]["weight_bytes"]

    def build(workdir: Path, entries: tuple) -> BuildResult:
        from tasks.build.lower import size_gate

        infos, weights = entries
        if any(info.get("status") != "ok" for info in infos):
            raise RuntimeError(f"needs both {export_name(cell)} and {export_name(plan.fp32_sibling(cell))} ok")
        info, failure = size_gate(cell, infos[0], infos[1], weights)
        return BuildResult(info=info, status="failed" if failure else "ok", reason=failure or "")

    return run_cached(size_gate_spec(plan, cell), store, build, inputs=inputs)


def _task(spec: CachedTask, store: Store, action, doc: str, task_dep=()) -> dict:
    basename, sub = spec.name.split(":", 1)
    return {
        "basename": basename,
        "name": sub,
        "doc": doc,
        "actions": [action],
        "uptodate": [(is_up_to_date, [spec, store])],
        "task_dep": list(dict.fromkeys(task_dep)),
        "verbosity": 2,  # builders send their own output to the task's log file
    }


def capture_tasks(plan: Plan, cells, store: Store) -> list:
    models = {c.model.name: c.model for c in cells}
    return [_task(capture_spec(plan, m), store, (_run_capture, [plan, m, store]),
                  f"torch.export {m.name} once and record eager reference outputs")
            for m in models.values()]


def quantize_tasks(plan: Plan, cells, store: Store) -> list:
    unique = {}
    for c in cells:
        if c.transform is not None and not c.backend.missing:
            first = unique.setdefault(quantize_name(c), c)  # cells with one config share one task
            if plan.quantize_key(first) != plan.quantize_key(c):
                raise RuntimeError(f"{quantize_name(c)} names two quantizer configs ({first.name}, {c.name})")
    return [_task(quantize_spec(plan, c), store, (_run_quantize, [plan, c, store]),
                  f"{c.transform.method} {c.quant.name} of {c.model.name} with {c.transform.ref}",
                  task_dep=[capture_name(c.model)])
            for c in unique.values()]


def export_tasks(plan: Plan, cells, store: Store) -> list:
    tasks = []
    for c in cells:
        deps = []
        if not c.backend.missing:
            deps.append(quantize_name(c) if c.transform else capture_name(c.model))
        tasks.append(_task(export_spec(plan, c), store, (_run_export, [plan, c, store]),
                           f"lower {c.model.name} for {c.backend.name} ({c.quant.name}) to {plan.pte_path(c).name}",
                           task_dep=deps))
    return tasks


def validate_tasks(plan: Plan, cells, store: Store) -> list:
    return [_task(validate_spec(plan, c), store, (_run_validate, [plan, c, store]),
                  f"run {plan.pte_path(c).name} and compare with eager PyTorch",
                  task_dep=[export_name(c), capture_name(c.model)])
            for c in cells]


def has_size_gate(plan: Plan, cell: Cell, cells) -> bool:
    sibling = plan.fp32_sibling(cell)
    return sibling is not None and sibling in cells and not cell.backend.missing


def verdict_task_names(plan: Plan, cell: Cell, cells) -> list:
    """The tasks whose outcome decides whether ``cell`` may ship."""
    names = [export_name(cell), validate_name(cell)]
    if has_size_gate(plan, cell, cells):
        names.append(size_gate_name(cell))
    return names


def runs_here(cell: Cell) -> bool:
    """This host can lower the cell and its runtime can execute the program (benchmarks)."""
    return cell.backend.host_runnable and not cell.backend.missing


def matrix_task_deps(plan: Plan, cells) -> list:
    """What a matrix-wide task (report, release) waits for: every verdict and benchmark."""
    deps = [t for c in cells for t in verdict_task_names(plan, c, cells)]
    deps += [benchmark_name(c) for c in cells if runs_here(c)]
    return list(dict.fromkeys(deps))


def size_gate_tasks(plan: Plan, cells, store: Store) -> list:
    """A quantized cell must save what its scheme declares against its fp32 sibling (tasks/export.py
    size_gate); a separate task so that a failing fp32 export never keeps the quantized cell from building."""
    return [_task(size_gate_spec(plan, c), store, (_run_size_gate, [plan, c, store]),
                  f"check {c.name} saves what {c.quant.name} should against {plan.fp32_sibling(c).name}",
                  task_dep=[export_name(c), export_name(plan.fp32_sibling(c)), capture_name(c.model)])
            for c in cells if has_size_gate(plan, c, cells)]


def benchmark_tasks(plan: Plan, cells, store: Store, host: dict) -> list:
    """Host benchmark of each host-runnable cell; keyed by the host, so never served across machines."""
    return [_task(benchmark_spec(plan, c, host), store, (_run_benchmark, [plan, c, store, host]),
                  f"time {plan.pte_path(c).name} in the ExecuTorch runtime (p50, p90, memory)",
                  task_dep=[export_name(c), capture_name(c.model)])
            for c in cells if runs_here(c)]
