"""Resolve ``pipeline.yaml`` into an immutable plan of cells.

Everything downstream (task dicts, cache keys, summaries, manifests) reads the
plan, never the raw YAML. This module must not import torch or executorch.
"""

from __future__ import annotations

import itertools
import os
from dataclasses import dataclass, field, replace
from pathlib import Path

from tasks.config import recipes
from tasks.config import schema
from tasks.config.code_deps import ImportGraph
from tasks.core.errors import PipelineError
from tasks.config.requirements import missing_requirement
from tasks.config.digest_cache import DigestCache
from tasks.core.digest import digest
from tasks.config.tools import ToolVersions, stage_tools, toolchain_versions
from tasks.config.yamlfile import LoadedYaml, format_path, load_yaml

PACKAGE_DIR = Path(__file__).resolve().parent.parent
# Modules whose code runs inside each kind of task: editing them changes keys.
BUILDER_MODULES = {
    "capture": ("build/model_loading.py", "build/torchvision_compat.py", "build/capture.py", "build/samples.py"),
    "quantize": ("build/quantize.py", "build/quantizers.py", "build/samples.py", "build/model_loading.py"),
    "export": ("build/lower.py", "build/partitioners.py", "build/coreml_reproducible.py"),
    "validate": ("build/validate.py", "build/numerics.py", "build/divergence.py", "build/bundle.py"),
    "benchmark": ("build/benchmark.py", "config/machine.py"),
}
# Small enough that `doit` benchmarks every host-runnable cell in seconds.
DEFAULT_BENCHMARK = {"warmup": 5, "iterations": 50, "threads": None, "max_seconds": 10.0, "regression_pct": 10.0}
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp")
MAX_INPUT_ELEMENTS = 1 << 26  # 64 Mi elements: far beyond any on-device input
DTYPES_DEFAULT = "float32"
# Matrix dimension -> the pipeline.yaml section that declares its names.
SECTIONS = {"model": "models", "backend": "backends", "quantization": "quantization"}


@dataclass(frozen=True)
class InputSpec:
    name: str
    shape: tuple
    dtype: str

    def canonical(self) -> dict:
        return {"name": self.name, "shape": list(self.shape), "dtype": self.dtype}


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

    def canonical(self) -> dict:
        # The name is not part of the content: renaming a model reuses its cache.
        return {"source": self.source, "kwargs": self.kwargs, "weights": self.weights,
                "inputs": [i.canonical() for i in self.inputs], "validation": self.validation,
                "task": self.task}


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
    tools: dict = field(default_factory=dict)  # versions of its lowering tools (tasks/tools.py)
    runtime_tools: dict = field(default_factory=dict)  # versions of what runs its programs here

    def canonical(self) -> dict:
        return {"recipe": self.recipe, "partitioner": self.partitioner, "options": self.options,
                "delegates": list(self.delegates), "missing": self.missing, "tools": self.tools}


@dataclass(frozen=True)
class BackendSpec:
    name: str
    members: tuple  # of BackendMember
    # The fraction of compute ops its delegates must take (tasks/export.py delegation_gate):
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
    def runtime_tools(self) -> dict:
        return {name: v for m in self.members for name, v in m.runtime_tools.items()}

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
    tools: dict = field(default_factory=dict)  # versions of the quantizer's tools (tasks/tools.py)

    def canonical(self) -> dict:  # the label only names the task: not part of the content
        return {"method": self.method, "ref": self.ref, "options": self.options, "calibrated": self.calibrated,
                "tools": self.tools}


@dataclass(frozen=True)
class Cell:
    model: ModelSpec
    backend: BackendSpec  # with the scheme's backend_options applied
    quant: QuantSpec
    thresholds: dict
    transform: Transform | None  # None: lower the captured fp32 graph as is
    # The scheme's size gate for this backend ({"weights", "max_ratio"[, "overhead_bytes"]},
    # tasks/export.py size_gate); None when the scheme declares none (fp32).
    size_gate: dict | None = None

    @property
    def name(self) -> str:
        return f"{self.model.name}/{self.backend.name}/{self.quant.name}"

    @property
    def stem(self) -> str:
        return f"{self.model.name}_{self.backend.name}_{self.quant.name}"

    def canonical(self) -> dict:
        """One serialization feeds the cache key, manifests and report rows."""
        return {"model": self.model.name, "backend": self.backend.name,
                "quantization": self.quant.name, "thresholds": self.thresholds,
                "delegates": list(self.backend.delegates),
                "inputs": [i.canonical() for i in self.model.inputs]}


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
        return all(want is None or want == _cell_dim(cell, dim) for dim, want in
                   (("model", self.model), ("backend", self.backend), ("quantization", self.quantization)))


@dataclass(frozen=True)
class Plan:
    file: Path
    display: str  # the file as errors name it
    section_lines: dict  # matrix dimension -> line of its section in the file
    root: Path
    name: str
    version: str
    models: dict
    backends: dict
    quantizations: dict
    cells: tuple
    rejected: tuple  # of RejectedCell
    gates: dict
    cache_remote: str | None  # fsspec URL of the shared cache
    cache_read_only: bool
    benchmark: dict  # options of tasks/benchmark.py, plus baseline (path) and regression_pct
    seed: int
    toolchain: dict
    code_digests: dict = field(repr=False)
    manifests: dict = field(default_factory=dict)  # the `manifests:` section, read by tasks/manifest.py
    artifacts_allow_outside: bool = False  # `artifacts: {allow_outside: true}`: follow links out of the project
    expected_failures: tuple = ()  # of ExpectedFailure; never part of a key (they change no output)

    @property
    def artifacts_dir(self) -> Path:
        return self.root / "artifacts"

    @property
    def out_dir(self) -> Path:
        return self.artifacts_dir / self.name

    @property
    def cache_dir(self) -> Path:
        return self.artifacts_dir / "cache"

    @property
    def state_dir(self) -> Path:
        return self.out_dir / ".state"

    def cell_dir(self, cell: Cell) -> Path:
        return self.out_dir / cell.model.name

    def pte_path(self, cell: Cell) -> Path:
        return self.cell_dir(cell) / f"{cell.stem}.pte"

    def export_info_path(self, cell: Cell) -> Path:
        return self.cell_dir(cell) / f"{cell.stem}.export.json"

    def numerics_path(self, cell: Cell) -> Path:
        return self.cell_dir(cell) / f"{cell.stem}.numerics.json"

    def bundled_path(self, cell: Cell) -> Path:
        return self.cell_dir(cell) / f"{cell.stem}.bpte"

    def bundled_info_path(self, cell: Cell) -> Path:
        return self.cell_dir(cell) / f"{cell.stem}.bundled.json"

    def bench_path(self, cell: Cell) -> Path:
        return self.cell_dir(cell) / f"{cell.stem}.bench.json"

    @property
    def report_path(self) -> Path:
        return self.out_dir / "report.html"

    def log_path(self, task_name: str) -> Path:
        return self.out_dir / "logs" / (task_name.replace(":", "__").replace("/", "__") + ".log")

    # Cache keys: everything that can change a task's output, nothing else.
    def capture_key(self, model: ModelSpec) -> str:
        return digest({"task": "capture", "model": model.canonical(), "seed": self.seed,
                       "toolchain": self.toolchain, "code": self.code_digests["capture"]})

    def quantize_key(self, cell: Cell) -> str | None:
        if cell.transform is None:
            return None
        return digest({"task": "quantize", "capture": self.capture_key(cell.model),
                       "transform": cell.transform.canonical(),
                       "calibration": cell.model.calibration if cell.transform.calibrated else None,
                       "toolchain": self.toolchain, "code": self.code_digests["quantize"]})

    def graph_key(self, cell: Cell) -> str:
        """The key of the graph this cell lowers: quantized, or the fp32 capture."""
        return self.quantize_key(cell) or self.capture_key(cell.model)

    def fp32_sibling(self, cell: Cell) -> Cell | None:
        """The same model and backend in fp32, for the size gate of a cell whose scheme declares one."""
        if cell.size_gate is None:
            return None
        return next((c for c in self.cells if c.transform is None and c.model.name == cell.model.name
                     and c.backend.name == cell.backend.name and c.quant.name == "fp32"), None)

    def export_key(self, cell: Cell) -> str:
        return digest({"task": "export", "graph": self.graph_key(cell),
                       "backend": cell.backend.canonical(),
                       "min_coverage": cell.backend.min_coverage,
                       "toolchain": self.toolchain, "code": self.code_digests["export"]})

    def size_gate_key(self, cell: Cell, sibling: Cell) -> str:
        return digest({"task": "size-gate", "export": self.export_key(cell), "fp32": self.export_key(sibling),
                       "capture": self.capture_key(cell.model), "gate": cell.size_gate,
                       "code": self.code_digests["export"]})

    def validate_key(self, cell: Cell) -> str:
        # Only a cell that runs here uses its runtime tools; the others get a .bpte.
        runtime = cell.backend.runtime_tools if cell.backend.host_runnable else {}
        return digest({"task": "validate", "export": self.export_key(cell),
                       "capture": self.capture_key(cell.model), "thresholds": cell.thresholds,
                       "host_runnable": cell.backend.host_runnable, "runtime_tools": runtime,
                       "toolchain": self.toolchain, "code": self.code_digests["validate"]})

    def expected_failure(self, cell: Cell) -> ExpectedFailure | None:
        """The first ``matrix.expected_failures`` entry that names ``cell``, or None."""
        return next((e for e in self.expected_failures if e.matches(cell)), None)

    def shard(self, cells: tuple, spec: str) -> tuple:
        """Cells of shard ``k/n`` (1-based): a stable split by cell name, the same on every machine."""
        try:
            k, n = (int(x) for x in spec.split("/"))
            if not 1 <= k <= n:
                raise ValueError
        except ValueError:
            raise PipelineError(f"shard={spec!r} on the command line: expected k/n with 1 <= k <= n, e.g. 2/4",
                                file=self.display) from None
        return tuple(c for c in cells if int(digest(c.name)[:8], 16) % n == k - 1)

    def benchmark_key(self, cell: Cell, host: dict) -> str:
        options = {k: v for k, v in self.benchmark.items() if k not in ("baseline", "regression_pct")}
        return digest({"task": "benchmark", "export": self.export_key(cell), "capture": self.capture_key(cell.model),
                       "options": options, "host": host, "runtime_tools": cell.backend.runtime_tools,
                       "code": self.code_digests["benchmark"]})

    def select(self, model=None, backend=None, quantization=None) -> tuple:
        """Cells matching comma-separated name lists (None matches all)."""
        wanted = {"model": model, "backend": backend, "quantization": quantization}
        known = {"model": self.models, "backend": self.backends, "quantization": self.quantizations}
        filters = {}
        for dim, value in wanted.items():
            if not value:
                continue
            names = [v.strip() for v in value.split(",") if v.strip()]
            for n in names:
                if n not in known[dim]:
                    raise PipelineError(f"unknown {dim} {n!r} on the command line; "
                                        f"known: {', '.join(known[dim])}", file=self.display,
                                        line=self.section_lines[dim], key=SECTIONS[dim])
            filters[dim] = set(names)
        return tuple(c for c in self.cells
                     if all(_cell_dim(c, d) in names for d, names in filters.items()))


def _cell_dim(cell: Cell, dim: str) -> str:
    return {"model": cell.model.name, "backend": cell.backend.name,
            "quantization": cell.quant.name}[dim]


def scheme_size_gate(quant: QuantSpec, backend: BackendSpec) -> dict | None:
    """The scheme's size gate for this backend: its entry for the backend's primary recipe, else the recipe's."""
    table = quant.recipe.data.get("backends") or {}
    entry = table.get(backend.primary.recipe, table.get("*")) or {}
    return entry.get("size_gate", quant.recipe.data.get("size_gate"))


def _merge_thresholds(*layers) -> dict:
    out: dict = {}
    for layer in layers:
        out.update(layer or {})
    return out


class _Resolver:
    def __init__(self, doc: LoadedYaml, root: Path, digests: DigestCache, versions: ToolVersions):
        self.doc = doc
        self.data = doc.data
        self.root = root
        self.digests = digests
        self.versions = versions
        self.imports = ImportGraph(root, digests)  # parses a project file once, memoised by content

    def inside_root(self, rel: str, path: tuple) -> Path:
        full = (self.root / rel).resolve()
        try:
            full.relative_to(self.root.resolve())
        except ValueError:
            raise self.doc.error(path, f"{rel!r} resolves outside the project directory") from None
        return full

    def file_digest(self, full: Path, path: tuple) -> str:
        try:
            return self.digests.file_digest(full)
        except OSError as exc:
            raise self.doc.error(path, f"cannot read {self.rel(full)}: {exc.strerror}") from None

    def rel(self, full: Path) -> str:
        return full.relative_to(self.root.resolve()).as_posix()

    def factory_file(self, ref: str, path: tuple) -> Path:
        module = ref.split(":")[0]
        base = self.root.joinpath(*module.split("."))
        for candidate in (base.with_suffix(".py"), base / "__init__.py"):
            if candidate.is_file():
                return self.inside_root(candidate.relative_to(self.root).as_posix(), path)
        raise self.doc.error(path, f"module {module!r} not found in the project "
                                   f"(looked for {module.replace('.', '/')}.py)")

    def model(self, name: str, spec: dict) -> ModelSpec:
        path = ("models", name)
        if "python" in spec:
            file = self.factory_file(spec["python"], path + ("python",))
            source = {"python": spec["python"], "file": self.rel(file),
                      "sha256": self.file_digest(file, path + ("python",)),
                      # every project module the factory imports, directly or not (tasks/code_deps.py)
                      "modules": {self.rel(f): self.file_digest(f, path + ("python",))
                                  for f in sorted(self.imports.reach([file])) if f != file}}
            if spec.get("packages"):
                source["packages"] = self.package_versions(spec["packages"], path + ("packages",))
        else:
            source = {"torchvision": spec["torchvision"], "bn_recalibration": 1}
        weights = None
        if "weights" in spec:
            wpath = path + ("weights", "path")
            full = self.inside_root(spec["weights"]["path"], wpath)
            if not full.is_file():
                raise self.doc.error(wpath, f"weights file {spec['weights']['path']!r} not found")
            actual = self.file_digest(full, wpath)
            if actual != spec["weights"]["sha256"]:
                raise self.doc.error(path + ("weights", "sha256"),
                                     f"weights file sha256 is {actual}, pipeline pins {spec['weights']['sha256']}")
            weights = {"path": self.rel(full), "sha256": actual}
        inputs = []
        for i, item in enumerate(spec["inputs"]):
            shape = tuple(item["shape"])
            elements = 1
            for d in shape:
                elements *= d
            if elements > MAX_INPUT_ELEMENTS:
                raise self.doc.error(path + ("inputs", i, "shape"),
                                     f"expected at most {MAX_INPUT_ELEMENTS} elements in total, got {elements}")
            inputs.append(InputSpec(item.get("name", f"input_{i}"), shape, item.get("dtype", DTYPES_DEFAULT)))
        return ModelSpec(name=name, source=source, kwargs=spec.get("kwargs") or {},
                         weights=weights, inputs=tuple(inputs),
                         calibration=self.calibration(spec.get("calibration"), path + ("calibration",)),
                         validation=self.calibration(spec.get("validation"), path + ("validation",)),
                         task=spec.get("task", "other"))

    def package_versions(self, names: list, path: tuple) -> dict:
        versions = {}
        for i, name in enumerate(names):
            versions[name] = self.versions.distribution(name)
            if versions[name] is None:
                raise self.doc.error(path + (i,), f"package {name!r} is not installed (pip install {name})")
        return versions

    def calibration(self, spec: dict | None, path: tuple) -> dict | None:
        if spec is None:
            return None
        kind = "npz" if "npz" in spec else "images"
        full = self.inside_root(spec[kind], path + (kind,))
        if kind == "npz":
            if not full.is_file():
                raise self.doc.error(path + (kind,), f"{path[-1]} file {spec[kind]!r} not found")
            content = self.file_digest(full, path + (kind,))
        else:
            if not full.is_dir():
                raise self.doc.error(path + (kind,), f"{path[-1]} folder {spec[kind]!r} not found")
            images = sorted(p for p in full.rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES and p.is_file())
            if not images:
                raise self.doc.error(path + (kind,), f"no images ({', '.join(IMAGE_SUFFIXES)}) in {spec[kind]!r}")
            content = digest({self.rel(p): self.file_digest(p, path + (kind,)) for p in images})
        return {**spec, kind: self.rel(full), "sha256": content}

    def member(self, recipe_name: str, options: dict, path: tuple) -> BackendMember:
        recipe = recipes.load_recipe("backend", recipe_name)
        if recipe is None:
            raise self.doc.error(path, recipes.unknown_recipe_message("backend", recipe_name))
        for opt_path, message in recipes.check_options(recipe, options):
            raise self.doc.error(path[:2] + opt_path, message)
        runtime = recipe.data.get("runtime") or {}
        delegates = tuple(runtime.get("delegates", ()))
        return BackendMember(recipe=recipe_name, partitioner=recipe.data.get("partitioner"),
                             options={**recipe.defaults(), **options},
                             delegates=delegates,
                             host_runnable=bool(runtime.get("host_runnable", False)),
                             missing=missing_requirement(recipe.data.get("needs")),
                             min_coverage=recipe.data.get("min_delegation_coverage") if delegates else None,
                             tools=self.versions.versions(stage_tools(recipe.data, "lowering")),
                             runtime_tools=self.versions.versions(stage_tools(recipe.data, "runtime")))

    def min_coverage(self, name: str, members: list) -> float | None:
        """gates.min_delegation_coverage.<name>, else the strictest member recipe's minimum."""
        override = ((self.data.get("gates") or {}).get("min_delegation_coverage") or {}).get(name)
        minimums = [m.min_coverage for m in members if m.min_coverage is not None]
        if not minimums:
            if override is not None:
                raise self.doc.error(("gates", "min_delegation_coverage", name),
                                     f"backend {name!r} has no delegate (its programs run on portable "
                                     "kernels), so it has no coverage to gate")
            return None
        return override if override is not None else max(minimums)

    def backend(self, name: str, spec: dict) -> BackendSpec:
        if "chain" in spec:
            if set(spec) - {"chain"}:
                raise self.doc.error(("backends", name), "a chain takes no options of its own; "
                                                         "set them on the backends it names")
            declared = self.data["backends"]
            members = []
            for i, link in enumerate(spec["chain"]):
                if "chain" in declared.get(link, {}):
                    raise self.doc.error(("backends", name, "chain", i), f"{link!r} is itself a chain")
                link_spec = declared.get(link, {})  # a declared backend lends its options
                recipe_name = link_spec.get("recipe", link)
                options = {k: v for k, v in link_spec.items() if k != "recipe"}
                members.append(self.member(recipe_name, options, ("backends", name, "chain", i)))
            return BackendSpec(name=name, members=tuple(members), min_coverage=self.min_coverage(name, members))
        key = ("backends", name, "recipe") if "recipe" in spec else ("backends", name)
        options = {k: v for k, v in spec.items() if k != "recipe"}
        members = [self.member(spec.get("recipe", name), options, key)]
        return BackendSpec(name=name, members=tuple(members), min_coverage=self.min_coverage(name, members))

    def quantization(self, index: int, name: str) -> tuple[QuantSpec, dict]:
        recipe = recipes.load_recipe("quantization", name)
        if recipe is None:
            raise self.doc.error(("quantization", index), recipes.unknown_recipe_message("quantization", name))
        options = (self.data.get("quantization_options") or {}).get(name, {})
        for opt_path, message in recipes.check_options(recipe, options):
            raise self.doc.error(("quantization_options", name) + opt_path, message)
        return (QuantSpec(name=name, recipe=recipe, options={**recipe.defaults(), **options}),
                recipe.data.get("thresholds") or {})

    def apply_scheme(self, backend: BackendSpec, quant: QuantSpec) -> tuple:
        """(backend with the scheme's options, transform) or (None, reason) when refused."""
        table = quant.recipe.data.get("backends") or {}
        entries = [table.get(m.recipe, table.get("*")) for m in backend.members]
        primary = entries[0]
        primary_name = backend.primary.recipe if backend.primary.recipe in table else "*"
        if primary is None:
            usable = ", ".join(sorted(k for k, v in table.items() if "rejected" not in v)) or "none"
            return None, f"{quant.name} is not available for {backend.primary.recipe} (available for: {usable})"
        if "rejected" in primary:
            return None, primary["rejected"]
        members = []
        for member, entry in zip(backend.members, entries):
            overrides = (entry or {}).get("backend_options") or {}
            members.append(replace(member, options={**member.options, **overrides}) if overrides else member)
        transform = None
        options = quant.options
        if primary.get("with_backend_options"):  # e.g. an Ethos-U quantizer needs the target
            options = {**members[0].options, **quant.options}
        for method in ("pt2e", "torchao", "dtype"):
            if method in primary:
                label = primary[method].split(":")[-1]
                if primary.get("with_backend_options"):  # one graph per backend configuration
                    label += f"-{backend.name}"
                tools = self.versions.versions(stage_tools(quant.recipe.data, "quantize", primary_name))
                transform = Transform(method=method, ref=primary[method], options=options,
                                      calibrated=quant.calibrated and method == "pt2e", label=label, tools=tools)
        return replace(backend, members=tuple(members)), transform

    def check_pattern(self, pattern: dict, path: tuple, known: dict) -> None:
        for dim, names in known.items():
            if dim in pattern and pattern[dim] not in names:
                raise self.doc.error(path + (dim,), f"{dim} {pattern[dim]!r} is not declared in "
                                                    f"'{SECTIONS[dim]}'; declared: {', '.join(names)}")

    def cells(self, models, backends, quants, quant_thresholds) -> tuple:
        matrix = self.data.get("matrix") or {}
        known = {"model": list(models), "backend": list(backends), "quantization": list(quants)}
        for kind in ("exclude", "include"):
            for i, pattern in enumerate(matrix.get(kind, [])):
                self.check_pattern(pattern, ("matrix", kind, i), known)
        combos = list(itertools.product(models, backends, quants)) if matrix.get("product", True) else []

        def matches(pattern, combo):
            return all(pattern.get(dim) in (None, value) for dim, value in zip(known, combo))

        combos = [c for c in combos if not any(matches(p, c) for p in matrix.get("exclude", []))]
        for pattern in matrix.get("include", []):  # after exclude, as in CI matrices
            for combo in itertools.product(*(([pattern[d]] if d in pattern else known[d]) for d in known)):
                if combo not in combos:
                    combos.append(combo)
        if not combos:
            raise self.doc.error(("matrix",) if "matrix" in self.data else (),
                                 "the matrix is empty after include/exclude")
        order = {d: {n: i for i, n in enumerate(known[d])} for d in known}
        combos.sort(key=lambda c: tuple(order[d][v] for d, v in zip(known, c)))
        global_thresholds = self.data.get("thresholds") or {}
        model_thresholds = {m: (self.data["models"][m].get("thresholds") or {}) for m in models}
        explicit = [p for p in matrix.get("include", []) if len(p) == 3]
        cells, rejected = [], []
        for m, b, q in combos:
            backend, transform = self.apply_scheme(backends[b], quants[q])
            if backend is None:
                # Refused before any export runs: an explicit include is a mistake in the
                # file; a combination that only came from the product is reported.
                for i, p in enumerate(matrix.get("include", [])):
                    if p in explicit and (p["model"], p["backend"], p["quantization"]) == (m, b, q):
                        raise self.doc.error(("matrix", "include", i), f"{m}/{b}/{q} is refused: {transform}")
                rejected.append(RejectedCell(m, b, q, transform))
                continue
            cells.append(Cell(model=models[m], backend=backend, quant=quants[q], transform=transform,
                              size_gate=scheme_size_gate(quants[q], backends[b]),
                              thresholds=_merge_thresholds(quant_thresholds[q], global_thresholds.get(q),
                                                           model_thresholds[m].get(q))))
        if not cells:
            raise self.doc.error(("quantization",), "every cell of the matrix is refused: "
                                 + "; ".join(f"{r.name}: {r.reason}" for r in rejected[:3]))
        return tuple(cells), tuple(rejected)

    def check_scheme_options(self, quant_names) -> None:
        """quantization_options only for schemes the pipeline lists: a typo must not go unnoticed."""
        for name in self.data.get("quantization_options") or {}:
            if name not in quant_names:
                raise self.doc.error(("quantization_options", name),
                                     f"options for {name!r}, which is not in 'quantization' "
                                     f"({', '.join(quant_names)})")

    def check_backend_options(self, cells, rejected) -> None:
        """Options (and coverage overrides) only for backends a cell uses, directly or as a link of
        a chain that a cell uses; rejected cells count, since they are reported."""
        declared = self.data["backends"]
        used = {c.backend.name for c in cells} | {r.backend for r in rejected}
        used |= {link for name in list(used) for link in declared.get(name, {}).get("chain", [])}
        why = "which no cell of the matrix uses (neither directly nor in a chain that a cell uses)"
        for name, spec in declared.items():
            options = [k for k in spec if k not in ("recipe", "chain")]
            if options and name not in used:
                raise self.doc.error(("backends", name, options[0]), f"options for backend {name!r}, {why}")
        for name in (self.data.get("gates") or {}).get("min_delegation_coverage") or {}:
            path = ("gates", "min_delegation_coverage", name)
            if name not in declared:
                raise self.doc.error(path, f"backend {name!r} is not declared in 'backends'; "
                                           f"declared: {', '.join(declared)}")
            if name not in used:
                raise self.doc.error(path, f"a coverage minimum for backend {name!r}, {why}")
    def expected_failures(self, cells: tuple, rejected: tuple, known: dict) -> tuple:
        """``matrix.expected_failures``; an entry that names no buildable cell is a mistake."""
        entries = []
        for i, spec in enumerate((self.data.get("matrix") or {}).get("expected_failures", [])):
            path = ("matrix", "expected_failures", i)
            self.check_pattern(spec, path, known)
            line = self.doc.line_of(path)
            entry = ExpectedFailure(model=spec.get("model"), backend=spec.get("backend"),
                                    quantization=spec.get("quantization"), reason=" ".join(spec["reason"].split()),
                                    link=spec["link"], where=f"{self.doc.file}:{line}: {format_path(path)}")
            if not any(entry.matches(c) for c in cells):
                refused = [r.name for r in rejected if all(
                    getattr(entry, d) in (None, v) for d, v in
                    (("model", r.model), ("backend", r.backend), ("quantization", r.quantization)))]
                raise self.doc.error(path, "names no cell of the matrix" + (
                    f" (only refused combinations, which never build: {', '.join(refused[:3])})"
                    if refused else "") + "; remove the entry")
            entries.append(entry)
        return tuple(entries)

    def check_threshold_keys(self, quant_names) -> None:
        sections = [("thresholds",)] + [("models", m, "thresholds") for m in self.data["models"]]
        for section in sections:
            node = self.data
            for part in section:
                node = node.get(part) or {}
            for q in node:
                if q not in quant_names:
                    raise self.doc.error(section + (q,), f"thresholds for {q!r}, which is not in "
                                                         f"'quantization' ({', '.join(quant_names)})")


def digest_cache_for(pipeline_file: Path) -> DigestCache:
    """The file-digest memo of the project that ``pipeline_file`` belongs to."""
    return DigestCache(Path(pipeline_file).absolute().parent / "artifacts" / ".etforge" / "digests.json")


def resolve(pipeline_file: Path, digests: DigestCache | None = None) -> Plan:
    """Load, validate and resolve ``pipeline_file``; raise PipelineError on any mistake.

    With ``digests`` given, the caller saves the memo (after its own checks pass).
    """
    pipeline_file = Path(pipeline_file).absolute()
    root = pipeline_file.parent
    doc = load_yaml(pipeline_file, display_name=_display(pipeline_file))
    schema.validate(doc, "pipeline.schema.json")
    own_digests = digests is None
    if own_digests:
        digests = digest_cache_for(pipeline_file)
    versions = ToolVersions()  # one metadata lookup per distribution for this resolution
    r = _Resolver(doc, root, digests, versions)
    data = doc.data
    models = {name: r.model(name, spec) for name, spec in data["models"].items()}
    backends = {name: r.backend(name, spec) for name, spec in data["backends"].items()}
    quants, quant_thresholds = {}, {}
    for i, name in enumerate(data["quantization"]):
        quants[name], quant_thresholds[name] = r.quantization(i, name)
    r.check_threshold_keys(list(quants))
    r.check_scheme_options(list(quants))
    cells, rejected = r.cells(models, backends, quants, quant_thresholds)
    r.check_backend_options(cells, rejected)
    expected_failures = r.expected_failures(
        cells, rejected, {"model": list(models), "backend": list(backends), "quantization": list(quants)})
    from tasks.publish.manifests.context import check_options  # a local import: tasks.publish.manifests.context imports this module

    for path, message in check_options(data.get("manifests"), list(backends), recipes.available("backend"),
                                       list(quants)):
        raise doc.error(("manifests",) + path, message)
    code_digests = {kind: digest({f: digests.file_digest(PACKAGE_DIR / f) for f in files})
                    for kind, files in BUILDER_MODULES.items()}
    if own_digests:
        digests.save()
    return Plan(file=pipeline_file, display=doc.file,
                section_lines={dim: doc.line_of((section,)) for dim, section in SECTIONS.items()},
                root=root, name=data["name"], version=data.get("version", "0.0.0"),
                models=models, backends=backends, quantizations=quants, cells=cells, rejected=rejected,
                gates=data.get("gates") or {},
                cache_remote=_remote_url(os.environ.get("ETFORGE_CACHE_REMOTE")
                                         or (data.get("cache") or {}).get("remote"), root),
                cache_read_only=_env_flag("ETFORGE_CACHE_READ_ONLY", (data.get("cache") or {}).get("read_only", False)),
                benchmark={**DEFAULT_BENCHMARK, **(data.get("benchmark") or {})},
                seed=(data.get("validation") or {}).get("seed", 0),
                toolchain=toolchain_versions(versions.distribution), code_digests=code_digests,
                manifests=data.get("manifests") or {}, expected_failures=expected_failures,
                artifacts_allow_outside=(data.get("artifacts") or {}).get("allow_outside", False))


def _remote_url(url: str | None, root: Path) -> str | None:
    """A relative directory is taken from the project directory, like every other path."""
    if not url or "://" in url or os.path.isabs(url):
        return url
    return str(root / url)


def _env_flag(name: str, default: bool) -> bool:
    value = os.environ.get(name)
    return default if value is None else value.strip().lower() in ("1", "true", "yes", "on")


def _display(path: Path) -> str:
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)
