"""``reference.npz``: the validation samples and eager PyTorch's outputs on them. Its one writer
(:func:`write_reference`, called by the capture) and its one reader (:func:`load_reference_samples`).

``reference.npz`` (format 2):

- ``samples``: 0-d int64, N, the number of samples (its presence marks format 2)
- ``source``: 0-d unicode string, where the inputs came from: ``random (seeded)``,
  ``images data/images`` or ``npz data/val.npz``
- ``input_<i>``: ``[N, *shape of input i]`` (the declared shape, batch axis included)
- ``output_<i>``: ``[N, *shape of output i]``, eager outputs (pytree leaves in order)
- ``output_names``: 1-d unicode, the name of each output where the model's output pytree
  gives one (a dict key or attribute, e.g. ``logits``), else "" (optional)

Sample ``n`` of input ``i`` is ``input_<i>[n]``, exactly what the program takes.
Format 1 (no ``samples`` key: one sample, ``input_<i>`` without the N axis) still loads.
Without ``validation`` data in pipeline.yaml, N = 1 and the sample is seeded random.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

REFERENCE = "reference.npz"
RANDOM_SOURCE = "random (seeded)"


@dataclass
class Reference:
    """The contents of a reference.npz: N samples of inputs and eager outputs."""

    inputs: list  # per input: [N, *shape]
    outputs: list  # per output: [N, *shape]
    source: str
    output_names: list = field(default_factory=list)  # per output: its pytree name, or ""

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


def write_reference(path: Path, samples: list, eager: list, names: list, source: str,
                    extra: dict | None = None) -> None:
    """Write format 2: ``samples`` (per sample, a tuple of input tensors), ``eager`` (per sample, the
    flattened output tensors), the outputs' pytree ``names`` and where the inputs came from.
    ``extra``: more named arrays a stage's own reader wants (an LLM's ``llm_tokens``/``llm_logits``)."""
    import numpy as np

    arrays = {f"input_{i}": np.stack([s[i].detach().numpy() for s in samples]) for i in range(len(samples[0]))}
    arrays.update({f"output_{i}": np.stack([out[i].detach().numpy() for out in eager])
                   for i in range(len(eager[0]))})
    arrays["samples"] = np.array(len(samples), dtype=np.int64)
    arrays["output_names"] = np.array(names, dtype=str)
    arrays["source"] = np.array(source)
    arrays.update(extra or {})
    with open(path, "wb") as f:
        np.savez(f, **arrays)


def load_reference_samples(path: Path) -> Reference:
    """Every sample of a reference.npz (format 1 files load as one sample)."""
    import numpy as np

    with np.load(path) as data:
        inputs = [data[k] for k in _numbered(data.files, "input_")]
        outputs = [data[k] for k in _numbered(data.files, "output_")]
        if "samples" not in data.files:
            return Reference([x[None] for x in inputs], [y[None] for y in outputs], RANDOM_SOURCE)
        source = str(data["source"]) if "source" in data.files else RANDOM_SOURCE
        names = [str(n) for n in data["output_names"]] if "output_names" in data.files else []
    return Reference(inputs, outputs, source, names)


def load_reference(path: Path) -> tuple[list, list]:
    """(inputs, outputs) of the first sample: example inputs shaped like the model's inputs."""
    reference = load_reference_samples(path)
    return reference.sample_inputs(0), reference.sample_outputs(0)


def _numbered(files: list, prefix: str) -> list:
    """``prefix<i>`` keys in index order (``output_names`` is not one)."""
    return sorted((k for k in files if k.startswith(prefix) and k[len(prefix):].isdigit()),
                  key=lambda k: int(k[len(prefix):]))
