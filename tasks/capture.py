"""Capture a model once: torch.export program plus eager reference outputs.

Every backend cell of the model lowers from this one ``model.pt2``; the
validation of every cell compares against ``reference.npz``, which holds the
example inputs and the eager nn.Module's outputs on them.
"""

from __future__ import annotations

import time
from pathlib import Path

from tasks.runner import BuildResult

PROGRAM = "model.pt2"
REFERENCE = "reference.npz"


def flatten_outputs(outputs) -> list:
    import torch

    leaves, _ = torch.utils._pytree.tree_flatten(outputs)
    return [leaf for leaf in leaves if isinstance(leaf, torch.Tensor)]


def build_capture(model_spec, root: Path, seed: int, workdir: Path) -> BuildResult:
    import numpy as np
    import torch

    from tasks.model_loading import build_model, example_inputs

    start = time.monotonic()
    model = build_model(model_spec, root)
    inputs = example_inputs(model_spec, seed)
    with torch.no_grad():
        eager = flatten_outputs(model(*inputs))
    program = torch.export.export(model, inputs, strict=False)
    torch.export.save(program, workdir / PROGRAM)
    arrays = {f"input_{i}": t.detach().numpy() for i, t in enumerate(inputs)}
    arrays.update({f"output_{i}": t.detach().numpy() for i, t in enumerate(eager)})
    with open(workdir / REFERENCE, "wb") as f:
        np.savez(f, **arrays)
    info = {"export_s": round(time.monotonic() - start, 3),
            "outputs": [{"shape": list(t.shape), "dtype": str(t.dtype).removeprefix("torch.")} for t in eager]}
    return BuildResult(files={PROGRAM: workdir / PROGRAM, REFERENCE: workdir / REFERENCE}, info=info)


def load_reference(path: Path) -> tuple[list, list]:
    import numpy as np

    with np.load(path) as data:
        inputs = [data[k] for k in sorted((k for k in data.files if k.startswith("input_")), key=_index)]
        outputs = [data[k] for k in sorted((k for k in data.files if k.startswith("output_")), key=_index)]
    return inputs, outputs


def _index(name: str) -> int:
    return int(name.rsplit("_", 1)[1])
