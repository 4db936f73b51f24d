"""Generated manifests: Dart (Flutter), a pubspec assets snippet, CMake and a JSON model index.

    etforge manifest    writes artifacts/<pipeline>/manifests/{models.g.dart, pubspec_assets.yaml,
                        models.cmake, index.json, etforge_models.h}

One list of variants feeds every manifest: the plan's cells whose outcome ships
(etforge.publish.outcome: ok, provisional or on-device), with the outcome's evidence
(size, sha256, delegates and input dtypes from the export's current record,
output shapes from the capture's) and its verdict: validated here (status ok or
provisional, the SQNR and the data it was measured on) or to be checked on the
device (its .bpte, sha256 and tolerances). Every other cell (failed, expected
failure, unexpectedly passing, skipped, not built or validated yet, rejected by
its scheme) is left out of every file and listed in a comment (``excluded`` in
index.json) with its status.

The files are deterministic (plan order, sorted keys, no timestamps), so an
unchanged plan yields byte-identical manifests. The task is a matrix-wide stage
(etforge.pipeline.stages): its key is a digest of everything rendered (the
context below, :func:`manifest_content`), the templates and its code, computed
when doit asks whether the task is up to date, i.e. after the exports it
depends on have run. Rendering is etforge.publish.manifests.render.

Options come from an optional ``manifests:`` section of pipeline.yaml
(``plan.manifests``, checked by etforge.config.manifest_options) over
etforge.config.defaults and, for the platforms' fallback orders, the backend recipes'
``manifest`` (``platforms``, ``rank``)::

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

import re

from etforge.config import defaults
from etforge.config.manifest_options import check_options
from etforge.config.model import Plan
from etforge.core.errors import EtforgeError
from etforge.core.text import one_line
from etforge.pipeline.layout import layout_of
from etforge.publish import outcome, outcome_views
from etforge.publish.manifests import cpp_header, ship_fields
from etforge.publish.manifests.interface import cell_interface
from etforge.publish.manifests.llm_fields import llm_spec
from etforge.publish.manifests.naming import (
    DART_RESERVED,
    cmake_identifier,
    dart_identifier,
    data_file_name,
    fallback_order,
    unique,
)
from etforge.publish.manifests.program_check import check_program
from etforge.publish.manifests.selective import pipeline_fields, variant_fields
from etforge.publish.outcome_memo import RunOutcomes


class ManifestError(EtforgeError):
    """A manifest cannot be written (bad option, two variants with one file name)."""


def _targets(cell, delegate: str) -> dict:
    """{source, wheel}: the CMake targets an app links for ``delegate`` (its backend recipe's runtime)."""
    return next((m.cmake_targets for m in cell.backend.members if delegate in m.delegates), {})


def options_for(plan: Plan) -> dict:
    """The resolved ``manifests:`` options: defaults (etforge.config.defaults), then the pipeline's section."""
    raw = plan.manifests
    problems = check_options(raw, list(plan.backends), plan.recipe_path.available("backend"), list(plan.quantizations))
    if problems:
        path, message = problems[0]
        raise ManifestError(f"manifests.{'.'.join(str(p) for p in path)}: {message}".replace(".:", ":"))
    # every backend recipe's place in each platform's order (its manifest: platforms, rank), then the pipeline's
    platforms = {**plan.recipe_path.platform_order(), **(raw.get("platforms") or {})}
    return {
        **defaults.MANIFEST_OPTIONS,
        **{k: raw[k] for k in defaults.MANIFEST_OPTIONS if k in raw},
        "platforms": {p: list(platforms[p]) for p in sorted(platforms)},
        "models": raw.get("models") or {},
    }


def _input_size(model, config: dict):
    if "input_size" in config:
        return config["input_size"]
    shape: tuple = model.inputs[0].shape if model.inputs else ()
    if len(shape) == 4 and shape[-1] == shape[-2]:
        return shape[-1]  # NCHW image with square sides, as the store's inputSize
    return None


def _join_url(base: str, name: str) -> str:
    return f"{base.rstrip('/')}/{name}" if base else name


def _data_file(cell, program, layout, options: dict) -> dict | None:
    """A variant's external weights as the manifests name them: by content (naming.data_file_name)."""
    if not program.data_sha256:
        return None
    name = data_file_name(program.data_sha256)
    return {
        "file": name,
        "sha256": program.data_sha256,
        "size": int(program.data_size_bytes or 0),
        "path": layout.shown(layout.ptd_path(cell)),  # the cell's own copy, relative to artifacts/<pipeline>/
        "asset": f"{options['assets_dir'].strip('/')}/{name}",
        "remote_url": _join_url(options["base_url"], name),
    }


def _layers(quantize) -> dict | None:
    """What a weight-group scheme quantized, kept in float and why (its quantize record), or None."""
    layers = quantize.layers if quantize is not None else {}
    return {k: layers.get(k) for k in ("quantized", "float", "kept_float")} if layers else None


def shared_data_files(variants: list) -> list:
    """Each distinct .ptd once, in first-use order, with the programs (.pte files) and variants that need it."""
    by_sha: dict = {}
    for v in variants:
        data = v["data_file"]
        if data is None:
            continue
        entry = by_sha.setdefault(data["sha256"], {**data, "programs": [], "variants": []})
        entry["programs"].append(v["file"])
        entry["variants"].append(v["id"])
    by_name: dict = {}
    for entry in by_sha.values():
        if entry["file"] in by_name:  # two sha256 with one 16-digit prefix: never silently merge them
            raise ManifestError(
                f"the .ptd files {by_name[entry['file']]} and {entry['sha256']} would both ship as {entry['file']}"
            )
        by_name[entry["file"]] = entry["sha256"]
    return list(by_sha.values())


def build_context(
    plan: Plan, cells=None, host: dict | None = None, results: dict | None = None, timings: bool = True
) -> dict:
    """Everything the manifests are rendered from (JSON-serializable; its digest is the key).

    ``cells``: the cells to describe (default: every cell of the plan); ``host``: read the
    benchmark records too (a failed benchmark fails its cell, etforge.publish.outcome); ``results``:
    their outcomes (cell name -> CellOutcome) when the caller has them already; ``timings``: rank each
    platform's default by the host latency measured (False: by the declared order alone, as a
    release does, whose files must not vary with timings).
    """
    options = options_for(plan)
    layout = layout_of(plan)
    cells = plan.cells if cells is None else tuple(cells)
    results = {c.name: (results or {}).get(c.name) or outcome.cell_outcome(plan, c, host) for c in cells}
    built, excluded = [], []
    for cell in cells:
        result = results[cell.name]
        if result.ships:
            built.append((cell, result))
        else:
            excluded.append(
                {
                    "cell": cell.name,
                    "status": result.status,
                    "reason": one_line(outcome_views.listing_reason(result, layout_of(plan))),
                }
            )
    models_of_cells = {c.model.name for c in cells}
    excluded += [
        {"cell": r.name, "status": "rejected", "reason": one_line(r.reason)}
        for r in plan.rejected
        if r.model in models_of_cells
    ]

    names = [c.name for c, _ in built]
    model_names = list(dict.fromkeys(c.model.name for c, _ in built))
    dart_models = unique(model_names, dart_identifier, DART_RESERVED)
    dart_variants = unique(
        names, lambda n: dart_identifier(n.replace("/", "_")), DART_RESERVED | set(dart_models.values())
    )
    cmake_variants = unique(names, lambda n: cmake_identifier(n.replace("/", "_")))
    cmake_models = unique(model_names, cmake_identifier)

    variants = []
    for cell, result in built:
        facts = result.facts
        program = facts.program
        assert program is not None  # a cell that ships has a current export
        io = cell_interface(cell, facts)  # the one description every manifest shows (interface.py)
        delegates = list(program.delegates or cell.backend.delegates)
        file_name = f"{cell.stem}.pte"
        description = cell.backend.primary.description
        if len(cell.backend.members) > 1:
            description += " with fallback to " + ", ".join(m.recipe for m in cell.backend.members[1:])
        variants.append(
            {
                "id": cell.name,
                "dart_id": dart_variants[cell.name],
                "cmake_id": cmake_variants[cell.name],
                "model": cell.model.name,
                "backend": cell.backend.name,
                "recipe": cell.backend.primary.recipe,
                "quantization": cell.quant.name,
                "file": file_name,
                "path": layout.shown(layout.pte_path(cell)),  # relative to artifacts/<pipeline>/
                "asset": f"{options['assets_dir'].strip('/')}/{file_name}",
                "remote_url": _join_url(options["base_url"], file_name),
                "sha256": program.sha256,  # the export record's: the release packs only a file with this hash
                "size": int(program.size_bytes or 0),
                "delegates": delegates,
                "backend_targets": [t for d in delegates if (t := _targets(cell, d).get("source"))],
                "package_targets": [t for d in delegates if (t := _targets(cell, d).get("wheel"))],
                "executorch_version": program.executorch_version or plan.toolchain.get("executorch") or "",
                "inputs": io["inputs"],  # the first method's: name, shape, dtype[, range][, dynamic]
                "outputs": io["outputs"],  # named by pytree path (etforge.config.io_spec)
                # every method with its inputs and outputs (one, forward, unless the model declares several)
                "methods": io["methods"],
                "cmake_methods": unique([m["name"] for m in io["methods"]], cmake_identifier),
                # a decoder-only LLM: its methods, runner metadata and KV cache (manifests/llm.py); else None
                "llm": llm_spec(cell, program),
                "description": description,
                "verdict": outcome_views.verdict(result, cell, layout),
                # external weights: the one .ptd the program needs (shared by the cells with the same weights)
                "data_file": _data_file(cell, program, layout, options),
                # A weight-group scheme's layers: how many it quantized, which it kept in float and why.
                "layers": _layers(facts.quantize),
                # what the program costs (bytes, planned memory) and which runtimes load it (ship_fields.py)
                "costs": ship_fields.costs(program),
                "runtime": ship_fields.runtime(program, plan.toolchain.get("executorch") or ""),
                "capabilities": ship_fields.capabilities(cell, program),
            }
        )
        # selective build: its operators outside delegates and the wheel libraries it needs
        oplist = layout.shown(layout.oplist_path(cell))
        variants[-1].update(variant_fields(program, oplist, variants[-1]["package_targets"]))
        problem = check_program(cell.name, layout.pte_path(cell), variants[-1])  # what the program says of itself
        if problem:
            raise ManifestError(problem)
    by_file: dict = {}
    for v in variants:
        if v["file"] in by_file:
            raise ManifestError(
                f"{by_file[v['file']]} and {v['id']} would both ship as {v['file']}; "
                "rename a model or backend in pipeline.yaml"
            )
        by_file[v["file"]] = v["id"]

    data_files = shared_data_files(variants)
    models = []
    for name in model_names:
        own = [v for v in variants if v["model"] == name]
        config = options["models"].get(name) or {}
        platforms = {**options["platforms"], **(config.get("platforms") or {})}
        fallback = {
            p: [v["id"] for v, _ in fallback_order(own, platforms[p], chains_by_recipe=True)] for p in sorted(platforms)
        }
        for v in own:
            v["platforms"] = sorted(p for p, ids in fallback.items() if v["id"] in ids and p != "default")
        # host latency only where the caller wants timings (a release leaves them out: reproducible)
        latency = {v["id"]: results[v["id"]].facts.latency_fastest_ms for v in own} if timings else {}
        labels_file = config.get("labels_file")
        models.append(
            {
                "name": name,
                "dart_id": dart_models[name],
                "cmake_id": cmake_models[name],
                "variants": [v["id"] for v in own],
                "fallback": fallback,
                # per platform, the variant to pick first and why (ship_fields.platform_defaults)
                "defaults": ship_fields.platform_defaults(fallback, latency),
                "category": config.get("category", name),
                "input_size": _input_size(plan.models[name], config),
                "labels_file": labels_file,
                "labels_url": config.get("labels_url")
                or (_join_url(options["base_url"], labels_file) if labels_file else None),
            }
        )
    delegates = sorted({d for v in variants for d in v["delegates"]})
    targets = {d: _targets(cell, d) for cell, _ in built for d in cell.backend.delegates}
    for d in delegates:
        if not re.match(r"^[A-Za-z][A-Za-z0-9_]*$", d):
            raise ManifestError(f"delegate id {d!r} cannot name a CMake variable")
    return {
        "pipeline": plan.name,
        "version": plan.version,
        "source": plan.source.path.name,
        "executorch_version": plan.toolchain.get("executorch") or "",
        "options": {k: options[k] for k in defaults.MANIFEST_OPTIONS},
        "platforms": sorted({p for m in models for p in m["fallback"]}),
        "variants": variants,
        "data_files": data_files,
        "models": models,
        "excluded": excluded,
        # the union over the shipped programs (selected_operators.yaml, ETFORGE_PACKAGE_COMPONENTS)
        "selective": pipeline_fields(
            variants, {c.name: dict(r.facts.program.operators if r.facts.program else {}) for c, r in built}
        ),
        "delegate_targets": {
            d: [t for t in (targets.get(d, {}).get(k) for k in ("wheel", "source")) if t] for d in delegates
        },
        # The C++ runner's header, in the desktop Linux fallback order of the Dart manifest.
        "cpp_header": cpp_header.header_context(
            plan,
            cells,
            order=tuple(options["platforms"].get("linux", ())),
            outcomes=results,
        ),
    }


def manifest_content(plan: Plan, cells, host: dict | None, outcomes: RunOutcomes | None = None) -> dict:
    """What the manifest stage renders (its digest is the key): every cell of the plan, whatever the
    selection, so that a sub-matrix run never drops the other cells' shipped programs (``outcomes``:
    the run's, etforge.publish.outcome_memo)."""
    return build_context(plan, host=host, results=outcomes.by_name() if outcomes is not None else None)
