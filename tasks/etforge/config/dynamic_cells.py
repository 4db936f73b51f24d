"""Cells the plan refuses for their shape: dynamic dims a backend cannot lower, or several
methods under a calibrated scheme. Planning code: no torch or executorch."""

from __future__ import annotations

from etforge.config.matrix import reject_refused


def dynamic_refusal(cell) -> str | None:
    """Why ``cell`` (a model with dynamic dims or several methods) cannot be built, or None."""
    if cell.model.multi_method:
        if cell.transform is not None and cell.transform.method == "pt2e":
            return (
                "several methods are not calibrated yet (PT2E quantizes one exported graph): "
                "use a weight scheme (8da4w, 8da8w, fp16) for this model"
            )
    if not any(i.dims for _, inputs in cell.model.methods for i in inputs):
        return None
    unable = [m.recipe for m in cell.backend.members if not m.dynamic_shapes]
    if unable:
        return (
            f"{', '.join(unable)} cannot lower dynamic shapes (its recipe has no `dynamic_shapes: true`; "
            "OpenVINO and Arm TOSA fail on SymInt sizes): give the model fixed shapes for it"
        )
    return None


def reject_dynamic(doc, cells: tuple, rejected: tuple) -> tuple[tuple, tuple]:
    return reject_refused(doc, cells, rejected, dynamic_refusal)
