"""The stage table: every kind of task etforge runs, declared once.

In the spirit of doit's ``valid_attr`` table and ExecuTorch's ``Stage`` with its
``valid_predecessor_stages``: the doit task dicts (etforge.engine.taskdicts),
the task specs and records (specs.py, records.py), the keys (keys.py), the
``task_dep`` edges, the cells an outcome reads (etforge.publish.outcome) and
the loader's doit task creators (etforge.engine.entry) all follow from this table.

Adding a stage is one entry here and one builder (``builder(request) ->
BuildResult`` in etforge.builders; a part of every model kind, KINDS, when each kind builds
it its own way), or a content and a render function in etforge.publish for a matrix-wide stage.

Subjects: ``model`` (one task per model of the selected cells), ``graph`` (one
per distinct quantizer config of a model: the cells that share it share the
task), ``cell`` (one per cell), ``pipeline`` (one task). Names, relations and
predicates are data: RELATIONS and PREDICATES below say what each name means.

A key covers (etforge.pipeline.keys): the stage's ``key_inputs`` (facts of the
plan), the keys of its ``upstream`` tasks, and the import closure of its
builder's module and its ``code`` modules (:func:`code_of`; plus the modules its recipes name, through the
``partitioner_code`` and ``quantizer_code`` facts). A matrix-wide stage's key
is the digest of what it renders (``content``), its ``templates`` and its code.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from etforge.config.model import ModelKind
from etforge.core.errors import BadValue

# Verdicts, gates and benchmarks: what a matrix-wide task waits for, in pipeline order.
CELL_VERDICTS = ("export", "sizegate", "validate", "target", "benchmark")
MANIFEST_FILES = (
    "models.g.dart",
    "pubspec_assets.yaml",
    "models.cmake",
    "index.json",
    "etforge_models.h",
    "selected_operators.yaml",  # the shipped programs' operators outside delegates (selective build)
)
# What a model, graph or cell task calls before its builder: ExecuTorch's native libraries in one
# load order, so a program computes the same whatever the worker ran before (etforge.builders.runtime.determinism).
BUILD_SETUP = "etforge.builders.runtime.determinism:load_runtime_libraries"
PARTS = ("capture", "quantize", "export", "validate", "benchmark")  # what each model kind builds its own way


@dataclass(frozen=True)
class Kind:
    """The builders of one model kind ("module:function" each): the parts of a cell's path that a
    kind of model (an nn.Module, a decoder-only LLM, an encoder-decoder) builds its own way."""

    capture: str
    quantize: str
    export: str
    validate: str
    benchmark: str


# Chosen once per model, by its kind (ModelSpec.kind): no builder branches on the kind.
KINDS: dict[ModelKind, Kind] = {
    ModelKind.MODULE: Kind(
        capture="etforge.builders.capture.capture:capture_stage",
        quantize="etforge.builders.quantization.quantize:quantize_stage",
        export="etforge.builders.lowering.lower:export_stage",
        validate="etforge.builders.numerics.validate:validate_stage",
        benchmark="etforge.builders.bench.benchmark:benchmark_stage",
    ),
    ModelKind.LLM: Kind(*(f"etforge.builders.llm.stages:{part}_stage" for part in PARTS)),
    ModelKind.SEQ2SEQ: Kind(*(f"etforge.builders.seq2seq.stages:{part}_stage" for part in PARTS)),
}


@dataclass(frozen=True)
class MatrixWide:
    """What a matrix-wide stage (subject ``pipeline``) adds: what it waits for, what it renders."""

    after: tuple = ()  # the stages whose tasks (of the selected cells) it waits for
    content: str | None = None  # "module:function" (plan, cells, host) -> what it renders
    content_reads: str | None = None  # "module:function" (plan) -> the FileSet the content may read (its key's memo)
    templates: tuple = ()  # templates/ files whose bytes join the key
    cached: bool = True  # False: no store entry, never up to date (it decides itself what to refuse)
    options: tuple = ()  # (name, help) of boolean flags handed to the builder (doit task parameters)


@dataclass(frozen=True)
class Stage:
    name: str  # the doit basename; its tasks are <name>:<subject> (task_name)
    subject: str  # model | graph | cell | pipeline
    doc: str  # what `etforge list` says of the stage
    task_doc: str  # what it says of each task; {fields} from etforge.engine.taskdicts doc_fields
    part: str | None = None  # the Kind part that builds it (PARTS), chosen by the subject's model kind
    builder: str | None = None  # else "module:function": the one builder of every kind (the size gate)
    code: tuple = ()  # entry modules besides its builder's: their import closure joins the key
    key_inputs: tuple = ()  # names of facts of the plan (etforge.pipeline.keys FACTS) that join the key
    upstream: tuple = ()  # relations (RELATIONS) whose store entries the builder reads; their keys join the key
    outputs: tuple = ()  # (blob, where[, predicate]): where (ArtifactLayout.output) or None: store only
    applies: str = "always"  # the PREDICATE that says which subjects get this stage
    skip_if: tuple = ()  # (PREDICATE, reason): skipped at once, reading nothing, waiting for nothing
    keep_entry: bool = False  # downstream tasks read its store entry
    judges: str | None = None  # a verdict on this relation's program.pte: it counts only for those bytes
    matrix: MatrixWide = field(default_factory=lambda: MatrixWide())  # a matrix-wide stage's own facts
    default: bool = True  # run by a plain `doit`


@dataclass(frozen=True, eq=False)
class StageTable:
    """What runs each stage: the builders of every model kind, and what a model, graph or cell task
    calls first. The engine is handed one (etforge.engine.entry load_selection); tests hand it fakes.

    Keys do not read it: a task's key covers the code of the builders the stage table names
    (:func:`code_of`), whatever stands in for them in a run."""

    kinds: dict[ModelKind, Kind] = field(default_factory=lambda: dict(KINDS))
    builders: dict[str, str] = field(default_factory=dict)  # stage name -> builder, over a Stage's own
    setup: str | None = BUILD_SETUP

    def builder_for(self, stage: Stage, kind: ModelKind | None = None) -> str:
        """The builder a subject of model ``kind`` runs for ``stage`` (its kind's part, else the stage's
        own; a matrix-wide stage has no kind)."""
        if stage.part is not None:
            if kind is None:
                raise BadValue(f"stage {stage.name} is built by each model kind's {stage.part}: name the kind")
            return getattr(self.kinds[kind], stage.part)
        builder = self.builders.get(stage.name, stage.builder)
        if builder is None:
            raise BadValue(f"stage {stage.name} names neither a part nor a builder")
        return builder


DEFAULT_TABLE = StageTable()


def code_of(stage: Stage, kind: ModelKind) -> tuple:
    """The entry modules whose import closure joins the key of ``stage``'s task for a subject of ``kind``:
    its own ``code``, its builder's module and, for a model, graph or cell task, the setup's."""
    if stage.subject == "pipeline":
        return stage.code
    modules = (DEFAULT_TABLE.builder_for(stage, kind), BUILD_SETUP)
    return tuple(dict.fromkeys(stage.code + tuple(m.split(":")[0] for m in modules)))


def kind_of(subject) -> ModelKind:
    """The model kind of a stage's subject (a ModelSpec or a Cell)."""
    return getattr(subject, "model", subject).kind


STAGES = (
    Stage(
        "capture",
        "model",
        doc="torch.export each model once, shared by all of its cells",
        task_doc="torch.export {model} once and record eager reference outputs",
        part="capture",
        key_inputs=("model", "seed", "toolchain"),
        outputs=(("model.pt2", None), ("reference.npz", None)),
        keep_entry=True,
        default=False,
    ),
    Stage(
        "quantize",
        "graph",
        doc="quantize each model once per quantizer config, shared by its cells",
        task_doc="{method} {scheme} of {model} with {ref}",
        part="quantize",
        key_inputs=("transform", "calibration", "toolchain", "quantizer_code"),
        upstream=("capture",),
        outputs=(("model.pt2", None),),
        applies="quantized",
        keep_entry=True,
        default=False,
    ),
    Stage(
        "export",
        "cell",
        doc="lower each cell (model x backend x quantization) to a .pte",
        task_doc="lower {model} for {backend} ({scheme}) to {pte}",
        part="export",  # (a recipe's lowering context joins through partitioner_code)
        key_inputs=("backend", "embedded_metadata", "coverage_gate", "toolchain", "partitioner_code"),
        upstream=("graph", "capture"),  # capture: the outputs its metadata describes
        outputs=(
            ("program.pte", "pte_path"),
            ("export.json", "export_info_path"),
            ("program.ptd", "ptd_path", "external_weights"),
            ("delegates.tosa.npz", None, "keeps_tosa"),  # an Ethos-U program's TOSA form (ethos_u_vela)
            ("selected_operators.yaml", "oplist_path"),  # its operators outside delegates (selective build)
            ("program.etrecord", "etrecord_path", "host_runnable"),  # the devtools read its ETDump with it
        ),
        skip_if=(("backend_missing", "cannot lower here: {missing}"),),
        keep_entry=True,
    ),
    # A separate task, so that a failing fp32 export never keeps the quantized cell from building.
    Stage(
        "sizegate",
        "cell",
        doc="check each quantized .pte is smaller than its fp32 sibling",
        task_doc="check {cell} saves what {scheme} should against {sibling}",
        builder="etforge.builders.gates.gates:size_gate_stage",
        key_inputs=("size_gate",),
        upstream=("export", "fp32_export", "capture", "graph"),  # graph: the layers the scheme took
        applies="size_gated",
    ),
    # A cell this host cannot run gets a .bpte instead: the device checks itself.
    Stage(
        "validate",
        "cell",
        doc="run each host-runnable .pte and compare it with eager PyTorch",
        task_doc="run {pte} and compare with eager PyTorch",
        part="validate",
        key_inputs=("thresholds", "host_runnable", "runtime_tools", "toolchain"),
        # graph: a quantized cell's, for its first divergent layer; export: the program and, where this
        # host runs it, its ETRecord, which maps the program's own ETDump to layers (covered by export's key)
        upstream=("export", "capture", "graph"),
        outputs=(
            ("numerics.json", "numerics_path", "validated_here"),
            ("program.bpte", "bundled_path", "checked_on_device"),
            ("bundled.json", "bundled_info_path", "checked_on_device"),
        ),
        skip_if=(("backend_missing", "not built on this host"),),
        judges="export",
    ),
    # The same program on other CPUs' ExecuTorch runtimes (aarch64 under qemu-user): a check per target.
    Stage(
        "target",
        "cell",
        doc="run each CPU cell's .pte on its target cores (aarch64 under qemu-user) and compare with eager PyTorch",
        task_doc="run {pte} in the aarch64 runtime on each target core and compare with eager PyTorch",
        builder="etforge.builders.targets.stage:target_stage",
        key_inputs=("thresholds", "targets", "toolchain"),
        upstream=("export", "capture"),
        outputs=(("targets.json", None),),
        applies="has_targets",
        skip_if=(("backend_missing", "not built on this host"),),
        judges="export",
    ),
    # Keyed by the host: never served across machines.
    Stage(
        "benchmark",
        "cell",
        doc="time each host-runnable .pte (run with -n 1 for comparable figures)",
        task_doc="time {pte} in the ExecuTorch runtime (p50, p90, memory)",
        part="benchmark",
        key_inputs=("benchmark_options", "host", "runtime_tools"),
        upstream=("export", "capture"),
        outputs=(("bench.json", "bench_path"), ("program.etdump", "etdump_path")),  # etdump: its profile's
        applies="runs_here",
        judges="export",
    ),
    Stage(
        "manifest",
        "pipeline",
        doc="write Dart, pubspec, CMake and JSON manifests of the built cells",
        task_doc="write {files} of the shippable cells to {manifest_dir}/",
        builder="etforge.publish.manifests.render:manifest_stage",
        code=("etforge.publish.manifests.context", "etforge.publish.manifests.render"),
        outputs=tuple((f, "manifest_dir") for f in MANIFEST_FILES),
        matrix=MatrixWide(
            content="etforge.publish.manifests.context:manifest_content",
            content_reads="etforge.publish.content_reads:content_reads",
            templates=(
                "models.g.dart.j2",
                "pubspec_assets.yaml.j2",
                "models.cmake.j2",
                "selective_build.cmake.j2",
                "etforge_models.h.j2",
            ),
            after=CELL_VERDICTS,
        ),
    ),
    Stage(
        "report",
        "pipeline",
        doc="write the self-contained HTML report of the selected cells",
        task_doc="write {report}: matrix, charts, numerics and latency",
        builder="etforge.publish.report.page:report_stage",
        code=("etforge.publish.report.page",),
        outputs=(("report.html", "out_dir"),),
        matrix=MatrixWide(
            content="etforge.publish.report.page:report_content",
            content_reads="etforge.publish.content_reads:content_reads",
            templates=("report.html.j2",),
            after=CELL_VERDICTS,
        ),
    ),
    Stage(
        "release",
        "pipeline",
        doc="pack artifacts/release/<name>-<version>.tar.gz (--allow-failures packs despite failed cells, "
        "--strict refuses provisional ones)",
        task_doc="pack {archive} (refuses when a cell failed; --allow-failures; --strict also refuses "
        "provisional cells)",
        builder="etforge.publish.release:run_release",
        default=False,
        matrix=MatrixWide(
            cached=False,
            options=(
                (
                    "allow_failures",
                    "pack the cells that passed although others failed, list the failures in the release and exit 0",
                ),
                ("strict", "also refuse cells validated on random inputs only (provisional)"),
            ),
            after=CELL_VERDICTS + ("manifest",),
        ),
    ),
)
STAGE = {s.name: s for s in STAGES}


def fp32_export(plan, cell):
    sibling = plan.fp32_sibling(cell)
    return None if sibling is None else ("export", sibling)


# Relation -> (stage, subject) of the upstream task, for a cell (or a model, for capture's own relations).
RELATIONS = {
    "capture": lambda plan, cell: ("capture", cell.model),
    "graph": lambda plan, cell: ("quantize", cell) if cell.transform is not None else ("capture", cell.model),
    "export": lambda plan, cell: ("export", cell),
    "fp32_export": fp32_export,
}


def _lowerable(cell) -> bool:
    return not cell.backend.missing and not cell.model.missing


def missing_here(cell) -> str | None:
    """What this host lacks to build ``cell`` (its model's labels, then its backend's needs), or None."""
    return cell.model.missing or cell.backend.missing


def _size_gated(plan, cell, selected) -> bool:
    sibling = plan.fp32_sibling(cell)
    return sibling is not None and (selected is None or sibling.name in selected) and _lowerable(cell)


# Predicate -> (plan, cell, the names of the selected cells or None for "any selection") -> bool.
PREDICATES = {
    "always": lambda plan, cell, selected: True,
    "quantized": lambda plan, cell, selected: cell.transform is not None and _lowerable(cell),
    "size_gated": _size_gated,  # the scheme declares a size gate and its fp32 sibling is built here too
    "runs_here": lambda plan, cell, selected: cell.backend.host_runnable and _lowerable(cell),
    "backend_missing": lambda plan, cell, selected: not _lowerable(cell),
    "host_runnable": lambda plan, cell, selected: cell.backend.host_runnable,
    "has_targets": lambda plan, cell, selected: bool(cell.targets) and _lowerable(cell),  # pipeline.yaml targets
    # run here, in the runtime or on what its recipe's runtime.validated_by names (the TOSA reference model)
    "validated_here": lambda plan, cell, selected: cell.backend.validated_here,
    "checked_on_device": lambda plan, cell, selected: not cell.backend.validated_here,
    "keeps_tosa": lambda plan, cell, selected: any(m.lowering.get("after") for m in cell.backend.members),
    # the backend entry keeps constants in a separate .ptd (etforge.builders.lowering.lower external_weights)
    "external_weights": lambda plan, cell, selected: any(
        m.options.get("external_weights") for m in cell.backend.members
    ),
}


def needs_of(stage: Stage, subject) -> frozenset:
    """The worker labels a task of ``stage`` needs (etforge.config.labels): its model's, a cell's
    backend's for lowering, and for running its programs where this host runs them by label."""
    needs = set(getattr(subject, "model", subject).labels)
    if stage.subject == "cell":
        backend = subject.backend
        needs |= backend.labels
        if stage.name in ("validate", "benchmark") and backend.host_runnable:
            needs |= backend.runtime_labels
    return frozenset(needs)


def holds(predicate: str, plan, cell, selected=None) -> bool:
    return PREDICATES[predicate](plan, cell, selected)


def subject_of(stage: Stage, cell):
    """The subject of ``stage`` that ``cell`` belongs to (its model, for a model stage)."""
    return cell.model if stage.subject == "model" else cell


def task_name(stage: Stage, subject=None) -> str:
    """The one naming rule: capture:<model>, quantize:<model>/<scheme>/<config>, <stage>:<cell>, <stage>."""
    if stage.subject == "pipeline":
        return stage.name
    if stage.subject == "model":
        return f"{stage.name}:{getattr(subject, 'model', subject).name}"
    if stage.subject == "graph":
        return f"{stage.name}:{subject.model.name}/{subject.quant.name}/{subject.transform.label}"
    return f"{stage.name}:{subject.name}"


def upstream_of(plan, stage: Stage, subject) -> list:
    """(relation, upstream Stage, its subject) of each relation ``stage`` reads, in the table's order."""
    out = []
    for relation in stage.upstream:
        found = RELATIONS[relation](plan, subject)
        if found is not None:
            out.append((relation, STAGE[found[0]], found[1]))
    return out


def is_cell_task(name: str) -> bool:
    """A task whose record belongs to cells (capture and quantize to every cell that uses them)."""
    stage = STAGE.get(name.split(":", 1)[0])
    return stage is not None and stage.subject != "pipeline"
