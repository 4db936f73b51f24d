"""Calibration and validation batches from the data a user names in pipeline.yaml.

``npz``: arrays named like the model inputs (or ``input_0``...), first axis =
samples. ``images``: a folder of images, resized (shorter side, then center
crop) and normalized with ``mean``/``std``, for a single image input. Without
either, seeded random batches stand in and the caller flags them.
"""

from __future__ import annotations

from pathlib import Path

DEFAULT_SAMPLES = 16


def calibration_batches(model_spec, root: Path, seed: int) -> tuple[list, str]:
    """(list of input tuples as numpy arrays, description of their source)."""
    import numpy as np

    spec = model_spec.calibration
    samples = (spec or {}).get("samples", DEFAULT_SAMPLES)
    if spec is None:
        rng = np.random.default_rng(seed + 1)
        batches = [tuple(rng.standard_normal(i.shape).astype(i.dtype) for i in model_spec.inputs)
                   for _ in range(samples)]
        return batches, "random (no calibration data in pipeline.yaml)"
    if "npz" in spec:
        return _from_npz(model_spec, root / spec["npz"], samples), f"npz {spec['npz']}"
    return _from_images(model_spec, root / spec["images"], spec, samples), f"images {spec['images']}"


def _from_npz(model_spec, path: Path, samples: int) -> list:
    import numpy as np

    with np.load(path) as data:
        arrays = []
        for i, item in enumerate(model_spec.inputs):
            name = item.name if item.name in data.files else f"input_{i}"
            if name not in data.files:
                raise KeyError(f"{path.name} has no array {item.name!r} or 'input_{i}' (has: {', '.join(data.files)})")
            arrays.append(data[name])
    count = min(len(a) for a in arrays)
    batches = []
    for n in range(min(count, samples)):
        batch = []
        for item, array in zip(model_spec.inputs, arrays):
            sample = array[n].reshape(item.shape[1:]) if array[n].size * item.shape[0] == _numel(item.shape) else array[n]
            batch.append(np.ascontiguousarray(np.broadcast_to(sample, item.shape)).astype(item.dtype))
        batches.append(tuple(batch))
    return batches


def _from_images(model_spec, folder: Path, spec: dict, samples: int) -> list:
    import numpy as np
    from PIL import Image

    if len(model_spec.inputs) != 1 or len(model_spec.inputs[0].shape) != 4:
        raise ValueError("an image folder calibrates a model with one NCHW image input")
    _, channels, height, width = model_spec.inputs[0].shape
    mean = np.array(spec.get("mean", [0.0] * channels), dtype=np.float32).reshape(-1, 1, 1)
    std = np.array(spec.get("std", [1.0] * channels), dtype=np.float32).reshape(-1, 1, 1)
    files = sorted(p for p in folder.rglob("*") if p.suffix.lower() in (".png", ".jpg", ".jpeg", ".bmp"))
    batches = []
    for path in files[:samples]:
        image = Image.open(path).convert("RGB" if channels == 3 else "L")
        resize = spec.get("resize", min(height, width))
        scale = resize / min(image.size)
        image = image.resize((max(width, round(image.size[0] * scale)), max(height, round(image.size[1] * scale))),
                             Image.BILINEAR)
        left, top = (image.size[0] - width) // 2, (image.size[1] - height) // 2
        image = image.crop((left, top, left + width, top + height))
        array = np.asarray(image, dtype=np.float32) / 255.0
        array = array.reshape(height, width, -1).transpose(2, 0, 1)
        array = (array - mean) / std
        batches.append((np.ascontiguousarray(array[None]).astype(np.float32),))
    return batches


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n
