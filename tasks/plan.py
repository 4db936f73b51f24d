"""Resolve ``pipeline.yaml`` into an immutable plan of cells.

Everything downstream (task dicts, cache keys, summaries, manifests) reads the
plan, never the raw YAML. This module must not import torch or executorch.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from pathlib import Path

from tasks import recipes, schema
from tasks.errors import PipelineError
from tasks.keys import DigestCache, digest, toolchain_versions
from tasks.yamlfile import LoadedYaml, load_yaml

PACKAGE_DIR = Path(__file__).resolve().parent
# Modules whose code runs inside each kind of task: editing them changes keys.
BUILDER_MODULES = {
    "capture": ("model_loading.py", "torchvision_compat.py", "capture.py"),
    "export": ("export.py", "partitioners.py"),
    "validate": ("validate.py", "numerics.py"),
}
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

    def canonical(self) -> dict:
        # The name is not part of the content: renaming a model reuses its cache.
        return {"source": self.source, "kwargs": self.kwargs, "weights": self.weights,
                "inputs": [i.canonical() for i in self.inputs]}


@dataclass(frozen=True)
class BackendSpec:
    name: str
    recipe: str
    partitioner: str | None
    options: dict
    delegates: tuple
    host_runnable: bool

    def canonical(self) -> dict:
        return {"recipe": self.recipe, "partitioner": self.partitioner,
                "options": self.options, "delegates": list(self.delegates)}


@dataclass(frozen=True)
class QuantSpec:
    name: str
    quantizer: str | None

    def canonical(self) -> dict:
        return {"recipe": self.name, "quantizer": self.quantizer}


@dataclass(frozen=True)
class Cell:
    model: ModelSpec
    backend: BackendSpec
    quant: QuantSpec
    thresholds: dict

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
    seed: int
    toolchain: dict
    code_digests: dict = field(repr=False)

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

    def log_path(self, task_name: str) -> Path:
        return self.out_dir / "logs" / (task_name.replace(":", "__").replace("/", "__") + ".log")

    # Cache keys: everything that can change a task's output, nothing else.
    def capture_key(self, model: ModelSpec) -> str:
        return digest({"task": "capture", "model": model.canonical(), "seed": self.seed,
                       "toolchain": self.toolchain, "code": self.code_digests["capture"]})

    def export_key(self, cell: Cell) -> str:
        return digest({"task": "export", "capture": self.capture_key(cell.model),
                       "backend": cell.backend.canonical(), "quantization": cell.quant.canonical(),
                       "toolchain": self.toolchain, "code": self.code_digests["export"]})

    def validate_key(self, cell: Cell) -> str:
        return digest({"task": "validate", "export": self.export_key(cell),
                       "capture": self.capture_key(cell.model), "thresholds": cell.thresholds,
                       "host_runnable": cell.backend.host_runnable,
                       "toolchain": self.toolchain, "code": self.code_digests["validate"]})

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


def _merge_thresholds(*layers) -> dict:
    out: dict = {}
    for layer in layers:
        out.update(layer or {})
    return out


class _Resolver:
    def __init__(self, doc: LoadedYaml, root: Path, digests: DigestCache):
        self.doc = doc
        self.data = doc.data
        self.root = root
        self.digests = digests

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
                      "sha256": self.file_digest(file, path + ("python",))}
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
                         weights=weights, inputs=tuple(inputs))

    def backend(self, name: str, spec: dict) -> BackendSpec:
        recipe_name = spec.get("recipe", name)
        key = ("backends", name, "recipe") if "recipe" in spec else ("backends", name)
        recipe = recipes.load_recipe("backend", recipe_name)
        if recipe is None:
            raise self.doc.error(key, recipes.unknown_recipe_message("backend", recipe_name))
        options = {k: v for k, v in spec.items() if k != "recipe"}
        for opt_path, message in recipes.check_options(recipe, options):
            raise self.doc.error(("backends", name) + opt_path, message)
        runtime = recipe.data.get("runtime") or {}
        return BackendSpec(name=name, recipe=recipe_name, partitioner=recipe.data.get("partitioner"),
                           options={**recipe.defaults(), **options},
                           delegates=tuple(runtime.get("delegates", ())),
                           host_runnable=bool(runtime.get("host_runnable", False)))

    def quantization(self, index: int, name: str) -> tuple[QuantSpec, dict]:
        recipe = recipes.load_recipe("quantization", name)
        if recipe is None:
            raise self.doc.error(("quantization", index), recipes.unknown_recipe_message("quantization", name))
        return QuantSpec(name=name, quantizer=recipe.data.get("quantizer")), recipe.data.get("thresholds") or {}

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
        return tuple(
            Cell(model=models[m], backend=backends[b], quant=quants[q],
                 thresholds=_merge_thresholds(quant_thresholds[q], global_thresholds.get(q),
                                              model_thresholds[m].get(q)))
            for m, b, q in combos)

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
    r = _Resolver(doc, root, digests)
    data = doc.data
    models = {name: r.model(name, spec) for name, spec in data["models"].items()}
    backends = {name: r.backend(name, spec) for name, spec in data["backends"].items()}
    quants, quant_thresholds = {}, {}
    for i, name in enumerate(data["quantization"]):
        quants[name], quant_thresholds[name] = r.quantization(i, name)
    r.check_threshold_keys(list(quants))
    cells = r.cells(models, backends, quants, quant_thresholds)
    code_digests = {kind: digest({f: digests.file_digest(PACKAGE_DIR / f) for f in files})
                    for kind, files in BUILDER_MODULES.items()}
    if own_digests:
        digests.save()
    return Plan(file=pipeline_file, display=doc.file,
                section_lines={dim: doc.line_of((section,)) for dim, section in SECTIONS.items()},
                root=root, name=data["name"], version=data.get("version", "0.0.0"),
                models=models, backends=backends, quantizations=quants, cells=cells,
                seed=(data.get("validation") or {}).get("seed", 0),
                toolchain=toolchain_versions(), code_digests=code_digests)


def _display(path: Path) -> str:
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)
