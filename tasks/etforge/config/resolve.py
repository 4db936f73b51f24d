"""Resolve ``pipeline.yaml`` into an immutable Plan (etforge.config.model).

Loading with lines (yamlfile), the schema (schema), recipes and the matrix
(matrix) each say what is wrong as ``file:line: key: message``. This module
must not import torch or executorch.
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

from etforge.config import defaults, npz_index, recipes, schema
from etforge.config.code_deps import CodeDigests, ImportGraph
from etforge.config.digest_cache import DigestCache, digest_cache_for
from etforge.config.dynamic_cells import reject_dynamic
from etforge.config.hf_source import (
    model_kind,
    reject_llm_cells,
    reject_llm_keep_float,
    reject_task_cells,
    resolve_transformers,
)
from etforge.config.input_specs import input_specs
from etforge.config.labels import HostLabels
from etforge.config.llm_tokens import TEXT, TOKENIZER, TOKENS, resolve_tokens
from etforge.config.manifest_options import check_options as check_manifest_options
from etforge.config.matrix import MatrixResolver
from etforge.config.model import (
    SECTIONS,
    BackendMember,
    BackendSpec,
    Benchmarking,
    ModelKind,
    ModelSpec,
    Plan,
    PlanCode,
    PlanFile,
    QuantSpec,
    Storage,
)
from etforge.config.remote_url import check_remote_setting
from etforge.config.selection import cache_settings
from etforge.config.targets import TargetResolver
from etforge.config.task_data import task_entries
from etforge.config.tools import ToolVersions, stage_tools, toolchain_versions
from etforge.config.torchvision_names import torchvision_source
from etforge.config.validation_data import reject_parts, resolve_validation
from etforge.config.validation_memo import ValidationMemo, validation_memo
from etforge.config.yamlfile import LoadedYaml
from etforge.core.digest import digest


class _Resolver:
    def __init__(self, doc: LoadedYaml, root: Path, digests: DigestCache, versions: ToolVersions, memo: ValidationMemo):
        self.doc = doc
        self.data = doc.data
        self.root = root
        self.digests = digests
        self.versions = versions
        self.memo = memo  # recipes and options that passed their checks before are not checked again
        self.imports = ImportGraph(root, digests)  # parses a project file once, memoised by content
        self.recipes = recipes.RecipePath.for_project(root, memo)  # the project's own recipes/ first
        self.labels = HostLabels(self.recipes)  # worker labels: what cells need, what this host offers

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
        raise self.doc.error(
            path, f"module {module!r} not found in the project (looked for {module.replace('.', '/')}.py)"
        )

    def model(self, name: str, spec: dict) -> ModelSpec:
        with self.digests.recording() as read:
            model = self._model(name, spec)
        return replace(model, reads=frozenset(read))

    def _model(self, name: str, spec: dict) -> ModelSpec:
        path = ("models", name)
        implied_methods = None  # an LLM's or a seq2seq model's methods follow from its options
        if "python" in spec:
            file = self.factory_file(spec["python"], path + ("python",))
            source = {
                "python": spec["python"],
                "file": self.rel(file),
                "sha256": self.file_digest(file, path + ("python",)),
                # every project module the factory imports, directly or not (etforge.config.code_deps)
                "modules": {
                    self.rel(f): self.file_digest(f, path + ("python",))
                    for f in sorted(self.imports.reach([file]))
                    if f != file
                },
            }
            if spec.get("packages"):
                source["packages"] = self.package_versions(spec["packages"], path + ("packages",))
        elif "transformers" in spec:
            source, implied_methods = resolve_transformers(self, name, spec)
        else:
            source = torchvision_source(self, spec["torchvision"], path + ("torchvision",))
        weights = None
        if "weights" in spec:
            wpath = path + ("weights", "path")
            full = self.inside_root(spec["weights"]["path"], wpath)
            if not full.is_file():
                raise self.doc.error(wpath, f"weights file {spec['weights']['path']!r} not found")
            actual = self.file_digest(full, wpath)
            if actual != spec["weights"]["sha256"]:
                raise self.doc.error(
                    path + ("weights", "sha256"),
                    f"weights file sha256 is {actual}, pipeline pins {spec['weights']['sha256']}",
                )
            weights = {"path": self.rel(full), "sha256": actual}
        if "inputs" in spec and "methods" in spec:
            raise self.doc.error(
                path, "declare either 'inputs' (one method, forward) or 'methods' (each with its inputs), not both"
            )
        dim_ranges: dict = {}  # dim names are shared across inputs and methods
        if implied_methods is not None:  # from the source (an LLM's token ids and cache positions)
            if "methods" in spec:
                raise self.doc.error(
                    path + ("methods",),
                    "a text-generation model's methods are implied (forward with a static KV cache); drop 'methods'",
                )
            methods: tuple = tuple(implied_methods)
        elif "methods" in spec:
            methods = tuple(
                (m, input_specs(self.doc, body["inputs"], path + ("methods", m, "inputs"), dim_ranges))
                for m, body in spec["methods"].items()
            )
        elif "inputs" in spec:
            methods = (("forward", input_specs(self.doc, spec["inputs"], path + ("inputs",), dim_ranges)),)
        else:
            raise self.doc.error(path, "missing required key 'inputs'")
        inputs = methods[0][1]
        return ModelSpec(
            name=name,
            kind=model_kind(source),
            source=source,
            kwargs=spec.get("kwargs") or {},
            weights=weights,
            inputs=inputs,
            methods=methods,
            calibration=self.calibration(spec.get("calibration"), path + ("calibration",), inputs),
            validation=self.validation(spec.get("validation"), path + ("validation",), source, methods),
            task=spec.get("task", "other"),
            **self.labels.model_fields(spec.get("labels") or (), lambda i, m: self.doc.error(path + ("labels", i), m)),
            outputs=self.selected_outputs(spec, path, model_kind(source), methods),
        )

    def selected_outputs(self, spec: dict, path: tuple, kind, methods: tuple) -> tuple:
        """The model's ``outputs`` selection (checked against its outputs when it is captured)."""
        selection = spec.get("outputs")
        if not selection:
            return ()
        if kind == ModelKind.LLM or len(methods) > 1:
            what = "an LLM (its outputs are the logits)" if kind == ModelKind.LLM else "a model with several methods"
            raise self.doc.error(path + ("outputs",), f"selecting outputs is not supported for {what}")
        return tuple(selection)

    def package_versions(self, names: list, path: tuple) -> dict:
        versions = {}
        for i, name in enumerate(names):
            versions[name] = self.versions.distribution(name)
            if versions[name] is None:
                raise self.doc.error(path + (i,), f"package {name!r} is not installed (pip install {name})")
        return versions

    def validation(self, spec: dict | None, path: tuple, source: dict, methods: tuple) -> dict | None:
        """The ``validation`` entry: an LLM's token file or text (etforge.config.llm_tokens), data per method
        or per named shape (etforge.config.validation_data), else as calibration."""
        if spec is not None and (TOKENS in spec or TEXT in spec):
            return resolve_tokens(self, spec, path, source, methods[0][1])
        return resolve_validation(self, spec, path, model_kind(source), methods)

    def calibration(self, spec: dict | None, path: tuple, inputs: tuple) -> dict | None:
        """A ``calibration`` or ``validation`` entry with its content digest; ``inputs``: what it feeds."""
        if spec is None:
            return None
        reject_parts(self, spec, path)
        for kind in (TOKENS, TEXT):  # schema-valid under the shared $def, meaningless for calibration
            if kind in spec:
                raise self.doc.error(
                    path + (kind,), f"a {kind} file validates an LLM; calibration takes 'npz' or 'images'"
                )
        if TOKENIZER in spec:
            raise self.doc.error(path + (TOKENIZER,), "a tokenizer goes with a validation 'text' (of an LLM)")
        kind = "npz" if "npz" in spec else "images"
        full = self.inside_root(spec[kind], path + (kind,))
        if kind == "npz":
            if not full.is_file():
                raise self.doc.error(path + (kind,), f"{path[-1]} file {spec[kind]!r} not found")
            content = self.file_digest(full, path + (kind,))
            try:  # memoised by content: a no-op run reads no archive
                shapes = self.digests.derived("npz_shapes", content, lambda: npz_index.array_shapes(full))
            except npz_index.NpzError as exc:
                raise self.doc.error(path + (kind,), f"{spec[kind]} {exc}") from None
            problem = npz_index.feeding_problem(shapes, inputs)
            if problem:
                raise self.doc.error(path + (kind,), f"{spec[kind]} {problem}")
        else:
            if not full.is_dir():
                raise self.doc.error(path + (kind,), f"{path[-1]} folder {spec[kind]!r} not found")
            images = sorted(p for p in full.rglob("*") if p.suffix.lower() in defaults.IMAGE_SUFFIXES and p.is_file())
            if not images:
                raise self.doc.error(
                    path + (kind,), f"no images ({', '.join(defaults.IMAGE_SUFFIXES)}) in {spec[kind]!r}"
                )
            content = digest({self.rel(p): self.file_digest(p, path + (kind,)) for p in images})
        # validation's labels and user metrics (etforge.config.task_data), each with its digest
        found = (shapes, None) if kind == "npz" else (None, images)
        return {**spec, kind: self.rel(full), "sha256": content, **task_entries(self, spec, path, inputs, *found)}

    def member(self, recipe_name: str, options: dict, path: tuple) -> BackendMember:
        recipe = self.recipes.load("backend", recipe_name)
        if recipe is None:
            raise self.doc.error(path, self.recipes.unknown_message("backend", recipe_name))
        for opt_path, message in recipes.check_options(recipe, options, self.memo):
            raise self.doc.error(path[:2] + opt_path, message)
        runtime = recipe.data.get("runtime") or {}
        delegates = tuple(runtime.get("delegates", ()))
        return BackendMember(
            recipe=recipe_name,
            partitioner=recipe.data.get("partitioner"),
            options={**recipe.defaults(), **options},
            delegates=delegates,
            **self.labels.member_fields(recipe.data, bool(runtime.get("host_runnable", False))),
            min_coverage=recipe.data.get("min_delegation_coverage") if delegates else None,
            tools=self.versions.versions(stage_tools(recipe.data, "lowering")),
            runtime_tools=self.versions.versions(stage_tools(recipe.data, "runtime")),
            dynamic_shapes=bool(recipe.data.get("dynamic_shapes", False)),
            lowering=dict(recipe.data.get("lowering") or {}),
            llm=dict(recipe.data.get("llm") or {}),
            hf_tasks=dict(recipe.data.get("hf_tasks") or {}),
            manifest=dict(recipe.data.get("manifest") or {}),
            cmake_targets=dict(runtime.get("cmake_targets") or {}),
            **{k: runtime[k] for k in ("validated_by", "probe") if runtime.get(k)},  # what runs or probes it here
            reproducible=recipe.data.get("reproducible"),
        )

    def min_coverage(self, name: str, members: list) -> float | None:
        """gates.min_delegation_coverage.<name>, else the strictest member recipe's minimum."""
        override = ((self.data.get("gates") or {}).get("min_delegation_coverage") or {}).get(name)
        minimums = [m.min_coverage for m in members if m.min_coverage is not None]
        if not minimums:
            if override is not None:
                raise self.doc.error(
                    ("gates", "min_delegation_coverage", name),
                    f"backend {name!r} has no delegate (its programs run on portable "
                    "kernels), so it has no coverage to gate",
                )
            return None
        return override if override is not None else max(minimums)

    def backend(self, name: str, spec: dict) -> BackendSpec:
        if "chain" in spec:
            if set(spec) - {"chain"}:
                raise self.doc.error(
                    ("backends", name), "a chain takes no options of its own; set them on the backends it names"
                )
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
        recipe = self.recipes.load("quantization", name)
        if recipe is None:
            raise self.doc.error(("quantization", index), self.recipes.unknown_message("quantization", name))
        options = (self.data.get("quantization_options") or {}).get(name, {})
        for opt_path, message in recipes.check_options(recipe, options, self.memo):
            raise self.doc.error(("quantization_options", name) + opt_path, message)
        return (
            QuantSpec(name=name, recipe=recipe, options={**recipe.defaults(), **options}),
            recipe.data.get("thresholds") or {},
        )


def resolve(pipeline_file: Path, digests: DigestCache | None = None) -> Plan:
    """Load, validate and resolve ``pipeline_file``; raise PipelineError on any mistake.

    With ``digests`` given, the caller saves the memo (after its own checks pass).
    """
    pipeline_file = Path(pipeline_file).absolute()
    root = pipeline_file.parent
    own_digests = digests is None
    if digests is None:
        digests = digest_cache_for(pipeline_file)
    versions = ToolVersions()  # one metadata lookup per distribution for this resolution
    code = CodeDigests(digests)  # etforge's code, for the validation memo and the keys
    memo = validation_memo(digests, versions.distribution, code)
    doc = memo.load_yaml(pipeline_file, _display(pipeline_file))  # parsed once per content
    schema.validate(doc, "pipeline.schema.json", memo)
    r = _Resolver(doc, root, digests, versions, memo)
    m = MatrixResolver(doc, versions)
    data = doc.data
    models = {name: r.model(name, spec) for name, spec in data["models"].items()}
    backends = {name: r.backend(name, spec) for name, spec in data["backends"].items()}
    quants, quant_thresholds = {}, {}
    for i, name in enumerate(data["quantization"]):
        quants[name], quant_thresholds[name] = r.quantization(i, name)
    m.check_threshold_keys(list(quants))
    m.check_scheme_options(list(quants))
    cells, rejected = m.cells(models, backends, quants, quant_thresholds)
    cells, rejected = reject_dynamic(doc, cells, rejected)
    cells, rejected = reject_llm_cells(cells, rejected, models, backends, r.recipes)
    cells, rejected = reject_task_cells(doc, cells, rejected)
    cells, rejected = reject_llm_keep_float(doc, cells, rejected)
    m.check_backend_options(cells, rejected)
    targets = TargetResolver(doc, r.recipes).of_backends(backends)  # the CPU cores each backend's cells run on
    cells = tuple(replace(c, targets=targets[c.backend.name]) if targets[c.backend.name] else c for c in cells)
    expected_failures = m.expected_failures(
        cells, rejected, {"model": list(models), "backend": list(backends), "quantization": list(quants)}
    )
    for path, message in check_manifest_options(
        data.get("manifests"), list(backends), r.recipes.available("backend"), list(quants)
    ):
        raise doc.error(("manifests",) + path, message)
    cache_remote, cache_read_only = cache_settings(data.get("cache"), root)
    check_remote_setting(doc, cache_remote, from_env=bool(os.environ.get("ETFORGE_CACHE_REMOTE")))
    if own_digests:
        digests.save()
    benchmark = dict(data.get("benchmark") or {})
    baseline, regression_pct = benchmark.pop("baseline", None), benchmark.pop("regression_pct", defaults.REGRESSION_PCT)
    return Plan(
        source=PlanFile(
            path=pipeline_file,
            display=doc.file,
            section_lines={dim: doc.line_of((section,)) for dim, section in SECTIONS.items()},
            sha256=doc.sha256,
        ),
        recipe_path=r.recipes,
        root=root,
        name=data["name"],
        version=data.get("version", "0.0.0"),
        models=models,
        backends=backends,
        quantizations=quants,
        cells=cells,
        rejected=rejected,
        gates=data.get("gates") or {},
        storage=Storage(
            remote=cache_remote,
            read_only=cache_read_only,
            allow_outside=(data.get("artifacts") or {}).get("allow_outside", False),
        ),
        benchmark=Benchmarking({**defaults.BENCHMARK, **benchmark}, baseline, regression_pct),
        seed=(data.get("validation") or {}).get("seed", defaults.SEED),
        toolchain=toolchain_versions(versions.distribution),
        code=PlanCode(code, CodeDigests(digests, root=root, package=None)),
        manifests=data.get("manifests") or {},
        expected_failures=expected_failures,
        diff={**defaults.DIFF_TOLERANCES, **(data.get("diff") or {})},
    )


def _display(path: Path) -> str:
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)
