"""Build a model's nn.Module from its spec. Runs inside task actions only."""

from __future__ import annotations

import importlib
import inspect
import sys
from pathlib import Path

from etforge.core.errors import BadValue

# Random-init BatchNorm statistics make deep nets (MobileNet) collapse their
# outputs to ~1e-9, which makes numeric comparison meaningless.
BN_CALIBRATION_BATCHES = 4
BN_CALIBRATION_BATCH_SIZE = 4
SEED = 0


def build_model(spec, root: Path):
    """The eval-mode nn.Module for a ModelSpec, deterministic for a given key."""
    import torch

    torch.manual_seed(SEED)
    if "python" in spec.source:
        model = _from_factory(spec.source["python"], spec.kwargs, root)
    elif "transformers" in spec.source:  # its checkpoint is a directory: loaded by hf_models
        from etforge.builders.loading.hf_models import build_hf_model

        return build_hf_model(spec, root)
    else:
        model = torchvision_model(spec.source["torchvision"], spec.kwargs)
    if not isinstance(model, torch.nn.Module):
        raise BadValue(f"model factory returned {type(model).__name__}, not torch.nn.Module")
    if spec.weights:
        state = torch.load(root / spec.weights["path"], map_location="cpu", weights_only=True)
        if isinstance(state, dict) and "state_dict" in state:
            state = state["state_dict"]
        model.load_state_dict(state)
    elif "torchvision" in spec.source:
        recalibrate_batchnorm(model, spec.inputs)
    return model.eval()


def torchvision_model(name: str, kwargs: dict):
    """A model of torchvision's registry (``torchvision.models.get_model``: classification,
    segmentation, detection, video, optical flow, quantizable), random weights (no download)."""
    import difflib

    from etforge.builders.loading.torchvision_compat import import_torchvision

    torchvision = import_torchvision()
    known = torchvision.models.list_models()
    if name not in known:
        close = difflib.get_close_matches(name, known, n=1)
        hint = (
            f"; did you mean {close[0]!r}?" if close else f" (it lists {len(known)}: torchvision.models.list_models())"
        )
        raise BadValue(f"torchvision's model registry has no model {name!r}{hint}")
    weights = {"weights": None}
    if "weights_backbone" in inspect.signature(torchvision.models.get_model_builder(name)).parameters:
        weights["weights_backbone"] = None  # segmentation/detection builders default to downloading one
    return torchvision.models.get_model(name, **{**weights, **kwargs})


def _from_factory(ref: str, kwargs: dict, root: Path):
    module_name, func_name = ref.split(":")
    _torchvision_shim()
    module = _import_from_project(module_name, root)
    factory = getattr(module, func_name, None)
    if factory is None:
        raise BadValue(f"{module_name} has no factory {func_name!r}")
    return factory(**kwargs)


def _torchvision_shim() -> None:
    """A factory may ``import torchvision`` itself: give it etforge's shim first, in every process
    (etforge.builders.loading.torchvision_compat says why the plain import fails on this toolchain)."""
    from etforge.builders.loading.torchvision_compat import import_torchvision, torchvision_installed

    if torchvision_installed():
        import_torchvision()


def _import_from_project(module_name: str, root: Path):
    """Import ``module_name`` from the project directory, never a same-named package elsewhere.

    Another directory on sys.path may hold a ``models`` package too (etforge's own
    repository has one; a test process may have imported it), so the project root
    must come first and a package already imported from elsewhere must be forgotten.
    """
    root = root.resolve()
    root_str = str(root)
    if root_str in sys.path:
        sys.path.remove(root_str)
    sys.path.insert(0, root_str)
    top = module_name.split(".")[0]
    loaded = sys.modules.get(top)
    if loaded is not None and not _is_inside(getattr(loaded, "__file__", None), root):
        for name in [n for n in sys.modules if n == top or n.startswith(top + ".")]:
            del sys.modules[name]
    module = importlib.import_module(module_name)
    if not _is_inside(module.__file__, root):
        raise BadValue(f"{module_name} resolved to {module.__file__}, outside the project {root}")
    return module


def _is_inside(file, root: Path) -> bool:
    return file is not None and Path(file).resolve().is_relative_to(root)


def recalibrate_batchnorm(model, inputs) -> None:
    """Recompute BN running statistics on seeded random batches. Only the BN modules train: a
    detection model in train mode wants targets, and dropout would disturb the statistics."""
    import torch

    bns = [m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    if not bns:
        return
    model.eval()
    for bn in bns:
        bn.reset_running_stats()
        bn.momentum = None  # cumulative average over all calibration batches
        bn.train()
    generator = torch.Generator().manual_seed(SEED)
    with torch.no_grad():
        for _ in range(BN_CALIBRATION_BATCHES):
            batch = [torch.randn((BN_CALIBRATION_BATCH_SIZE, *i.shape[1:]), generator=generator) for i in inputs]
            model(*batch)
    model.eval()
