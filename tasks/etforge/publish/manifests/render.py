"""Render the app manifests from their context (etforge.publish.manifests.context).

    models.g.dart         Dart (Flutter): EtforgeModels with every variant and fallback order
    pubspec_assets.yaml   the assets snippet for pubspec.yaml
    models.cmake          CMake variables per variant, with the targets of its delegates
    index.json            the community Flutter model store's index format
    etforge_models.h      the C++ runner's header (etforge.publish.manifests.cpp_header)

jinja2 is imported only to render (etforge.publish.templates); this module must not
import torch or executorch.
"""

from __future__ import annotations

import json
from pathlib import Path

from etforge.core.atomic import atomic_write_text
from etforge.pipeline.results import BuildResult
from etforge.pipeline.stage_results import ManifestResult
from etforge.publish import templates
from etforge.publish.manifests import cpp_header
from etforge.publish.manifests.selective import SELECTED, render_selection

DART, PUBSPEC, CMAKE, INDEX = "models.g.dart", "pubspec_assets.yaml", "models.cmake", "index.json"
HEADER = cpp_header.HEADER_NAME  # read by cpp/runner
TEMPLATES = {DART: "models.g.dart.j2", PUBSPEC: "pubspec_assets.yaml.j2", CMAKE: "models.cmake.j2"}
FILES = (DART, PUBSPEC, CMAKE, INDEX, HEADER, SELECTED)
INDEX_FORMAT = "1.0"  # the community Flutter model store's index.json "version"


def index_document(context: dict) -> dict:
    """index.json, in the shape of the community Flutter model store's index."""
    models = {m["name"]: m for m in context["models"]}
    entries = []
    for v in context["variants"]:
        m = models[v["model"]]
        entries.append(
            {
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
                "layers": v.get("layers"),
                "inputs": v["inputs"],  # name, shape, dtype[, range] (etforge.config.io_spec)
                "outputs": v["outputs"],  # name, pytree path, shape, dtype
                "methods": v["methods"],  # [{name, inputs, outputs}]; the two above are the first method's
                # external weights: the name of the one .ptd (in dataFiles) to load it with, or null
                "dataFile": v["data_file"]["file"] if v["data_file"] else None,
                # bytes by part, planned memory per method, delegated subgraphs (ship_fields.costs)
                "costs": v["costs"],
                # the ExecuTorch that built it, the program's schema version, the runtimes it is
                # guaranteed to load on (ExecuTorch's compatibility policy)
                "runtime": v["runtime"],
                # what a device must have: min RAM, delegates, Core ML target, QNN SoC (ship_fields.capabilities)
                "capabilities": v["capabilities"],
                # the platforms whose default (first pick) this variant is, each with why
                "defaultFor": {p: d["reason"] for p, d in m["defaults"].items() if d["variant"] == v["id"]},
                # selective build: operators outside delegates, the wheel libraries to link
                "operators": v["operators"],
                "packageComponents": v["package_components"],
            }
        )
        if v.get("llm"):  # a decoder-only LLM: methods, metadata values, KV cache (manifests/llm.py)
            entries[-1]["llm"] = v["llm"]
    return {
        "version": INDEX_FORMAT,
        "generated": "",  # the store's parser needs the key; a wall-clock time would break reproducibility
        "executorchVersion": context["executorch_version"],
        "pipeline": context["pipeline"],
        "pipelineVersion": context["version"],
        "baseUrl": context["options"]["base_url"],
        "models": entries,
        # Each .ptd once, named by its sha256, with the programs that need it.
        "dataFiles": [
            {
                "name": d["file"],
                "hash": d["sha256"],
                "size": d["size"],
                "sizeMB": round(d["size"] / (1024 * 1024), 2),
                "remoteUrl": d["remote_url"],
                "path": d["path"],
                "programs": d["programs"],
            }
            for d in context["data_files"]
        ],
        "labels": [],
        "backends": {v["backend"]: {"description": v["description"]} for v in context["variants"]},
        "excluded": context["excluded"],
    }


def render(context: dict) -> dict:
    """File name -> text of every manifest."""
    env = templates.environment()
    by_id = {v["id"]: v for v in context["variants"]}
    out = {name: env.get_template(template).render(**context, by_id=by_id) for name, template in TEMPLATES.items()}
    out[INDEX] = json.dumps(index_document(context), indent=2, sort_keys=True, ensure_ascii=False) + "\n"
    out[HEADER] = cpp_header.render_context(context["cpp_header"])
    out[SELECTED] = render_selection(context["selective"]["selection"])  # the shipped programs' operators
    return out


def write_manifests(context: dict, directory: Path) -> dict:
    """Render and write every manifest atomically into ``directory``; name -> path."""
    paths = {}
    for name, text in render(context).items():
        paths[name] = Path(directory) / name
        atomic_write_text(paths[name], text)
    return paths


def manifest_stage(context: dict, workdir: Path) -> BuildResult:
    """The manifest stage's builder: every file rendered into ``workdir``."""
    files = write_manifests(context, workdir)
    return BuildResult(
        files=files,
        result=ManifestResult(
            variants=len(context["variants"]), excluded=tuple(e["cell"] for e in context["excluded"])
        ),
    )
