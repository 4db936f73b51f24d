"""The resolved pipeline: frozen dataclasses, built once from pipeline.yaml (etforge.config.resolve).

Everything downstream (stage keys, task records, outcomes, manifests) reads a
Plan, never the raw YAML. The same canonical serialization of a cell feeds its
cache keys, its manifest entry and its report row.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

from etforge.config import defaults, recipes
from etforge.config.code_deps import CodeDigests

# Matrix dimension -> the pipeline.yaml section that declares its names.
SECTIONS = {"model": "models", "backend": "backends", "quantization": "quantization"}


INTEGER_DTYPES = {
    "int64": (-(1 << 63), 1 << 63),
    "int32": (-(1 << 31), 1 << 31),
    "int8": (-128, 128),
    "uint8": (0, 256),
}  # dtype -> the values it holds, [lo, hi)


@dataclass(frozen=True)
class InputSpec:
    name: str
    shape: tuple
    dtype: str
    # The values random samples take (etforge.builders.capture.samples): integers in [lo, hi), hi exclusive;
    # floats uniform in [lo, hi). None: floats standard normal, integers defaults.INT_INPUT_RANGE.
    range: tuple | None = None
    # Dynamic dims: ((axis, min, max, name), ...); ``shape`` holds each one's max (what the
    # program's buffers are sized for). Dims with one name share one torch.export.Dim.
    dims: tuple = ()
    # How random samples are drawn when not uniform in ``range``: "attention_mask" (a tokenizer's
    # padding mask: ones for a prefix of seeded random length >= 1 along the last axis, then zeros).
    sample: str | None = None

    @property
    def is_integer(self) -> bool:
        return self.dtype in INTEGER_DTYPES

    def sample_range(self) -> tuple | None:
        """The declared range, the default one of an integer input, or None (standard normal, or bool)."""
        if self.range is not None:
            return self.range
        return defaults.INT_INPUT_RANGE if self.is_integer else None

    def canonical(self) -> dict:
        out = {"name": self.name, "shape": list(self.shape), "dtype": self.dtype}
        if self.range is not None:  # left out when undeclared: existing keys stay as they were
            out["range"] = list(self.range)
        if self.sample is not None:
            out["sample"] = self.sample
        if self.dims:
            out["dynamic"] = [{"axis": a, "min": lo, "max": hi, "name": n} for a, lo, hi, n in self.dims]
        return out


def dynamic_dims(inputs) -> dict:
    """name -> (min, max) of every dynamic dim of ``inputs`` (InputSpecs)."""
    return {n: (lo, hi) for item in inputs for _, lo, hi, n in item.dims}


def measured_sizes(lo: int, hi: int) -> list:
    """The sizes a dynamic dim is validated and benchmarked at: min, one interior size that is
    not a power of two (upstream bugs show away from the bounds), max."""
    if hi - lo < 2:
        return sorted({lo, hi})
    mid = (lo + hi) // 2
    while mid & (mid - 1) == 0 and mid + 1 < hi:  # a power of two: step off it
        mid += 1
    return [lo, mid, hi]


def default_range_note(model) -> str | None:
    """What a cell's outcome says when integer inputs of ``model`` were sampled in the default range."""
    unranged = [i for i in model.inputs if i.is_integer and i.range is None and i.sample is None]
    if not unranged:
        return None
    lo, hi = defaults.INT_INPUT_RANGE
    names = ", ".join(f"{i.name} ({i.dtype})" for i in unranged)
    return (
        f"integer input{'s' if len(unranged) > 1 else ''} {names} sampled in the default range "
        f"[{lo}, {hi}) (declare `range: [lo, hi]` under models.{model.name}.inputs)"
    )


class ModelKind(StrEnum):
    """Which stage builders a model's tasks run (the stage table names one per kind)."""

    MODULE = "module"  # an nn.Module: one export of each method, validated per output
    LLM = "llm"  # a decoder-only LLM: a static KV cache program, validated per decode step
    SEQ2SEQ = "seq2seq"  # an encoder-decoder (Whisper, T5): encoder + text_decoder methods, validated per step


@dataclass(frozen=True)
class ModelSpec:
    name: str
    source: dict  # {"python": ..., "file": rel path, "sha256": ...} or {"torchvision": ...}
    kwargs: dict
    weights: dict | None  # {"path": rel path, "sha256": ...}
    inputs: tuple
    calibration: dict | None  # {"npz"|"images": rel path, "sha256": digest, ...}; None: random
    validation: dict | None  # same form; the inputs the reference outputs are computed on
    task: str  # classification enables top-k agreement
    # ((method name, inputs), ...) in declaration order; default one method, forward, with ``inputs``
    # (``inputs`` is always the first method's).
    methods: tuple = ()
    kind: ModelKind = ModelKind.MODULE  # follows from the source (in the key through it)
    # Worker labels its tasks need (pipeline.yaml `labels`, e.g. mem64) and what this host lacks of
    # them (etforge.config.labels): routing, not content, so neither joins a key.
    labels: frozenset = frozenset()
    missing: str | None = None
    outputs: tuple = ()  # the outputs the app consumes (key paths or indices); (): every output
    # The files its resolution hashed (resolved names: code, weights, data): a task of this model
    # must find them unchanged once it ran, or its result was built from other content.
    reads: frozenset = field(default=frozenset(), compare=False, repr=False)

    @property
    def method_names(self) -> tuple:
        return tuple(m for m, _ in self.methods) or ("forward",)

    @property
    def multi_method(self) -> bool:
        return self.method_names != ("forward",)

    def canonical(self) -> dict:
        # The name is not part of the content: renaming a model reuses its cache.
        out = {
            "source": self.source,
            "kwargs": self.kwargs,
            "weights": self.weights,
            "inputs": [i.canonical() for i in self.inputs],
            "validation": self.validation,
            "task": self.task,
        }
        if self.multi_method:  # left out for forward alone: existing keys stay as they were
            out["methods"] = {m: [i.canonical() for i in inputs] for m, inputs in self.methods}
        if self.outputs:  # likewise: only a model that selects its outputs has the key
            out["outputs"] = list(self.outputs)
        return out


@dataclass(frozen=True)
class BackendMember:
    """One backend recipe with resolved options; a chain has several, in priority order."""

    recipe: str
    partitioner: str | None
    options: dict
    delegates: tuple
    host_runnable: bool
    missing: str | None  # what this host lacks to lower it, or None
    min_coverage: float | None = None  # the recipe's minimum delegation coverage; None: no delegate
    tools: dict = field(default_factory=dict)  # versions of its lowering tools (etforge.config.tools)
    runtime_tools: dict = field(default_factory=dict)  # versions of what runs its programs here
    dynamic_shapes: bool = False  # the recipe's `dynamic_shapes`: lowers torch.export dynamic dims
    # The rest of what its recipe says of it (recipes are the one home of a backend's facts):
    lowering: dict = field(default_factory=dict)  # {context: module:function, fresh_process: bool}
    llm: dict = field(default_factory=dict)  # {schemes, custom_ops, rejected, static_shapes}
    hf_tasks: dict = field(default_factory=dict)  # {measured, rejected: [{task, model_types, schemes, reason}]}
    manifest: dict = field(default_factory=dict)  # {description, platforms, rank}
    cmake_targets: dict = field(default_factory=dict)  # {source, wheel}: what an app links for its delegate
    # {runner, name[, proxy]}: what runs its programs here when the runtime cannot (runtime.validated_by)
    validated_by: dict = field(default_factory=dict)
    probe: str | None = None  # module:function saying what this host lacks to run its programs (runtime.probe)
    reproducible: bool | str | None = None  # True, why not, or None: not measured
    # Worker labels (etforge.config.labels) lowering and running its programs need: routing, not content.
    labels: frozenset = frozenset()
    runtime_labels: frozenset = frozenset()

    @property
    def description(self) -> str:
        """How the manifests name it: its recipe's manifest description, else its name."""
        return self.manifest.get("description") or self.recipe

    def canonical(self) -> dict:
        out = {
            "recipe": self.recipe,
            "partitioner": self.partitioner,
            "options": self.options,
            "delegates": list(self.delegates),
            "missing": self.missing,
            "tools": self.tools,
        }
        if self.lowering:  # how it is lowered changes the program (left out when plain: keys stay)
            out["lowering"] = self.lowering
        return out


@dataclass(frozen=True)
class BackendSpec:
    name: str
    members: tuple  # of BackendMember
    # The fraction of compute ops its delegates must take (etforge.builders.gates.gates delegation_gate):
    # gates.min_delegation_coverage in pipeline.yaml, else the highest of its members' recipes.
    # None: no member has a delegate (portable), so no gate.
    min_coverage: float | None = None

    @property
    def primary(self) -> BackendMember:
        return self.members[0]

    @property
    def delegates(self) -> tuple:
        return tuple(dict.fromkeys(d for m in self.members for d in m.delegates))

    @property
    def host_runnable(self) -> bool:
        return all(m.host_runnable for m in self.members)

    @property
    def missing(self) -> str | None:
        return next((f"{m.recipe}: {m.missing}" for m in self.members if m.missing), None)

    @property
    def validated_by(self) -> dict:
        """What runs its programs here when the runtime cannot: a one-recipe backend's
        ``runtime.validated_by`` (a chain has no single stand-in), else {}."""
        return dict(self.primary.validated_by) if len(self.members) == 1 and not self.host_runnable else {}

    @property
    def probe(self) -> str | None:
        """What measures this host's lack of a runtime for its programs (``runtime.probe``), or None."""
        return self.primary.probe if len(self.members) == 1 and not self.validated_here else None

    @property
    def validated_here(self) -> bool:
        """Its programs are checked on this host: in the runtime, or by what ``validated_by`` names."""
        return self.host_runnable or bool(self.validated_by)

    @property
    def runtime_tools(self) -> dict:
        return {name: v for m in self.members for name, v in m.runtime_tools.items()}

    @property
    def labels(self) -> frozenset:
        """Worker labels lowering it needs (etforge.config.labels)."""
        return frozenset().union(*(m.labels for m in self.members))

    @property
    def runtime_labels(self) -> frozenset:
        """Worker labels running its programs needs."""
        return frozenset().union(*(m.runtime_labels for m in self.members))

    def canonical(self) -> dict:
        return {"members": [m.canonical() for m in self.members]}


@dataclass(frozen=True)
class QuantSpec:
    name: str
    recipe: recipes.Recipe = field(repr=False, compare=False)
    options: dict

    @property
    def calibrated(self) -> bool:
        return bool(self.recipe.data.get("calibration"))


@dataclass(frozen=True)
class Transform:
    """How a cell's graph is quantized before lowering (shared by cells with equal keys)."""

    method: str  # pt2e | torchao | dtype
    ref: str  # dotted factory, or the dtype name
    options: dict
    calibrated: bool
    label: str  # names the quantize task; unique per distinct config of a model and scheme
    tools: dict = field(default_factory=dict)  # versions of the quantizer's tools (etforge.config.tools)
    # a weight-group scheme on this backend (its recipe's backends entry): the group multiple the
    # backend takes, and the config a layer no such group divides gets before float (layer_filter.py)
    group_multiple: int | None = None
    fallback: str | None = None

    def canonical(self) -> dict:  # the label only names the task: not part of the content
        out = {
            "method": self.method,
            "ref": self.ref,
            "options": self.options,
            "calibrated": self.calibrated,
            "tools": self.tools,
        }
        if self.group_multiple or self.fallback:  # (absent otherwise: other schemes' keys do not move)
            out.update(group_multiple=self.group_multiple, fallback=self.fallback)
        return out


@dataclass(frozen=True)
class Cell:
    model: ModelSpec
    backend: BackendSpec  # with the scheme's backend_options applied
    quant: QuantSpec
    thresholds: dict
    transform: Transform | None  # None: lower the captured fp32 graph as is
    # The scheme's size gate for this backend ({"weights", "max_ratio"[, "overhead_bytes"]},
    # etforge.builders.gates.gates size_gate); None when the scheme declares none (fp32).
    size_gate: dict | None = None
    # The CPU profiles besides this host whose runtime judges its program (etforge.config.targets
    # Target, from pipeline.yaml's targets or its backend recipes' runtime.targets); () for none.
    targets: tuple = ()

    @property
    def name(self) -> str:
        return f"{self.model.name}/{self.backend.name}/{self.quant.name}"

    @property
    def stem(self) -> str:
        return f"{self.model.name}_{self.backend.name}_{self.quant.name}"

    def canonical(self) -> dict:
        """One serialization feeds the cache key, manifests and report rows."""
        return {
            "model": self.model.name,
            "backend": self.backend.name,
            "quantization": self.quant.name,
            "thresholds": self.thresholds,
            "delegates": list(self.backend.delegates),
            "inputs": [i.canonical() for i in self.model.inputs],
        }


@dataclass(frozen=True)
class RejectedCell:
    """A combination of the matrix that etforge refuses to build, with the reason."""

    model: str
    backend: str
    quantization: str
    reason: str

    @property
    def name(self) -> str:
        return f"{self.model}/{self.backend}/{self.quantization}"


@dataclass(frozen=True)
class ExpectedFailure:
    """An entry of ``matrix.expected_failures``: cells known to fail, with why and where it is tracked.

    A dimension left out (None) matches every value of it, as in ``exclude``.
    """

    model: str | None
    backend: str | None
    quantization: str | None
    reason: str
    link: str
    where: str  # "pipeline.yaml:31: matrix.expected_failures[0]", for messages

    def matches(self, cell: Cell) -> bool:
        return all(
            want is None or want == cell_dim(cell, dim)
            for dim, want in (("model", self.model), ("backend", self.backend), ("quantization", self.quantization))
        )


@dataclass(frozen=True)
class PlanFile:
    """The pipeline file a plan was resolved from."""

    path: Path
    display: str  # the file as errors name it
    section_lines: dict  # matrix dimension -> line of its section in the file
    sha256: str = ""  # of the bytes the plan was resolved from (a release's provenance names it)


@dataclass(frozen=True)
class Storage:
    """Where a run's outputs go besides the working tree."""

    remote: str | None = None  # fsspec URL of the shared cache
    read_only: bool = False
    allow_outside: bool = False  # `artifacts: {allow_outside: true}`: follow links out of the project


@dataclass(frozen=True)
class Benchmarking:
    """How cells are timed and against what."""

    options: dict  # the builder's options (etforge.builders.bench.benchmark), every default filled in
    baseline: str | None = None  # a results file to flag regressions against (relative to root)
    regression_pct: float = 0.0  # slower than the baseline by more than this is flagged


@dataclass(frozen=True)
class PlanCode:
    """Digests of the code that keys cover: etforge's own, and the project's that its recipes name by
    dotted path (a partitioner, a quantizer)."""

    etforge: CodeDigests
    project: CodeDigests | None = None


@dataclass(frozen=True)
class Plan:
    source: PlanFile
    root: Path
    name: str
    version: str
    models: dict
    backends: dict
    quantizations: dict
    cells: tuple
    rejected: tuple  # of RejectedCell
    gates: dict
    storage: Storage
    benchmark: Benchmarking
    seed: int
    toolchain: dict
    code: PlanCode = field(repr=False, compare=False)
    manifests: dict = field(default_factory=dict)  # the `manifests:` section (etforge.config.manifest_options)
    recipe_path: recipes.RecipePath = field(default_factory=recipes.RecipePath)  # a project's recipes/ first
    expected_failures: tuple = ()  # of ExpectedFailure; never part of a key (they change no output)
    diff: dict = field(default_factory=dict)  # `diff:` tolerances, every default filled in (etforge diff)
    # Values derived from this plan and nothing else (task keys), computed once per process.
    memo: dict = field(default_factory=dict, repr=False, compare=False)

    def expected_failure(self, cell: Cell) -> ExpectedFailure | None:
        """The first ``matrix.expected_failures`` entry that names ``cell``, or None."""
        return next((e for e in self.expected_failures if e.matches(cell)), None)

    def fp32_sibling(self, cell: Cell) -> Cell | None:
        """The same model and backend in fp32, for the size gate of a cell whose scheme declares one
        (looked up in an index of the plan's fp32 cells, made once: planning stays linear in cells)."""
        if cell.size_gate is None:
            return None
        index = self.memo.get("fp32_cells")
        if index is None:
            index = self.memo["fp32_cells"] = {
                (c.model.name, c.backend.name): c
                for c in reversed(self.cells)
                if c.transform is None and c.quant.name == "fp32"
            }
        return index.get((cell.model.name, cell.backend.name))


def cell_dim(cell: Cell, dim: str) -> str:
    return {"model": cell.model.name, "backend": cell.backend.name, "quantization": cell.quant.name}[dim]
