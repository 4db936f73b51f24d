"""A model's ``validation`` labels and user metrics: checked at planning, read again by the validate stage.

``labels`` (docs/models.md "Labels and task metrics"):

- with ``npz``: the name of an integer array in the same file, one class index per sample
  (its length must be the inputs' sample count);
- with ``images``: ``folders`` (torchvision ImageFolder's convention: one subfolder per class, the
  classes sorted by folder name, indexed from 0), or a text file of ``<image path relative to the
  folder>,<class index>`` lines (blank lines and ``#`` comments skipped), one per image.

``metrics``: ``{name: {function: module:function, min: x, max: y}}``, a project module's function
``score(outputs, labels) -> float``. Its file and every project module it imports are hashed like a
model's factory, so that editing it judges the cells again.
"""

from __future__ import annotations

import re
from pathlib import Path

from etforge.core.errors import BadValue

FOLDERS = "folders"
FUNCTION = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*$")


def task_entries(resolver, spec: dict, path: tuple, inputs: tuple, shapes: dict | None, images: list | None) -> dict:
    """The resolved ``labels`` and ``metrics`` of a ``validation`` entry at ``path`` (``resolver``:
    etforge.config.resolve's); ``inputs``: the InputSpecs it feeds; ``shapes``: its npz's array shapes, ``images``: its image files."""
    doc = resolver.doc
    if path[-1] != "validation":
        for key in ("labels", "metrics"):
            if key in spec:
                raise doc.error(path + (key,), f"'{key}' belongs under the model's validation, not {path[-1]}")
        return {}
    out: dict = {}
    if "labels" in spec:
        where = path + ("labels",)
        if shapes is not None:
            problem = npz_labels_problem(shapes, spec["labels"], inputs)
            if problem:
                raise doc.error(where, f"{spec['npz']} {problem}")
        elif spec["labels"] != FOLDERS:
            full = resolver.inside_root(spec["labels"], where)
            if not full.is_file():
                raise doc.error(where, f"labels file {spec['labels']!r} not found")
            out["labels_sha256"] = resolver.file_digest(full, where)
            try:
                image_labels(full, resolver.root / spec["images"], images or [])
            except BadValue as exc:
                raise doc.error(where, str(exc)) from None
        else:
            try:
                folder_labels(resolver.root / spec["images"], images or [])
            except BadValue as exc:
                raise doc.error(where, str(exc)) from None
    metrics = {}
    for name, body in (spec.get("metrics") or {}).items():
        where = path + ("metrics", name, "function")
        if not FUNCTION.match(body["function"]):
            raise doc.error(where, f"expected module:function (e.g. models.mymetric:score), got {body['function']!r}")
        file = resolver.factory_file(body["function"], where)
        metrics[name] = {
            **body,
            "file": resolver.rel(file),
            "sha256": resolver.file_digest(file, where),
            "modules": {
                resolver.rel(f): resolver.file_digest(f, where)
                for f in sorted(resolver.imports.reach([file]))
                if f != file
            },
        }
        if "min" in body and "max" in body and not body["min"] <= body["max"]:
            raise doc.error(path + ("metrics", name), f"min {body['min']} is above max {body['max']}")
    if metrics:
        out["metrics"] = metrics
    return out


def npz_labels_problem(shapes: dict, name: str, inputs) -> str | None:
    """Why array ``name`` of an npz of ``shapes`` cannot label its samples, or None."""
    if name not in shapes:
        return f"has no labels array {name!r} (has: {', '.join(shapes)})"
    shape = shapes[name]
    if len(shape) != 1:
        return f"labels array {name!r} has shape {shape}: expected one class index per sample"
    firsts = [shapes[n][0] for n in _input_arrays(shapes, inputs) if shapes[n]]
    count = min(firsts) if firsts else 0
    if shape[0] != count:
        return f"labels array {name!r} has {shape[0]} labels, the inputs have {count} samples"
    return None


def _input_arrays(shapes: dict, inputs) -> list:
    return [item.name if item.name in shapes else f"input_{i}" for i, item in enumerate(inputs)]


def folder_labels(folder: Path, images: list) -> list:
    """One class index per image: its top subfolder's rank among the sorted subfolders (ImageFolder)."""
    classes = sorted({p.relative_to(folder).parts[0] for p in images if len(p.relative_to(folder).parts) > 1})
    loose = [p.relative_to(folder).as_posix() for p in images if len(p.relative_to(folder).parts) == 1]
    if loose:
        raise BadValue(f"labels: folders needs every image in a class subfolder; {loose[0]} is not")
    index = {name: i for i, name in enumerate(classes)}
    return [index[p.relative_to(folder).parts[0]] for p in images]


def image_labels(labels_file: Path, folder: Path, images: list) -> list:
    """One class index per image from ``<image>,<class>`` lines; every image needs exactly one."""
    rel = labels_file.name
    found: dict = {}
    for number, raw in enumerate(labels_file.read_text(encoding="utf-8").splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        name, _, value = (part.strip() for part in line.rpartition(","))
        if not name or not re.fullmatch(r"[0-9]+", value):
            raise BadValue(f"{rel} line {number}: expected '<image file>,<class index>', got {raw.strip()!r}")
        if name in found:
            raise BadValue(f"{rel} line {number}: {name} is labelled twice")
        found[name] = int(value)
    names = [p.relative_to(folder).as_posix() for p in images]
    missing = [n for n in names if n not in found]
    extra = sorted(set(found) - set(names))
    if missing or extra:
        what = f"no label for {missing[0]}" if missing else f"a label for {extra[0]}, which is not an image there"
        raise BadValue(f"{rel} has {len(found)} labels for {len(names)} images: {what}")
    return [found[n] for n in names]
