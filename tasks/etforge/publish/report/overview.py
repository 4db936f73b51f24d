"""The report's first view: a model x backend matrix coloured by state, the best variant per platform marked.

    best_per_platform(plan, rows) -> model -> platform -> {"variant", "ranked_by", "reason"}
    overview(plan, rows, colours) -> {"backends": [...], "models": [{"name", "cells": [...]}]}

"Best" is what the manifests name each platform's default (etforge.publish.manifests.ship_fields
platform_defaults): among the shipped variants in the platform's fallback order, the fastest
measured on the build host when the order's first choice was measured, else the first of the
declared order. Latency is the report's (``rows``' fastest run, as the manifests rank), so a
report without timings ranks by the declared order alone.
"""

from __future__ import annotations

from etforge.publish.manifests.context import options_for
from etforge.publish.manifests.naming import fallback_order
from etforge.publish.manifests.ship_fields import platform_defaults
from etforge.publish.outcome import SHIPS


def best_per_platform(plan, rows: list) -> dict:
    options = options_for(plan)
    out = {}
    for model in dict.fromkeys(r["model"] for r in rows):
        shipped = [r for r in rows if r["model"] == model and r["status"] in SHIPS]
        if not shipped:
            continue
        variants = []
        for r in shipped:
            backend = plan.backends[r["backend"]]
            chain = [m.recipe for m in backend.members] if len(backend.members) > 1 else []
            variants.append(
                {
                    "id": r["cell"],
                    "backend": r["backend"],
                    "recipe": backend.primary.recipe,
                    "chain": chain,
                    "quantization": r["quant"],
                }
            )
        config = options["models"].get(model) or {}
        platforms = {**options["platforms"], **(config.get("platforms") or {})}
        fallback = {
            p: [v["id"] for v, _ in fallback_order(variants, platforms[p], chains_by_recipe=True)]
            for p in sorted(platforms)
        }
        out[model] = platform_defaults(fallback, {r["cell"]: r["fastest_ms"] for r in shipped})
    return out


def overview(plan, rows: list, colours: dict, badges: dict) -> dict:
    """The matrix: one row per model, one column per backend, one chip per scheme in each cell."""
    best = best_per_platform(plan, rows)
    backends = [b for b in plan.backends if any(r["backend"] == b for r in rows)]
    backends += sorted({r["backend"] for r in rows} - set(backends))
    models = []
    for model in dict.fromkeys(r["model"] for r in rows):
        marks: dict = {}
        for platform, choice in (best.get(model) or {}).items():
            marks.setdefault(choice["variant"], []).append((platform, choice["reason"]))
        cells = []
        for backend in backends:
            chips = []
            for r in rows:
                if r["model"] != model or r["backend"] != backend:
                    continue
                best_for = marks.get(r["cell"], [])
                title = f"{r['cell']}: {r['status']}" + (f" ({r['note']})" if r["note"] else "")
                title += "".join(f"; best for {p}: {why}" for p, why in best_for)
                chips.append(
                    {
                        "cell": r["cell"],
                        "quant": r["quant"],
                        "status": r["status"],
                        "badge": badges.get(r["status"], "other"),
                        "colour": colours.get(r["quant"], "#8c959f"),
                        "best_for": [p for p, _ in best_for],
                        "title": title,
                    }
                )
            cells.append({"backend": backend, "chips": chips})
        models.append({"name": model, "cells": cells})
    return {"backends": backends, "models": models, "best": best}
