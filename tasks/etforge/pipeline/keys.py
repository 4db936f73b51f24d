"""The key of any task, derived from the stage table: everything that can change its output, nothing else.

    key = sha256(canonical JSON of {
        "stage":    the stage's name,
        "facts":    {name: FACTS[name](plan, subject, host) for name in stage.key_inputs},
        "upstream": {relation: key of the upstream task},
        "code":     digest of the import closure of stage.code (etforge.config.code_deps)})

Names join no key (a model's name, a cell's name, the pipeline's name) but where they
are part of the output: a program embeds its model, backend and scheme names in its
metadata (etforge.program.metadata), so the export key holds them
(``embedded_metadata``). A renamed model reuses its capture and quantized graphs and
is only lowered again. Code freshness is decided one way for every
stage: the static import closure of its entry modules, plus the project modules
its recipes name by dotted path (``partitioner_code``, ``quantizer_code``).
A matrix-wide stage's key is the digest of what it renders (its content), its
templates and its code (:func:`content_key`).
"""

from __future__ import annotations

from etforge.config import target_runtime
from etforge.core.digest import digest, sha256_file
from etforge.core.dotted_path import module_of
from etforge.core.errors import BadValue
from etforge.core.paths import PACKAGE_NAME, TEMPLATE_DIR
from etforge.pipeline.stages import Stage, code_of, kind_of, task_name, upstream_of

# Methods a quantization recipe names that are Python factories (``dtype`` names a torch dtype).
FACTORY_METHODS = ("pt2e", "torchao")


def _named_code(plan, refs) -> dict:
    """Digests of the code that dotted references name: etforge's modules, or a project's own (a
    project recipe's partitioner or quantizer); other packages count by their versions (tools)."""
    return {module: code.of((module,)) for module, code in _named_modules(plan, refs)}


def _named_modules(plan, refs) -> list:
    """(module, the CodeDigests it is under) of each reference to etforge's or the project's code."""
    out = []
    for ref in refs:
        module = module_of(ref)
        if module.split(".")[0] == PACKAGE_NAME:
            out.append((module, plan.code.etforge))
        elif plan.code.project is not None and plan.code.project.has(module):
            out.append((module, plan.code.project))
    return out


def _quantizer_refs(cell) -> list:
    transform = cell.transform  # None: fp32, nothing to quantize
    return [transform.ref] if transform is not None and transform.method in FACTORY_METHODS else []


def _partitioner_refs(cell) -> list:
    return [
        ref
        for m in cell.backend.members
        for ref in (m.partitioner, m.lowering.get("context"), m.lowering.get("after"))
        if ref
    ]


def _runtime_refs(cell) -> list:
    """The probe of a program this host cannot run, or the runner its recipe validates it with."""
    if not cell.backend.validated_here:
        return [cell.backend.probe] if cell.backend.probe else []
    validator = cell.backend.validated_by
    return [validator["runner"]] if validator else []


def _transform(cell) -> dict:
    """The quantizer config; with ``keep_float: auto`` also the thresholds it keeps layers in float
    for (etforge.builders.quantization.rescue): they change which layers the quantized graph keeps."""
    out = cell.transform.canonical()
    if (cell.transform.options or {}).get("keep_float") == "auto":
        out = {**out, "rescue_thresholds": cell.thresholds}
    return out


def _runtime_tools(plan, cell, host) -> dict:
    # Only a cell that runs here uses its runtime tools; the others get a .bpte. A program the
    # runtime cannot run but its recipe's runtime.validated_by can: that runner and its code too.
    if not cell.backend.validated_here:  # its probe's code decides the note of its .bpte
        return {"probe_code": _named_code(plan, _runtime_refs(cell))} if cell.backend.probe else {}
    validator = cell.backend.validated_by
    if not validator:
        return cell.backend.runtime_tools
    return {
        **cell.backend.runtime_tools,
        "validated_by": validator,
        "validated_by_code": _named_code(plan, _runtime_refs(cell)),
    }


# Fact -> (plan, subject, host) -> a JSON-serialisable value.
FACTS = {
    "model": lambda plan, model, host: model.canonical(),
    "seed": lambda plan, subject, host: plan.seed,
    "toolchain": lambda plan, subject, host: plan.toolchain,
    "transform": lambda plan, cell, host: _transform(cell),
    "calibration": lambda plan, cell, host: cell.model.calibration if cell.transform.calibrated else None,
    "quantizer_code": lambda plan, cell, host: _named_code(plan, _quantizer_refs(cell)),
    "backend": lambda plan, cell, host: cell.backend.canonical(),
    # The names a program embeds (etforge.program.metadata): part of the .pte's bytes.
    "embedded_metadata": lambda plan, cell, host: {
        "model": cell.model.name,
        "backend": cell.backend.name,
        "scheme": cell.quant.name,
    },
    "coverage_gate": lambda plan, cell, host: cell.backend.min_coverage,
    "partitioner_code": lambda plan, cell, host: _named_code(plan, _partitioner_refs(cell)),
    "size_gate": lambda plan, cell, host: cell.size_gate,
    "thresholds": lambda plan, cell, host: cell.thresholds,
    "host_runnable": lambda plan, cell, host: cell.backend.host_runnable,
    "runtime_tools": _runtime_tools,
    "targets": lambda plan, cell, host: _targets(plan, cell),
    "benchmark_options": lambda plan, cell, host: plan.benchmark.options,
    "host": lambda plan, cell, host: _required_host(host),
}


def _targets(plan, cell) -> dict:
    """The profiles a cell's program is judged on and the runtime that judges them there: the
    aarch64 wheel, the cross-built runner and qemu (etforge.config.target_runtime), read once per plan."""
    runtime = plan.memo.get("target_runtime")
    if runtime is None:
        runtime = plan.memo["target_runtime"] = target_runtime.fingerprint(plan.code.etforge.digests)
    return {"profiles": [t.canonical() for t in cell.targets], "runtime": runtime}


def _required_host(host):
    if host is None:
        raise BadValue("a benchmark key needs the host fingerprint (etforge.config.machine.host_fingerprint())")
    return host


def key_of(plan, stage: Stage, subject, host: dict | None = None, fresh: bool = False) -> str:
    """The key of ``stage``'s task for ``subject`` (a ModelSpec or a Cell); ``host``: for benchmarks.

    Memoised per plan by task name (a task's key depends on the plan only, and a benchmark's on the
    host too); ``fresh``: computed anyway (to check that the subjects sharing one task name share its key).
    """
    if fresh:
        return key_from(inputs_of(plan, stage, subject, host, fresh))
    return memoised(plan, "keys", stage, subject, host, lambda: key_from(inputs_of(plan, stage, subject, host)))


def memoised(plan, table: str, stage: Stage, subject, host: dict | None, compute):
    """``compute()`` once per plan per task name, and per host for a stage whose key has the host in it."""
    memo = plan.memo.setdefault(table, {})
    name = task_name(stage, subject)
    found = memo.get(name)
    if "host" not in stage.key_inputs:
        if found is None:
            found = memo[name] = compute()
        return found
    if found is None or found[0] != host:  # (a copy of the host it was computed for, and the value)
        found = memo[name] = (dict(host) if host is not None else None, compute())
    return found[1]


def inputs_of(plan, stage: Stage, subject, host: dict | None = None, fresh: bool = False) -> dict:
    """The named inputs of the task's key (:func:`key_from` digests them), memoised like the key:

        {"stage": name, "facts": {fact: value}, "upstream": {relation: {"task", "key"}},
         "code": {etforge file: sha256}}

    A task's record keeps them, so that ``etforge explain`` can name what changed."""
    if fresh:
        return _inputs(plan, stage, subject, host)
    return memoised(plan, "inputs", stage, subject, host, lambda: _inputs(plan, stage, subject, host))


def _inputs(plan, stage: Stage, subject, host: dict | None) -> dict:
    return {
        "stage": stage.name,
        "facts": {name: FACTS[name](plan, subject, host) for name in stage.key_inputs},
        "upstream": {
            relation: {"task": task_name(up, up_subject), "key": key_of(plan, up, up_subject, host)}
            for relation, up, up_subject in upstream_of(plan, stage, subject)
        },
        "code": plan.code.etforge.file_digests(code_of(stage, kind_of(subject))),
    }


def reads_of(plan, stage: Stage, subject, host: dict | None = None) -> frozenset:
    """The files a task's result is made from, by the names the plan's DigestCache keeps them under:
    its stage's code, the project code its recipes name, its model's files (code, weights, data),
    and those of every task upstream of it (a builder may read what its upstream's key covered:
    a validation runs the model's code again). What etforge.engine.cached_run checks once the
    task ran: a file edited since the plan means the result is not the key's."""
    return memoised(plan, "reads", stage, subject, host, lambda: _reads(plan, stage, subject, host))


def _reads(plan, stage: Stage, subject, host: dict | None) -> frozenset:
    names = set(plan.code.etforge.read_names(code_of(stage, kind_of(subject))))
    model = getattr(subject, "model", subject)
    names |= model.reads
    if subject is not model:  # a cell (or a quantized graph): the code its recipes name
        refs = _quantizer_refs(subject) + _partitioner_refs(subject) + _runtime_refs(subject)
        for module, code in _named_modules(plan, refs):
            names |= code.read_names((module,))
    for _, up, up_subject in upstream_of(plan, stage, subject):
        names |= reads_of(plan, up, up_subject, host)
    return frozenset(names)


def key_from(inputs: dict) -> str:
    """The key named by :func:`inputs_of`'s inputs: the stage, the facts, the upstream keys and one
    digest of the code (the same digest as before the inputs were kept by name)."""
    return digest(
        {
            "stage": inputs["stage"],
            "facts": inputs["facts"],
            "upstream": {relation: up["key"] for relation, up in inputs["upstream"].items()},
            "code": digest(inputs["code"]),
        }
    )


def template_digests(stage: Stage) -> dict:
    """{template: sha256} of a matrix-wide stage's templates (templates/)."""
    return {t: sha256_file(TEMPLATE_DIR / t) for t in stage.matrix.templates}


def content_key(plan, stage: Stage, content) -> str:
    """The key of a matrix-wide stage: a digest of what it renders, its templates and its code."""
    return digest(
        {
            "stage": stage.name,
            "content": content,
            "templates": template_digests(stage),
            "code": plan.code.etforge.of(stage.code),
        }
    )
