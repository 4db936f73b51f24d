"""Capture a model once: torch.export program plus eager reference outputs.

Every backend cell of the model lowers from this one ``model.pt2``; the
validation of every cell compares against ``reference.npz``, which holds the
validation samples and the eager nn.Module's outputs on them.

``reference.npz`` (format 2):

- ``samples``: 0-d int64, N, the number of samples (its presence marks format 2)
- ``source``: 0-d unicode string, where the inputs came from: ``random (seeded)``,
  ``images data/images`` or ``npz data/val.npz``
- ``input_<i>``: ``[N, *shape of input i]`` (the declared shape, batch axis included)
- ``output_<i>``: ``[N, *shape of output i]``, eager outputs (pytree leaves in order)

Sample ``n`` of input ``i`` is ``input_<i>[n]``, exactly what the program takes.
Format 1 (no ``samples`` key: one sample, ``input_<i>`` without the N axis) still loads.
Without ``validation`` data in pipeline.yaml, N = 1 and the sample is seeded random.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from tasks.runner import BuildResult

PROGRAM = "model.pt2"
REFERENCE = "reference.npz"
RANDOM_SOURCE = "random (seeded)"


@dataclass
class Reference:
    """The contents of a reference.npz: N samples of inputs and eager outputs."""

    inputs: list  # per input: [N, *shape]
    outputs: list  # per output: [N, *shape]
    source: str

    @property
    def count(self) -> int:
        return int(self.inputs[0].shape[0]) if self.inputs else 0

    def sample_inputs(self, n: int) -> list:
        return [x[n] for x in self.inputs]

    def sample_outputs(self, n: int) -> list:
        return [y[n] for y in self.outputs]

    @property
    def is_random(self) -> bool:
        return self.source.startswith("random")


def flatten_outputs(outputs) -> list:
    import torch

    leaves, _ = torch.utils._pytree.tree_flatten(outputs)
    return [leaf for leaf in leaves if isinstance(leaf, torch.Tensor)]


def reference_samples(model_spec, root: Path, seed: int) -> tuple[list, str]:
    """(list of input tuples as torch tensors, source): the model's validation data or one seeded input."""
    import torch

    from tasks.model_loading import example_inputs

    if model_spec.validation is None:
        return [example_inputs(model_spec, seed)], RANDOM_SOURCE
    from tasks.calibration import load_samples

    batches, source = load_samples(model_spec, model_spec.validation, root, seed)
    return [tuple(torch.from_numpy(x) for x in batch) for batch in batches], source


def build_capture(model_spec, root: Path, seed: int, workdir: Path) -> BuildResult:
    import numpy as np
    import torch

    from tasks.model_loading import build_model

    start = time.monotonic()
    model = build_model(model_spec, root)
    samples, source = reference_samples(model_spec, root, seed)
    eager = []
    with torch.no_grad():
        for inputs in samples:
            eager.append(flatten_outputs(model(*inputs)))
    program = torch.export.export(model, samples[0], strict=False)
    torch.export.save(program, workdir / PROGRAM)
    arrays = {f"input_{i}": np.stack([s[i].detach().numpy() for s in samples])
              for i in range(len(samples[0]))}
    arrays.update({f"output_{i}": np.stack([out[i].detach().numpy() for out in eager])
                   for i in range(len(eager[0]))})
    arrays["samples"] = np.array(len(samples), dtype=np.int64)
    arrays["source"] = np.array(source)
    with open(workdir / REFERENCE, "wb") as f:
        np.savez(f, **arrays)
    info = {"export_s": round(time.monotonic() - start, 3), "inputs": source, "samples": len(samples),
            "outputs": [{"shape": list(t.shape), "dtype": str(t.dtype).removeprefix("torch.")} for t in eager[0]]}
    return BuildResult(files={PROGRAM: workdir / PROGRAM, REFERENCE: workdir / REFERENCE}, info=info)


def load_reference_samples(path: Path) -> Reference:
    """Every sample of a reference.npz (format 1 files load as one sample)."""
    import numpy as np

    with np.load(path) as data:
        inputs = [data[k] for k in sorted((k for k in data.files if k.startswith("input_")), key=_index)]
        outputs = [data[k] for k in sorted((k for k in data.files if k.startswith("output_")), key=_index)]
        if "samples" not in data.files:
            return Reference([x[None] for x in inputs], [y[None] for y in outputs], RANDOM_SOURCE)
        source = str(data["source"]) if "source" in data.files else RANDOM_SOURCE
    return Reference(inputs, outputs, source)


def load_reference(path: Path) -> tuple[list, list]:
    """(inputs, outputs) of the first sample: example inputs shaped like the model's inputs."""
    reference = load_reference_samples(path)
    return reference.sample_inputs(0), reference.sample_outputs(0)


def _index(name: str) -> int:
    return int(name.rsplit("_", 1)[1])
