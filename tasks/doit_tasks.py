"""doit task dicts for a resolved plan: capture per model, export and validate per cell.

Task actions import torch/executorch lazily (inside the builders); building
the dicts and checking ``uptodate`` only reads state records and stats files.
"""

from __future__ import annotations

from pathlib import Path

from tasks.cache import Store
from tasks.plan import Cell, ModelSpec, Plan
from tasks.runner import BuildResult, CachedTask, Skip, is_up_to_date, run_cached

NOT_RUNNABLE = "not runnable on this host"


def capture_name(model: ModelSpec) -> str:
    return f"capture:{model.name}"


def export_name(cell: Cell) -> str:
    return f"export:{cell.name}"


def validate_name(cell: Cell) -> str:
    return f"validate:{cell.name}"


def _state_file(plan: Plan, task_name: str) -> Path:
    return plan.state_dir / (task_name.replace(":", "__").replace("/", "__") + ".json")


def capture_spec(plan: Plan, model: ModelSpec) -> CachedTask:
    name = capture_name(model)
    return CachedTask(name=name, key=plan.capture_key(model),
                      outputs={"model.pt2": None, "reference.npz": None},
                      state_file=_state_file(plan, name), log_file=plan.log_path(name))


def export_spec(plan: Plan, cell: Cell) -> CachedTask:
    name = export_name(cell)
    return CachedTask(name=name, key=plan.export_key(cell),
                      outputs={"program.pte": plan.pte_path(cell),
                               "export.json": plan.export_info_path(cell)},
                      state_file=_state_file(plan, name), log_file=plan.log_path(name))


def validate_spec(plan: Plan, cell: Cell) -> CachedTask:
    name = validate_name(cell)
    return CachedTask(name=name, key=plan.validate_key(cell),
                      outputs={"numerics.json": plan.numerics_path(cell)},
                      state_file=_state_file(plan, name), log_file=plan.log_path(name))


def _stored_file(store: Store, key: str, blob: str, what: str) -> Path:
    hit = store.get(key)
    if hit is None:
        raise RuntimeError(f"{what} is missing from the cache; run its task again")
    return hit[0][blob]


def _run_capture(plan: Plan, model: ModelSpec, store: Store) -> bool:
    from tasks.capture import build_capture

    return run_cached(capture_spec(plan, model), store,
                      lambda workdir: build_capture(model, plan.root, plan.seed, workdir))


def _run_export(plan: Plan, cell: Cell, store: Store) -> bool:
    def build(workdir: Path) -> BuildResult:
        from tasks.export import build_export

        program = _stored_file(store, plan.capture_key(cell.model), "model.pt2", capture_name(cell.model))
        return build_export(cell, program, workdir)

    return run_cached(export_spec(plan, cell), store, build)


def _run_validate(plan: Plan, cell: Cell, store: Store) -> bool:
    def build(workdir: Path) -> BuildResult:
        from tasks.validate import build_validate

        if not cell.backend.host_runnable:
            raise Skip(f"{NOT_RUNNABLE}: the ExecuTorch runtime here has no {cell.backend.name} delegate")
        pte = _stored_file(store, plan.export_key(cell), "program.pte", export_name(cell))
        reference = _stored_file(store, plan.capture_key(cell.model), "reference.npz", capture_name(cell.model))
        return build_validate(cell, pte, reference, workdir)

    return run_cached(validate_spec(plan, cell), store, build)


def _task(spec: CachedTask, store: Store, action, doc: str, task_dep=()) -> dict:
    basename, sub = spec.name.split(":", 1)
    return {
        "basename": basename,
        "name": sub,
        "doc": doc,
        "actions": [action],
        "uptodate": [(is_up_to_date, [spec, store])],
        "task_dep": list(task_dep),
        "verbosity": 2,  # builders send their own output to the task's log file
    }


def capture_tasks(plan: Plan, cells) -> list:
    store = Store(plan.cache_dir)
    models = {c.model.name: c.model for c in cells}
    return [_task(capture_spec(plan, m), store, (_run_capture, [plan, m, store]),
                  f"torch.export {m.name} once and record eager reference outputs")
            for m in models.values()]


def export_tasks(plan: Plan, cells) -> list:
    store = Store(plan.cache_dir)
    return [_task(export_spec(plan, c), store, (_run_export, [plan, c, store]),
                  f"lower {c.model.name} for {c.backend.name} ({c.quant.name}) to {plan.pte_path(c).name}",
                  task_dep=[capture_name(c.model)])
            for c in cells]


def validate_tasks(plan: Plan, cells) -> list:
    store = Store(plan.cache_dir)
    return [_task(validate_spec(plan, c), store, (_run_validate, [plan, c, store]),
                  f"run {plan.pte_path(c).name} and compare with eager PyTorch",
                  task_dep=[export_name(c), capture_name(c.model)])
            for c in cells]
