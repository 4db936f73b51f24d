"""``reference.npz``: the validation samples and eager PyTorch's outputs on them. Its one writer
(:func:`write_reference`, called by the capture) and its one reader (:func:`load_reference_samples`).

``reference.npz`` (format 2):

- ``samples``: 0-d int64, N, the number of samples (its presence marks format 2)
- ``source``: 0-d unicode string, where the inputs came from: ``random (seeded)``,
  ``images data/images`` or ``npz data/val.npz``
- ``input_<i>``: ``[N, *shape of input i]`` (the declared shape, batch axis included)
- ``output_<i>``: ``[N, *shape of output i]``, eager outputs (pytree leaves in order)
- ``output_names``: 1-d unicode, each output's pytree key path (etforge.config.io_spec:
  ``''`` for a bare tensor, ``[0]``, ``['boxes']``, ``['extra'][1][0]``) (optional; files
  written before held a dict key or attribute such as ``logits``, or "")
- ``sample_shapes``: 1-d unicode, per sample the named shape of ``validation.shapes`` it came
  from (optional: present only for such data)

Sample ``n`` of input ``i`` is ``input_<i>[n]``, exactly what the program takes.

A model with dynamic dims has samples of different shapes (one per measured size): then
``ragged`` (0-d bool) is present and each sample is stored on its own,
``s<n>_input_<i>`` / ``s<n>_output_<i>``; :class:`Reference` then holds per input and
output a list of N arrays instead of one ``[N, ...]`` array (indexing ``[n]`` is the same).
A model with several methods stores ``methods`` and one such file per method (see
:func:`reference_methods`).
Format 1 (no ``samples`` key: one sample, ``input_<i>`` without the N axis) still loads.
Without ``validation`` data in pipeline.yaml, N = 1 and the sample is seeded random.
"""

from __future__ import annotations

import io
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

REFERENCE = "reference.npz"
RANDOM_SOURCE = "random (seeded)"


@dataclass
class Reference:
    """The contents of a reference.npz: N samples of inputs and eager outputs."""

    inputs: list  # per input: [N, *shape]
    outputs: list  # per output: [N, *shape]
    source: str
    output_names: list = field(default_factory=list)  # per output: its pytree name, or ""
    shapes: list = field(default_factory=list)  # per sample: its named shape (validation.shapes), or none

    @property
    def count(self) -> int:
        return len(self.inputs[0]) if self.inputs else 0

    @property
    def ragged(self) -> bool:
        """Samples differ in shape (a model with dynamic dims): compare them one by one."""
        return bool(self.inputs) and isinstance(self.inputs[0], list)

    def sample_inputs(self, n: int) -> list:
        return [x[n] for x in self.inputs]

    def sample_outputs(self, n: int) -> list:
        return [y[n] for y in self.outputs]

    @property
    def is_random(self) -> bool:
        return self.source.startswith("random")


def write_reference(
    path: Path | IO[bytes],
    samples: list,
    eager: list,
    names: list,
    source: str,
    extra: dict | None = None,
    shape_names: list | tuple = (),
) -> None:
    """Write format 2: ``samples`` (per sample, a tuple of input tensors), ``eager`` (per sample, the
    flattened output tensors), the outputs' pytree ``names`` and where the inputs came from.
    ``extra``: more named arrays a stage's own reader wants (an LLM's ``llm_tokens``/``llm_logits``);
    ``shape_names``: per sample, the named shape it came from (validation data per shape)."""
    import numpy as np

    shapes = {tuple(tuple(t.shape) for t in (*s, *out)) for s, out in zip(samples, eager)}
    if len(shapes) > 1:
        arrays = {f"s{n}_input_{i}": x.detach().numpy() for n, s in enumerate(samples) for i, x in enumerate(s)}
        arrays.update(
            {f"s{n}_output_{i}": y.detach().numpy() for n, out in enumerate(eager) for i, y in enumerate(out)}
        )
        arrays["ragged"] = np.array(True)
    else:
        arrays = {f"input_{i}": np.stack([s[i].detach().numpy() for s in samples]) for i in range(len(samples[0]))}
        arrays.update(
            {f"output_{i}": np.stack([out[i].detach().numpy() for out in eager]) for i in range(len(eager[0]))}
        )
    arrays["samples"] = np.array(len(samples), dtype=np.int64)
    arrays["output_names"] = np.array(names, dtype=str)
    arrays["source"] = np.array(source)
    if shape_names:
        arrays["sample_shapes"] = np.array(list(shape_names), dtype=str)
    arrays.update(extra or {})
    if hasattr(path, "write"):  # a buffer: one method's reference inside a multi-method file
        np.savez(path, **arrays)
        return
    with open(path, "wb") as f:
        np.savez(f, **arrays)


def reference_methods(path: Path) -> list:
    """The methods a reference.npz holds samples for: ``["forward"]``, or a multi-method model's
    (``methods`` and ``method_<name>``: the bytes of each method's own reference.npz)."""
    import numpy as np

    with np.load(path) as data:
        return [str(m) for m in data["methods"]] if "methods" in data.files else ["forward"]


def load_reference_samples(path: Path | io.BytesIO, method: str | None = None) -> Reference:
    """Every sample of a reference.npz (format 1 files load as one sample); ``method``: whose samples,
    for a multi-method model (default its first)."""
    import numpy as np

    with np.load(path) as data:
        if "methods" in data.files:
            name = method or str(data["methods"][0])
            return load_reference_samples(io.BytesIO(data[f"method_{name}"].tobytes()))
        inputs: list
        outputs: list
        if "ragged" in data.files:
            count = int(data["samples"])
            inputs = [[data[f"s{n}_{k}"] for n in range(count)] for k in _numbered(_unprefixed(data.files), "input_")]
            outputs = [[data[f"s{n}_{k}"] for n in range(count)] for k in _numbered(_unprefixed(data.files), "output_")]
        else:
            inputs = [data[k] for k in _numbered(data.files, "input_")]
            outputs = [data[k] for k in _numbered(data.files, "output_")]
        if "samples" not in data.files:
            return Reference([x[None] for x in inputs], [y[None] for y in outputs], RANDOM_SOURCE)
        source = str(data["source"]) if "source" in data.files else RANDOM_SOURCE
        names = [str(n) for n in data["output_names"]] if "output_names" in data.files else []
        shapes = [str(n) for n in data["sample_shapes"]] if "sample_shapes" in data.files else []
    return Reference(inputs, outputs, source, names, shapes)


def load_reference(path: Path) -> tuple[list, list]:
    """(inputs, outputs) of the first sample: example inputs shaped like the model's inputs."""
    reference = load_reference_samples(path)
    return reference.sample_inputs(0), reference.sample_outputs(0)


def _unprefixed(files: list) -> list:
    """``input_<i>``/``output_<i>`` names of sample 0 in a ragged file (``s0_input_0`` -> ``input_0``)."""
    return [k[3:] for k in files if k.startswith("s0_")]


def _numbered(files: list, prefix: str) -> list:
    """``prefix<i>`` keys in index order (``output_names`` is not one)."""
    return sorted(
        (k for k in files if k.startswith(prefix) and k[len(prefix) :].isdigit()), key=lambda k: int(k[len(prefix) :])
    )
