"""A C++ header describing the built variants of each model, for cpp/runner.

    render_header(plan, cells) -> text of etforge_models.h

Per model, the header lists its variants in a desktop-Linux fallback order
(vulkan, then openvino, then xnnpack, then portable by default). An entry names a
backend of the pipeline or the recipe of a single-recipe backend, optionally as
``backend/quantization``; a chain backend is matched by its own name only.
Variants the order does not mention follow the listed ones in plan order,
flagged ``listed = false``, so a runner still sees every program it could load
(it skips those whose delegate its runtime lacks); ``append_unlisted=False``
leaves them out.

A variant is a cell whose outcome ships (etforge.publish.outcome: ok, provisional or
on-device, the rule every manifest and the release follow); the rest are named
in a comment with their status. Everything comes from the outcome's evidence:
size, sha256, delegates and input dtypes from the export's record, output
shapes from the capture's, and the verdict (validated here with its SQNR and
the data it was measured on, or to be checked on device with its .bpte and
tolerances). The text is deterministic (plan order, no timestamps, no absolute
paths).

This module must not import torch or executorch; jinja2 is imported only to render.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

from etforge.core.atomic import atomic_write_text
from etforge.core.errors import EtforgeError
from etforge.core.text import one_line
from etforge.pipeline.layout import layout_of
from etforge.publish import outcome, outcome_views, templates
from etforge.publish.literals import C_COMMENT_LIMIT
from etforge.publish.manifests import ship_fields
from etforge.publish.manifests.interface import cell_interface
from etforge.publish.manifests.llm_fields import llm_spec
from etforge.publish.manifests.naming import data_file_name, fallback_order

TEMPLATE = "etforge_models.h.j2"
HEADER_NAME = "etforge_models.h"
FORMAT_VERSION = 1
# Without an order: the desktop Linux fallback order of the recipes (their manifest: platforms, rank).
DEFAULT_ORDER = None
LAYOUTS = ("tree", "flat")  # tree: <model>/<stem>.pte as under artifacts/<pipeline>/; flat: <stem>.pte


class HeaderError(EtforgeError):
    """The header cannot be written (bad order entry, unknown layout)."""


def _check_order(plan, order) -> list:
    """The order as a list of strings. A backend name the pipeline does not declare is
    allowed (the default names backends a pipeline may not build); a quantization must exist."""
    if isinstance(order, str):
        raise HeaderError(f"fallback order {order!r}: expected a list of backend names")
    entries = [str(e) for e in order]
    for entry in entries:
        backend, _, quant = entry.partition("/")
        if not backend:
            raise HeaderError(f"fallback order entry {entry!r}: expected a backend name")
        if quant and quant not in plan.quantizations:
            raise HeaderError(
                f"fallback order entry {entry!r}: unknown quantization {quant!r}; "
                f"declared: {', '.join(plan.quantizations)}"
            )
    return entries


def _data_file(cell, program, layout: str) -> str:
    if not program.data_sha256:
        return ""
    return data_file_name(program.data_sha256) if layout == "flat" else f"{cell.model.name}/{cell.stem}.ptd"


def _runtime_fields(program, fallback_version: str) -> dict:
    """built_by, schema_version, runtime_min/max (the policy's load window) and planned_bytes."""
    runtime, costs = ship_fields.runtime(program, fallback_version), ship_fields.costs(program)
    window = runtime["load_window"] or ("", "")
    return {
        "built_by": runtime["executorch_version"],
        "schema_version": runtime["schema_version"] or 0,
        "runtime_min": window[0],
        "runtime_max": window[1],
        "planned_bytes": costs["planned_peak_bytes"] or 0,
    }


def header_context(
    plan,
    cells=None,
    order=DEFAULT_ORDER,
    *,
    layout: str = "tree",
    append_unlisted: bool = True,
    host: dict | None = None,
    outcomes=None,
) -> dict:
    """Everything the header is rendered from (plain JSON-serializable data).

    ``cells``: the cells to consider (default: every cell of the plan);
    ``order``: fallback order, best first; ``layout``: how ``file`` is spelled,
    relative to the models directory a runner is given (``tree``: that directory is
    artifacts/<pipeline>/; ``flat``: the .pte files side by side, as models.cmake
    installs them); ``host``: read the benchmark records too (etforge.publish.outcome); ``outcomes``:
    the cells' outcomes when the caller has them already (name -> CellOutcome).
    """
    if layout not in LAYOUTS:
        raise HeaderError(f"layout {layout!r}: expected one of {', '.join(LAYOUTS)}")
    if order is None:
        order = plan.recipe_path.platform_order().get("linux", ())
    order = _check_order(plan, order)
    cells = plan.cells if cells is None else tuple(cells)
    variants, excluded = [], []
    for cell in cells:
        result = (outcomes or {}).get(cell.name) or outcome.cell_outcome(plan, cell, host)
        if not result.ships:
            excluded.append(
                {
                    "cell": cell.name,
                    "reason": f"{result.status}: {outcome_views.listing_reason(result, layout_of(plan))}",
                }
            )
            continue
        program = result.facts.program
        assert program is not None  # a cell that ships has a current export
        io = cell_interface(cell, result.facts)  # what index.json, the Dart and the CMake show (interface.py)
        stem = f"{cell.stem}.pte"
        verdict = outcome_views.verdict(result, cell, layout_of(plan))
        variants.append(
            {
                "id": cell.name,
                "model": cell.model.name,
                "backend": cell.backend.name,
                "recipe": cell.backend.primary.recipe,
                "chain": [m.recipe for m in cell.backend.members] if len(cell.backend.members) > 1 else [],
                "quantization": cell.quant.name,
                "file": stem if layout == "flat" else f"{cell.model.name}/{stem}",
                "sha256": str(program.sha256),
                "size": int(program.size_bytes or 0),
                "delegates": [str(d) for d in program.delegates or cell.backend.delegates],
                # The first method's inputs and outputs (the same lists as methods[0]'s).
                "inputs": io["inputs"],
                # -1: unknown (no current capture record); the runner then takes the program's count.
                "num_outputs": len(io["outputs"]) if io["outputs_known"] else -1,
                "outputs": io["outputs"],
                # Every method: name, inputs, outputs (empty: unknown, num_outputs -1 in C++).
                "methods": io["methods"],
                "llm": llm_spec(cell, program),  # a decoder-only LLM's methods, metadata and KV cache, else None
                "verdict": verdict["status"],
                "validated_on": verdict.get("inputs") or "",
                # +inf: identical to eager; None (NaN in C++): not measured here
                "sqnr_db": math.inf if verdict.get("exact") else verdict.get("sqnr_db"),
                "max_abs_error": verdict.get("max_abs_error"),
                "bundle_file": verdict.get("bundle") or "",
                "bundle_sha256": verdict.get("bundle_sha256") or "",
                # external weights: the .ptd to load it with ("" when inline), spelled like ``file``
                # (tree: the cell's copy beside its .pte; flat: the shared name models.cmake installs)
                "data_file": _data_file(cell, program, layout),
                "data_sha256": program.data_sha256 or "",
                "rtol": verdict.get("rtol"),
                "atol": verdict.get("atol"),
                **_runtime_fields(program, plan.toolchain.get("executorch") or ""),
            }
        )
    excluded += [
        {"cell": r.name, "reason": f"rejected: {one_line(r.reason, C_COMMENT_LIMIT)}"}
        for r in plan.rejected
        if cells is plan.cells or any(c.model.name == r.model for c in cells)
    ]
    models = []
    for name in dict.fromkeys(v["model"] for v in variants):
        own = [
            {**v, "listed": listed}
            for v, listed in fallback_order(
                [v for v in variants if v["model"] == name],
                order,
                chains_by_recipe=False,
                append_unlisted=append_unlisted,
            )
        ]
        if own:
            models.append({"name": name, "variants": own})
    return {
        "format": FORMAT_VERSION,
        "pipeline": plan.name,
        "version": plan.version,
        "source": plan.source.path.name,
        "executorch_version": plan.toolchain.get("executorch") or "",
        "order": order,
        "layout": layout,
        "models": models,
        "has_unlisted": any(not v["listed"] for m in models for v in m["variants"]),
        "excluded": excluded,
    }


# ---------------------------------------------------------------- rendering


def render_context(context: dict) -> str:
    return templates.render(TEMPLATE, **context)


def render_header(
    plan,
    cells=None,
    order=DEFAULT_ORDER,
    *,
    layout: str = "tree",
    append_unlisted: bool = True,
    host: dict | None = None,
) -> str:
    """The text of etforge_models.h for ``cells`` (default: all) of ``plan``; see header_context."""
    return render_context(header_context(plan, cells, order, layout=layout, append_unlisted=append_unlisted, host=host))


def write_header(plan, path: Path, cells=None, order=DEFAULT_ORDER, **kwargs) -> Path:
    """Render and write the header atomically (unchanged text leaves the file untouched)."""
    text = render_header(plan, cells, order, **kwargs)
    path = Path(path)
    try:
        if path.read_text(encoding="utf-8") == text:
            return path  # keep the mtime: a C++ build that includes it need not recompile
    except OSError:
        pass
    atomic_write_text(path, text)
    return path


def main(argv=None) -> int:
    """python -m etforge.publish.manifests.cpp_header [pipeline.yaml] [-o PATH] [--order a,b,...] [--layout tree|flat]"""
    import argparse

    from etforge.config.resolve import resolve
    from etforge.core.errors import PipelineError

    parser = argparse.ArgumentParser(
        prog="python -m etforge.publish.manifests.cpp_header", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("pipeline", nargs="?", default="pipeline.yaml")
    parser.add_argument("-o", "--output", help=f"write here (default: artifacts/<pipeline>/manifests/{HEADER_NAME})")
    parser.add_argument("--order", default=None, help="fallback order, comma-separated (default: Linux's)")
    parser.add_argument("--layout", choices=LAYOUTS, default="tree")
    parser.add_argument("--listed-only", action="store_true", help="leave out variants the order does not name")
    args = parser.parse_args(argv)
    try:
        from etforge.config.machine import host_fingerprint

        plan = resolve(Path(args.pipeline))
        out = Path(args.output) if args.output else layout_of(plan).manifest_dir / HEADER_NAME
        write_header(
            plan,
            out,
            order=[e.strip() for e in args.order.split(",") if e.strip()] if args.order else None,
            layout=args.layout,
            append_unlisted=not args.listed_only,
            host=host_fingerprint(),
        )
    except (PipelineError, HeaderError) as exc:
        print(f"etforge: error: {exc}", file=sys.stderr)
        return 3 if isinstance(exc, PipelineError) else 1
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
