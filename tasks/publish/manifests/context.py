"""Generated manifests: Dart (Flutter), a pubspec assets snippet, CMake and a JSON model index.

    doit manifest    writes artifacts/<pipeline>/manifests/{models.g.dart, pubspec_assets.yaml,
                     models.cmake, index.json}

One list of variants feeds every manifest: the plan's cells whose outcome ships
(tasks/outcome.py: ok, provisional or on-device), with the outcome's evidence
(size, sha256, delegates and input dtypes from the export's current record,
output shapes from the capture's) and its verdict: validated here (status ok or
provisional, the SQNR and the data it was measured on) or to be checked on the
device (its .bpte, sha256 and tolerances). Every other cell (failed, expected
failure, unexpectedly passing, skipped, not built or validated yet, rejected by
its scheme) is left out of every file and listed in a comment (``excluded`` in
index.json) with its status.

The files are deterministic (plan order, sorted keys, no timestamps), so an
unchanged plan yields byte-identical manifests. The task is cached like the
others (``CachedTask``/``run_cached``): its key is a digest of everything
rendered (the context below), the template bytes and this module's source,
computed when doit asks whether the task is up to date, i.e. after the exports
it depends on have run.

Options come from an optional ``manifests:`` section of pipeline.yaml, read from
``plan.manifests`` when the plan carries it, else the defaults below::

    manifests:
      assets_dir: assets/models          # Flutter asset folder the .pte files are copied to
      base_url: https://example.com/m/1  # index.json baseUrl; remoteUrl = <base_url>/<file>
      install_dir: share/etforge/models  # default of ETFORGE_MODELS_INSTALL_DIR in models.cmake
      platforms:                         # fallback order, best first: backend names, recipe
        android: [qnn, vulkan, xnnpack, portable]   # names, or backend/quantization
      models:
        small_cnn: {category: classification, input_size: 32, labels_file: labels.txt,
                    platforms: {ios: [coreml, xnnpack]}}

This module must not import torch or executorch; jinja2 is imported only to render.
"""

from __future__ import annotations

import hashlib
import json
import re
import sys
from pathlib import Path

from tasks.publish.manifests import cpp_header
from tasks.config import defaults, recipes
from tasks.config.manifest_options import check_options
from tasks.publish import outcome
from tasks.core.atomic import atomic_write_text
from tasks.store.local import Store
from tasks.engine.taskdicts import matrix_task_deps
from tasks.core.digest import canonical_json, digest, sha256_file
from tasks.core.text import one_line
from tasks.config.model import Plan
from tasks.engine.cached_run import BuildResult, CachedTask, is_up_to_date, read_state, run_cached
from tasks.core.paths import TEMPLATE_DIR

TASK_NAME = "manifest"
DART, PUBSPEC, CMAKE, INDEX = "models.g.dart", "pubspec_assets.yaml", "models.cmake", "index.json"
HEADER = "etforge_models.h"  # read by cpp/runner (tasks/cpp_header.py renders it)
TEMPLATES = {DART: "models.g.dart.j2", PUBSPEC: "pubspec_assets.yaml.j2", CMAKE: "models.cmake.j2"}
FILES = (DART, PUBSPEC, CMAKE, INDEX, HEADER)
INDEX_FORMAT = "1.0"  # the community Flutter model store's index.json "version"


# Delegate id (as recorded in a program) -> (target of an ExecuTorch source build,
# target of the pip wheel's find_package(executorch) package, or None when no wheel ships it).
DELEGATE_TARGETS = {
    "XnnpackBackend": ("xnnpack_backend", "executorch::backend_xnnpack"),
    "CoreMLBackend": ("coremldelegate", "executorch::backend_coreml"),
    "VulkanBackend": ("vulkan_backend", None),
    "QnnBackend": ("qnn_executorch_backend", "executorch::backend_qnn"),
    "MPSBackend": ("mpsdelegate", None),
    "OpenvinoBackend": ("openvino_backend", "executorch::backend_openvino"),
    "VgfBackend": ("vgf_backend", None),
    "EthosUBackend": ("executorch_delegate_ethos_u", None),
    "MLXBackend": (None, "executorch::backend_mlx"),
    "CudaBackend": (None, "executorch::backend_cuda"),
}

# Short descriptions for index.json's backendDescription (the store's wording where it has one).
BACKEND_DESCRIPTIONS = {
    "xnnpack": "CPU-optimized (XNNPACK)",
    "coreml": "Apple Neural Engine (CoreML)",
    "mps": "Apple GPU (Metal Performance Shaders)",
    "vulkan": "GPU-accelerated (Vulkan)",
    "portable": "Portable CPU kernels (no delegate)",
    "qnn": "Qualcomm NPU (QNN)",
    "openvino": "Intel CPU/GPU/NPU (OpenVINO)",
    "metal": "Apple GPU (Metal)",
    "mlx": "Apple silicon (MLX)",
    "cuda": "NVIDIA GPU (CUDA)",
    "arm_tosa": "Arm TOSA",
    "arm_vgf": "Arm ML extensions for Vulkan (VGF)",
    "ethos_u55": "Arm Ethos-U55 NPU",
    "ethos_u85": "Arm Ethos-U85 NPU",
    "mediatek": "MediaTek NPU (NeuroPilot)",
    "nxp_neutron": "NXP eIQ Neutron NPU",
    "samsung_exynos": "Samsung Exynos NPU (ENN)",
    "cadence": "Cadence Xtensa DSP",
}

DART_RESERVED = frozenset("""
    abstract as assert async await base break case catch class const continue covariant default
    deferred do dynamic else enum export extends extension external factory false final finally
    for Function get hide if implements import in interface is late library mixin new null of on
    operator part required rethrow return sealed set show static super switch sync this throw
    true try type typedef var void when while with yield
    pipeline pipelineVersion executorchVersion models variants assets hashCode runtimeType
    toString noSuchMethod int double num bool
""".split())  # keywords, EtforgeModels' own members, and the lowercase types its body names


class ManifestError(Exception):
    """A manifest cannot be written (bad option, two variants with one file name)."""


# ---------------------------------------------------------------- options

def options_for(plan: Plan) -> dict:
    """The resolved ``manifests:`` options: defaults (tasks/config/defaults.py), then the pipeline's section."""
    raw = plan.manifests
    problems = check_options(raw, list(plan.backends), recipes.available("backend"), list(plan.quantizations))
    if problems:
        path, message = problems[0]
        raise ManifestError(f"manifests.{'.'.join(str(p) for p in path)}: {message}".replace(".:", ":"))
    platforms = {**defaults.PLATFORM_ORDER, **(raw.get("platforms") or {})}
    return {**defaults.MANIFEST_OPTIONS, **{k: raw[k] for k in defaults.MANIFEST_OPTIONS if k in raw},
            "platforms": {p: list(platforms[p]) for p in sorted(platforms)},
            "models": raw.get("models") or {}}


# ---------------------------------------------------------------- naming

def dart_identifier(name: str) -> str:
    """lowerCamelCase Dart identifier for a pipeline name (letters, digits, '_' and '-')."""
    parts = [p for p in re.split(r"[^A-Za-z0-9]+", name) if p]
    if not parts:
        return "unnamed"
    lead = re.match(r"[A-Z]*", parts[0]).end()  # YOLO11n -> yolo11n, MobileNet -> mobileNet
    words = [parts[0][:lead].lower() + parts[0][lead:]] + [p[0].upper() + p[1:] for p in parts[1:]]
    ident = "".join(words)
    if ident[0].isdigit():
        ident = "m" + ident
    return ident


def cmake_identifier(name: str) -> str:
    """UPPER_SNAKE part of a CMake variable name."""
    ident = re.sub(r"[^A-Za-z0-9]+", "_", name).strip("_").upper()
    return ident or "UNNAMED"


def _unique(names: list, make, reserved=frozenset()) -> dict:
    """name -> identifier, distinct from each other and from ``reserved``; numbered on collision."""
    out, used = {}, set(reserved)
    for name in names:
        base = make(name)
        ident, n = base, 1
        while ident in used:
            n += 1
            ident = f"{base}_{n}"
        used.add(ident)
        out[name] = ident
    return out


# ---------------------------------------------------------------- context

def _relative(plan: Plan, path) -> str:
    try:
        return Path(path).relative_to(plan.out_dir).as_posix()
    except ValueError:
        return Path(path).name


def _input_size(model, config: dict):
    if "input_size" in config:
        return config["input_size"]
    shape = model.inputs[0].shape if model.inputs else ()
    if len(shape) == 4 and shape[-1] == shape[-2]:
        return shape[-1]  # NCHW image with square sides, as the store's inputSize
    return None


def _join_url(base: str, name: str) -> str:
    return f"{base.rstrip('/')}/{name}" if base else name


def _ordered(variants: list, order: list) -> list:
    """Variant ids in fallback order: each entry (backend, recipe, or backend/quant) in turn."""
    out = []
    for entry in order:
        backend, _, quant = entry.partition("/")
        for v in variants:
            if (backend in (v["backend"], v["recipe"]) and (not quant or quant == v["quantization"])
                    and v["id"] not in out):
                out.append(v["id"])
    return out


def build_context(plan: Plan, cells=None, host: dict | None = None, results: dict | None = None) -> dict:
    """Everything the manifests are rendered from (JSON-serializable; its digest is the key).

    ``cells``: the cells to describe (default: every cell of the plan); ``host``: read the
    benchmark records too (a failed benchmark fails its cell, tasks/outcome.py); ``results``:
    their outcomes (cell name -> CellOutcome) when the caller has them already.
    """
    options = options_for(plan)
    cells = plan.cells if cells is None else tuple(cells)
    results = {c.name: (results or {}).get(c.name) or outcome.cell_outcome(plan, c, host) for c in cells}
    built, excluded = [], []
    for cell in cells:
        result = results[cell.name]
        if result.ships:
            built.append((cell, result))
        else:
            excluded.append({"cell": cell.name, "status": result.status,
                             "reason": one_line(outcome.listing_reason(result, plan.out_dir))})
    models_of_cells = {c.model.name for c in cells}
    excluded += [{"cell": r.name, "status": "rejected", "reason": one_line(r.reason)} for r in plan.rejected
                 if r.model in models_of_cells]

    names = [c.name for c, _ in built]
    model_names = list(dict.fromkeys(c.model.name for c, _ in built))
    dart_models = _unique(model_names, dart_identifier, DART_RESERVED)
    dart_variants = _unique(names, lambda n: dart_identifier(n.replace("/", "_")),
                            DART_RESERVED | set(dart_models.values()))
    cmake_variants = _unique(names, lambda n: cmake_identifier(n.replace("/", "_")))
    cmake_models = _unique(model_names, cmake_identifier)

    variants = []
    for cell, result in built:
        ev = result.evidence
        outputs = list(ev.outputs)
        dtypes = list(ev.input_dtypes)
        if len(dtypes) != len(cell.model.inputs):
            dtypes = [i.dtype for i in cell.model.inputs]
        delegates = list(ev.delegates)
        file_name = f"{cell.stem}.pte"
        description = BACKEND_DESCRIPTIONS.get(cell.backend.primary.recipe, cell.backend.name)
        if len(cell.backend.members) > 1:
            description += " with fallback to " + ", ".join(m.recipe for m in cell.backend.members[1:])
        variants.append({
            "id": cell.name,
            "dart_id": dart_variants[cell.name],
            "cmake_id": cmake_variants[cell.name],
            "model": cell.model.name,
            "backend": cell.backend.name,
            "recipe": cell.backend.primary.recipe,
            "quantization": cell.quant.name,
            "file": file_name,
            "path": _relative(plan, plan.pte_path(cell)),  # relative to artifacts/<pipeline>/
            "asset": f"{options['assets_dir'].strip('/')}/{file_name}",
            "remote_url": _join_url(options["base_url"], file_name),
            "sha256": ev.sha256,  # the export record's: the release packs only a file with this hash
            "size": int(ev.size_bytes),
            "delegates": delegates,
            "backend_targets": [DELEGATE_TARGETS[d][0] for d in delegates
                                if d in DELEGATE_TARGETS and DELEGATE_TARGETS[d][0]],
            "package_targets": [DELEGATE_TARGETS[d][1] for d in delegates
                                if d in DELEGATE_TARGETS and DELEGATE_TARGETS[d][1]],
            "executorch_version": ev.executorch_version or plan.toolchain.get("executorch") or "",
            "inputs": [{"name": i.name, "shape": list(i.shape), "dtype": d}
                       for i, d in zip(cell.model.inputs, dtypes)],
            "outputs": [{"name": f"output_{k}", "shape": list(o.get("shape", [])), "dtype": o.get("dtype", "")}
                        for k, o in enumerate(outputs)],
            "description": description,
            "verdict": outcome.verdict(result),
        })
    by_file: dict = {}
    for v in variants:
        if v["file"] in by_file:
            raise ManifestError(f"{by_file[v['file']]} and {v['id']} would both ship as {v['file']}; "
                                "rename a model or backend in pipeline.yaml")
        by_file[v["file"]] = v["id"]

    models = []
    for name in model_names:
        own = [v for v in variants if v["model"] == name]
        config = options["models"].get(name) or {}
        platforms = {**options["platforms"], **(config.get("platforms") or {})}
        fallback = {p: _ordered(own, platforms[p]) for p in sorted(platforms)}
        for v in own:
            v["platforms"] = sorted(p for p, ids in fallback.items() if v["id"] in ids and p != "default")
        labels_file = config.get("labels_file")
        models.append({
            "name": name,
            "dart_id": dart_models[name],
            "cmake_id": cmake_models[name],
            "variants": [v["id"] for v in own],
            "fallback": fallback,
            "category": config.get("category", name),
            "input_size": _input_size(plan.models[name], config),
            "labels_file": labels_file,
            "labels_url": config.get("labels_url") or (_join_url(options["base_url"], labels_file)
                                                       if labels_file else None),
        })
    delegates = sorted({d for v in variants for d in v["delegates"]})
    for d in delegates:
        if not re.match(r"^[A-Za-z][A-Za-z0-9_]*$", d):
            raise ManifestError(f"delegate id {d!r} cannot name a CMake variable")
    return {
        "pipeline": plan.name,
        "version": plan.version,
        "source": plan.file.name,
        "executorch_version": plan.toolchain.get("executorch") or "",
        "options": {k: options[k] for k in defaults.MANIFEST_OPTIONS},
        "platforms": sorted({p for m in models for p in m["fallback"]}),
        "variants": variants,
        "models": models,
        "excluded": excluded,
        "delegate_targets": {d: [t for t in DELEGATE_TARGETS.get(d, (None, None))[::-1] if t] for d in delegates},
        # The C++ runner's header, in the desktop Linux fallback order of the Dart manifest.
        "cpp_header": cpp_header.header_context(plan, cells, order=tuple(options["platforms"].get(
            "linux", defaults.PLATFORM_ORDER["linux"])), outcomes=results),
    }


# ---------------------------------------------------------------- rendering

def _dart_string(value) -> str:
    text = str(value)
    for a, b in (("\\", "\\\\"), ("'", "\\'"), ("$", "\\$"), ("\n", "\\n"), ("\r", "\\r")):
        text = text.replace(a, b)
    return f"'{text}'"


def _dart_double(value) -> str:
    """A Dart ``double?`` literal (null: not measured)."""
    return "null" if value is None else repr(float(value))


def _cmake_string(value) -> str:
    text = str(value)
    for a, b in (("\\", "\\\\"), ('"', '\\"'), ("$", "\\$"), (";", "\\;"), ("\n", "\\n")):
        text = text.replace(a, b)
    return f'"{text}"'


def _yaml_string(value) -> str:
    return json.dumps(str(value), ensure_ascii=False)  # a JSON string is a YAML double-quoted scalar


def _environment():
    import jinja2

    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATE_DIR)), undefined=jinja2.StrictUndefined,
                             autoescape=False, keep_trailing_newline=True, trim_blocks=True, lstrip_blocks=True)
    env.filters.update(dart=_dart_string, dart_double=_dart_double, cmake=_cmake_string, yaml=_yaml_string,
                       comment=one_line)
    return env


def index_document(context: dict) -> dict:
    """index.json, in the shape of the community Flutter model store's index."""
    models = {m["name"]: m for m in context["models"]}
    entries = []
    for v in context["variants"]:
        m = models[v["model"]]
        entries.append({
            "name": v["file"],
            "modelName": v["model"],
            "category": m["category"],
            "backend": v["backend"],
            "quantization": v["quantization"],
            "hash": v["sha256"],
            "size": v["size"],
            "sizeMB": round(v["size"] / (1024 * 1024), 2),
            "inputSize": m["input_size"],
            "remoteUrl": v["remote_url"],
            "labelsFile": m["labels_file"],
            "labelsRemoteUrl": m["labels_url"],
            "backendDescription": v["description"],
            "platforms": v["platforms"],
            "delegates": v["delegates"],
            "verdict": v["verdict"],
        })
    return {
        "version": INDEX_FORMAT,
        "generated": "",  # the store's parser needs the key; a wall-clock time would break reproducibility
        "executorchVersion": context["executorch_version"],
        "pipeline": context["pipeline"],
        "pipelineVersion": context["version"],
        "baseUrl": context["options"]["base_url"],
        "models": entries,
        "labels": [],
        "backends": {v["backend"]: {"description": v["description"]} for v in context["variants"]},
        "excluded": context["excluded"],
    }


def render(context: dict) -> dict:
    """File name -> text of every manifest."""
    env = _environment()
    by_id = {v["id"]: v for v in context["variants"]}
    out = {name: env.get_template(template).render(**context, by_id=by_id) for name, template in TEMPLATES.items()}
    out[INDEX] = json.dumps(index_document(context), indent=2, sort_keys=True, ensure_ascii=False) + "\n"
    out[HEADER] = cpp_header.render_context(context["cpp_header"])
    return out


def write_manifests(context: dict, directory: Path) -> dict:
    """Render and write every manifest atomically into ``directory``; name -> path."""
    paths = {}
    for name, text in render(context).items():
        paths[name] = Path(directory) / name
        atomic_write_text(paths[name], text)
    return paths


# ---------------------------------------------------------------- the doit task

def manifest_dir(plan: Plan) -> Path:
    return plan.out_dir / "manifests"


def manifest_key(context: dict) -> str:
    templates = {t: sha256_file(TEMPLATE_DIR / t) for t in sorted([*TEMPLATES.values(), cpp_header.TEMPLATE])}
    code = [hashlib.sha256(Path(m.__file__).read_bytes()).hexdigest() for m in (sys.modules[__name__], cpp_header)]
    return digest({"task": TASK_NAME, "context": context, "templates": templates, "code": code})


def manifest_spec(plan: Plan, key: str) -> CachedTask:
    return CachedTask(name=TASK_NAME, key=key, outputs={f: manifest_dir(plan) / f for f in FILES},
                      state_file=plan.state_dir / f"{TASK_NAME}.json", log_file=plan.log_path(TASK_NAME))


def manifest_up_to_date(plan: Plan, store: Store, host: dict | None = None) -> bool:
    """doit ``uptodate``: evaluated after the cells' tasks ran, so the key sees their records."""
    try:
        return is_up_to_date(manifest_spec(plan, manifest_key(build_context(plan, host=host))), store)
    except Exception:  # the action reports it
        return False


def run_manifest(plan: Plan, store: Store, host: dict | None = None) -> bool:
    try:
        context = build_context(plan, host=host)
    except ManifestError as exc:
        # A truthful state record for the reporter, and never up to date.
        spec = manifest_spec(plan, "")
        atomic_write_text(spec.state_file, canonical_json({"task": spec.name, "key": "", "status": "failed",
                                                           "reason": str(exc), "info": {}, "outputs": {}}))
        sys.stderr.write(f"etforge: error: {exc}\n")
        return False
    spec = manifest_spec(plan, manifest_key(context))

    def build(workdir: Path) -> BuildResult:
        files = write_manifests(context, workdir)
        return BuildResult(files=files, info={"variants": len(context["variants"]),
                                              "excluded": [e["cell"] for e in context["excluded"]]})

    ok = run_cached(spec, store, build)
    if not ok:
        record = read_state(spec.state_file) or {}
        sys.stderr.write(f"etforge: manifest: {record.get('reason', 'failed')} (log: {spec.log_file})\n")
    return ok


def manifest_task(plan: Plan, cells, store: Store | None = None, host: dict | None = None) -> dict:
    """The ``manifest`` task: after the selected cells' verdicts, manifests of every shippable cell."""
    store = store if store is not None else Store(plan.cache_dir)
    return {
        "basename": TASK_NAME,
        "doc": f"write {', '.join(FILES)} of the shippable cells to {manifest_dir(plan).relative_to(plan.root)}/",
        "actions": [(run_manifest, [plan, store, host])],
        "uptodate": [(manifest_up_to_date, [plan, store, host])],
        # After every task that decides a cell's outcome (validation, size gates, benchmarks):
        # cells that fail them are left out.
        "task_dep": matrix_task_deps(plan, cells),
        "verbosity": 2,
    }
