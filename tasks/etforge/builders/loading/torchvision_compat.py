"""Make ``import torchvision`` work beside a CPU-only torch.

PyPI's torchvision 0.28.0 is a CUDA build: its ``_C.so`` fails to load next to
the CPU torch wheel, and ``torchvision/_meta_registrations.py`` then dies with
``operator torchvision::nms does not exist``. Only the pure-Python model
definitions are needed here, so when (and only when) the real ops are missing
we define the ``nms``/``qnms`` schemas with a pure-torch CPU ``nms``.

A user's factory may ``import torchvision`` itself: etforge runs this shim before importing any
project module (etforge.builders.loading.model_loading) and before loading a captured program, in every
task process, so that import never depends on which module happened to run first.
"""

from __future__ import annotations


def _nms_cpu(dets, scores, iou_threshold: float):
    import torch

    order = scores.argsort(descending=True)
    x1, y1, x2, y2 = dets.unbind(1)
    areas = (x2 - x1).clamp(min=0) * (y2 - y1).clamp(min=0)
    keep = []
    suppressed = torch.zeros(len(dets), dtype=torch.bool)
    for i in order.tolist():
        if suppressed[i]:
            continue
        keep.append(i)
        w = (torch.minimum(x2[i], x2) - torch.maximum(x1[i], x1)).clamp(min=0)
        h = (torch.minimum(y2[i], y2) - torch.maximum(y1[i], y1)).clamp(min=0)
        inter = w * h
        iou = inter / (areas[i] + areas - inter)
        suppressed |= iou > iou_threshold
    return torch.tensor(keep, dtype=torch.long)


def import_torchvision():
    """Import and return torchvision, defining its missing ops first if needed."""
    import torch

    if not hasattr(torch.ops.torchvision, "nms"):
        _try_real_ops()
    fallback = not hasattr(torch.ops.torchvision, "nms")
    if fallback:
        _define_fallback_ops(torch)
    import torchvision

    if getattr(torch, "_etforge_torchvision_lib", None) is not None:
        # torchvision.ops.nms asks extension._has_ops() (False when _C.so did not load) before calling
        # torch.ops.torchvision.nms; with the fallback defined it exists, so detection models run eagerly.
        torchvision.extension._has_ops = lambda: True
    return torchvision


def torchvision_installed() -> bool:
    import importlib.util

    return importlib.util.find_spec("torchvision") is not None


def _try_real_ops() -> None:
    import importlib.util
    from pathlib import Path

    import torch

    spec = importlib.util.find_spec("torchvision")
    if spec is None or not spec.submodule_search_locations:
        return
    for candidate in Path(list(spec.submodule_search_locations)[0]).glob("_C*.so"):
        try:
            torch.ops.load_library(str(candidate))
            return
        except OSError:
            return  # CUDA-linked build beside a CPU torch: use the fallback


def _define_fallback_ops(torch) -> None:
    # The Library object must outlive this call or the definitions vanish;
    # torch keeps a reference in its registry once ops are registered with it.
    lib = torch.library.Library("torchvision", "DEF")
    for op in ("nms", "qnms"):
        lib.define(f"{op}(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
        lib.impl(op, _nms_cpu, "CPU")
    torch._etforge_torchvision_lib = lib  # keep alive for the process lifetime
