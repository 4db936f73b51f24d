"""Selective build in the manifests: what kernels the shipped programs need, per variant and in all.

Per variant (models.cmake ``ETFORGE_<V>_...``, index.json): the operators it runs outside its
delegates, the path of its own selected_operators.yaml (written by its export, beside the .pte),
the pip wheel's components it needs (etforge.program.kernels) and the operators no wheel library
registers. Per pipeline: ``selected_operators.yaml`` in the manifest folder, the union over every
shipped program in ExecuTorch's selective-build format (what ``gen_all_oplist`` makes of the
per-program files), and the union of the components.

This module must not import torch or executorch.
"""

from __future__ import annotations

import yaml

from etforge.program import kernels

SELECTED = "selected_operators.yaml"


def variant_fields(program, oplist_path: str, package_targets: list) -> dict:
    """The selective-build fields of one shipped variant (``program``: its export's result)."""
    operators = dict(program.operators)
    _, unresolved = kernels.kernel_components(operators)
    return {
        "operators": sorted(operators),
        "selected_operators": oplist_path,  # relative to artifacts/<pipeline>/
        "package_components": list(kernels.package_components(operators, package_targets)),
        "unresolved_operators": list(unresolved),
    }


def pipeline_fields(variants: list, operators_of: dict) -> dict:
    """The union over ``variants`` (manifest variants; ``operators_of``: variant id -> its op -> keys)."""
    return {
        "selection": kernels.union_selection({v["id"]: operators_of[v["id"]] for v in variants}),
        "package_components": list(kernels.union_components(v["package_components"] for v in variants)),
        "unresolved_operators": sorted({op for v in variants for op in v["unresolved_operators"]}),
    }


def render_selection(document: dict) -> str:
    """A selected_operators.yaml document as upstream writes it (yaml.safe_dump, block style)."""
    return yaml.safe_dump(document, default_flow_style=False)
