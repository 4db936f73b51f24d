"""Representative input samples from the data a user names in pipeline.yaml.

One loader serves both uses: ``calibration`` (static quantization) and
``validation`` (the inputs the eager reference and every cell's check run on).

``npz``: arrays named like the model inputs (or ``input_0``...), first axis =
samples; a sample may drop the input's leading batch axis of 1. ``images``: a
folder of images (sorted by path) for a model with one NCHW image input; each
is converted to RGB (or L for one channel), resized, scaled to [0, 1] and
normalized with ``mean``/``std`` (per channel; default 0 and 1):

- without ``resize``: the whole image is resized to the input's H×W
  (bilinear; the aspect ratio is not kept, nothing is cropped);
- with ``resize: R``: the whole image is resized to R×R (bilinear, each side
  at least the input's), then the center H×W is cropped: ``resize: 256`` on a
  224×224 input keeps the central 87.5%; ``resize: 224`` is the same as none.
  (The aspect ratio is never kept: EfficientNet-Lite0's ImageNet weights give
  chelsea.png p=0.79 for class 285 this way, 0.39 after a shorter-side resize
  and crop.)

At most ``samples`` samples are used (default: etforge.config.defaults SAMPLES). Without data, seeded
random samples stand in and the description says so.

Validation data per method (``methods``: each method's entry in one of these forms) and per named
shape of a model with dynamic dims (``shapes``: one npz per shape, each of one fixed sample shape;
:func:`load_shapes`) are etforge.config.validation_data's, checked when the plan is built.

:func:`random_inputs` is the one generator of random inputs (the eager reference,
calibration, and through reference.npz validation, benchmark and bundled test
cases): per input, in order, from one seeded ``torch.Generator``, exactly the
declared dtype; floats standard normal, or uniform in ``range: [lo, hi)``;
integers uniform in ``[lo, hi)`` (hi exclusive: ``[0, 32000]`` for a vocabulary
of 32000), ``defaults.INT_INPUT_RANGE`` without a declared range; bools True/False;
``sample: attention_mask`` inputs a valid padding mask (per row along the last axis, ones for a
prefix of uniform random length in [1, T], then zeros: what a tokenizer emits, never an all-zero
row, which would make attention NaN).
"""

from __future__ import annotations

from pathlib import Path

from etforge.config.defaults import IMAGE_SUFFIXES, SAMPLES
from etforge.config.validation_data import METHODS, SHAPES, input_array, sample_shape, shape_problem
from etforge.core.errors import BadValue


def load_samples(
    model_spec, data_spec: dict | None, root: Path, seed: int, samples: int | None = None, inputs=None
) -> tuple[list, str]:
    """(list of samples, each a tuple of numpy arrays shaped like the model inputs; source description).

    ``data_spec``: a model's ``calibration`` or ``validation`` entry (or one method's), or None for seeded
    random samples (standard normal, ``samples`` of them, default 16); ``inputs``: the InputSpecs it
    feeds (default the model's, i.e. its first method's).
    """

    inputs = model_spec.inputs if inputs is None else inputs
    count = samples or (data_spec or {}).get("samples", SAMPLES)
    if data_spec is None:
        batches = [tuple(x.numpy() for x in batch) for batch in random_inputs(inputs, seed, count)]
        return batches, "random (seeded)"
    if "npz" in data_spec:
        return _from_npz(model_spec.name, inputs, root / data_spec["npz"], count), f"npz {data_spec['npz']}"
    return _from_images(inputs, root / data_spec["images"], data_spec, count), f"images {data_spec['images']}"


def method_data(model_spec, method: str) -> dict | None:
    """The validation entry of one method: the model's own, or its ``methods`` entry; None: random samples."""
    entry = model_spec.validation
    if entry is not None and METHODS in entry:
        return entry[METHODS].get(method)
    return entry


def load_shapes(entry: dict, root: Path, inputs) -> tuple[list, str, list]:
    """(samples as tuples of numpy arrays, source, per sample the name of its shape) of a ``shapes``
    entry: each file's samples (at most its ``samples``), in the order given. A file must still fit
    the dims as the plan found it (etforge.config.validation_data shape_problem)."""
    import numpy as np

    batches, names, said = [], [], []
    for name, part in entry[SHAPES].items():
        path = root / part["npz"]
        with np.load(path) as data:
            shapes = {k: list(data[k].shape) for k in data.files}
            problem = shape_problem(shapes, inputs)
            if isinstance(problem, str):  # (planning refuses such a file; it may have changed since)
                raise BadValue(f"{part['npz']} (shape {name}) {problem}")
            arrays = [data[input_array(shapes, item, i)] for i, item in enumerate(inputs)]
        count = min(len(a) for a in arrays)
        taken = min(count, part.get("samples", SAMPLES))
        for n in range(taken):
            sample = []
            for item, array in zip(inputs, arrays):
                shape = sample_shape(list(array.shape), item)
                sample.append(np.ascontiguousarray(array[n].reshape(shape)).astype(item.dtype))
            batches.append(tuple(sample))
            names.append(name)
        said.append(f"{name}: npz {part['npz']} ({taken} sample{'s' if taken != 1 else ''})")
    return batches, "shapes " + ", ".join(said), names


def random_inputs(inputs, seed: int, count: int = 1, shapes: list | None = None) -> list:
    """``count`` input tuples (torch tensors) for ``inputs`` (InputSpecs), as the module docstring says.

    ``shapes``: per input, the shape to draw (a dynamic input at one of its sizes); default its own.
    """
    import torch

    generator = torch.Generator().manual_seed(seed)
    shapes = shapes or [item.shape for item in inputs]
    return [tuple(_draw(item, tuple(shape), generator) for item, shape in zip(inputs, shapes)) for _ in range(count)]


def size_points(inputs) -> list:
    """Per measured size of a model's dynamic dims (etforge.config.model measured_sizes: min,
    an interior non-power-of-two, max; dims advance together), the shape of every input."""
    from etforge.config.model import dynamic_dims, measured_sizes

    sizes = {name: measured_sizes(lo, hi) for name, (lo, hi) in dynamic_dims(inputs).items()}
    count = max((len(v) for v in sizes.values()), default=1)
    points = []
    for k in range(count):
        at = {name: v[min(k, len(v) - 1)] for name, v in sizes.items()}
        shapes = []
        for item in inputs:
            shape = list(item.shape)
            for axis, _, _, name in item.dims:
                shape[axis] = at[name]
            shapes.append(tuple(shape))
        points.append(shapes)
    return points


def dynamic_random_inputs(inputs, seed: int) -> list:
    """One seeded random sample at each of :func:`size_points` (a model with dynamic dims)."""
    return [random_inputs(inputs, seed + k, 1, shapes)[0] for k, shapes in enumerate(size_points(inputs))]


def _draw(item, shape: tuple, generator):
    import torch

    dtype = getattr(torch, item.dtype)
    if item.sample == "attention_mask":
        rows = 1
        for d in shape[:-1]:
            rows *= d
        lengths = torch.randint(1, shape[-1] + 1, (rows, 1), generator=generator)
        return (torch.arange(shape[-1])[None] < lengths).reshape(shape).to(dtype)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=generator).bool()
    bounds = item.sample_range()
    if dtype.is_floating_point:
        if bounds is None:
            return torch.randn(shape, generator=generator).to(dtype)
        lo, hi = bounds
        return (torch.rand(shape, generator=generator, dtype=torch.float64) * (hi - lo) + lo).to(dtype)
    lo, hi = bounds
    return torch.randint(lo, hi, shape, generator=generator, dtype=dtype)


def calibration_batches(model_spec, root: Path, seed: int) -> tuple[list, str]:
    """(list of input tuples as numpy arrays, description of their source)."""
    batches, source = load_samples(model_spec, model_spec.calibration, root, seed + 1)
    if model_spec.calibration is None:
        source = "random (no calibration data in pipeline.yaml)"
    return batches, source


def image_files(folder: Path) -> list:
    return sorted(p for p in Path(folder).rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES and p.is_file())


def preprocess_image(path: Path, channels: int, height: int, width: int, spec: dict):
    """One image as a float32 ``[channels, height, width]`` array, as the module docstring says."""
    import numpy as np
    from PIL import Image

    with Image.open(path) as raw:
        image = raw.convert("RGB" if channels == 3 else "L")
    size = spec.get("resize")
    resized = (width, height) if size is None else (max(width, size), max(height, size))
    image = image.resize(resized, Image.BILINEAR)
    if resized != (width, height):
        left, top = (resized[0] - width) // 2, (resized[1] - height) // 2
        image = image.crop((left, top, left + width, top + height))
    mean = np.array(spec.get("mean", [0.0] * channels), dtype=np.float32).reshape(-1, 1, 1)
    std = np.array(spec.get("std", [1.0] * channels), dtype=np.float32).reshape(-1, 1, 1)
    array = np.asarray(image, dtype=np.float32) / 255.0
    array = array.reshape(height, width, -1).transpose(2, 0, 1)
    return np.ascontiguousarray((array - mean) / std, dtype=np.float32)


def _from_npz(model_name: str, inputs, path: Path, samples: int) -> list:
    import numpy as np

    with np.load(path) as data:
        arrays = []
        for i, item in enumerate(inputs):
            name = item.name if item.name in data.files else f"input_{i}"
            if name not in data.files:
                raise BadValue(f"{path.name} has no array {item.name!r} or 'input_{i}' (has: {', '.join(data.files)})")
            arrays.append(data[name])
    count = min((len(a) if a.ndim else 0) for a in arrays)
    if count == 0:  # (planning refuses such a file; it may have changed since)
        raise BadValue(f"{path.name} holds no samples for {model_name} (an empty first axis)")
    batches = []
    for n in range(min(count, samples)):
        batch = []
        for item, array in zip(inputs, arrays):
            sample = (
                array[n].reshape(item.shape[1:]) if array[n].size * item.shape[0] == _numel(item.shape) else array[n]
            )
            batch.append(np.ascontiguousarray(np.broadcast_to(sample, item.shape)).astype(item.dtype))
        batches.append(tuple(batch))
    return batches


def _from_images(inputs, folder: Path, spec: dict, samples: int) -> list:
    if len(inputs) != 1 or len(inputs[0].shape) != 4:
        raise BadValue("an image folder feeds a model with one NCHW image input")
    item = inputs[0]
    _, channels, height, width = item.shape
    files = image_files(folder)
    if not files:
        raise BadValue(f"no images ({', '.join(IMAGE_SUFFIXES)}) in {folder}")
    batches = []
    for path in files[:samples]:
        array = preprocess_image(path, channels, height, width, spec)[None]
        # A batch of B > 1 repeats the image, like an npz sample without a batch axis.
        batches.append((_broadcast(array, item.shape, item.dtype),))
    return batches


def _broadcast(array, shape, dtype):
    import numpy as np

    return np.ascontiguousarray(np.broadcast_to(array, shape)).astype(dtype)


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n
