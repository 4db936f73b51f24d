"""A model's ``validation`` data per method and per named shape, checked when the plan is built.

::

    validation: {methods: {encode: {npz: data/enc.npz}, decode: {npz: data/dec.npz}}}   # several methods
    validation: {shapes: {short: {npz: data/seq8.npz}, long: {npz: data/seq64.npz}}}     # dynamic dims

- A model with several methods takes one entry per method, each an npz like a single-method
  model's (arrays named like that method's inputs, samples along the first axis), or, for a
  method with dynamic dims, its own ``shapes``. An encoder-decoder (ModelKind.SEQ2SEQ) takes data
  for its ``encoder`` only: its ``text_decoder`` is driven step by step from the start token on
  the encoder's output, as without data (etforge.builders.seq2seq.export).
- A model with dynamic dims takes one npz per named shape. Each file's arrays have one fixed
  sample shape (``[N, *shape]``, or ``[N, *shape[1:]]`` when the input's leading axis is a static
  1) that fits the declared dims: static axes equal, dynamic ones within min..max, a dim name
  shared by several inputs one value. The samples of every shape, in the order given, are the
  validation samples.

``samples`` caps each file (an entry's own, else the validation's). Labels and user metrics
(etforge.config.task_data) stay single-method and static. Everything is read from the npz
headers (etforge.config.npz_index), memoised by content: no numpy, no torch.
"""

from __future__ import annotations

from etforge.config import npz_index
from etforge.config.model import ModelKind, dynamic_dims

METHODS, SHAPES = "methods", "shapes"
TASK_KEYS = ("labels", "metrics")  # single-method, static data only
SEQ2SEQ_DATA = ("encoder",)  # the methods of an encoder-decoder that take data (etforge.config.hf_seq2seq ENCODER)


def resolve_validation(r, spec: dict | None, path: tuple, kind, methods: tuple) -> dict | None:
    """The resolved ``validation`` entry at ``path`` of a model with ``methods`` ((name, InputSpecs), ...);
    ``r``: etforge.config.resolve's resolver (its document, root and digests)."""
    if spec is None:
        return None
    names = [m for m, _ in methods]
    inputs = methods[0][1]
    several = names != ["forward"]
    for part in (METHODS, SHAPES):
        if part in spec:
            for key in TASK_KEYS:
                if key in spec:
                    raise r.doc.error(
                        path + (key,),
                        f"'{key}' takes single-method data of static shape (validation: {{npz: ...}}); "
                        f"not with '{part}'",
                    )
    if METHODS in spec:
        if not several:
            raise r.doc.error(
                path + (METHODS,),
                "the model has one method (forward): give its data without 'methods' ("
                + ("validation: {shapes: {<name>: {npz: ...}}}" if dynamic_dims(inputs) else "validation: {npz: ...}")
                + ")",
            )
        rest = {k: v for k, v in spec.items() if k != METHODS}
        return {**rest, METHODS: _methods(r, spec[METHODS], path + (METHODS,), kind, methods, spec.get("samples"))}
    if several:
        wanted = SEQ2SEQ_DATA if kind == ModelKind.SEQ2SEQ else names
        example = ", ".join(f"{m}: {{npz: ...}}" for m in wanted)
        raise r.doc.error(
            path + (next((k for k in ("npz", "images", SHAPES) if k in spec), METHODS),),
            f"a model with several methods ({', '.join(names)}) takes data per method: "
            f"validation: {{methods: {{{example}}}}}",
        )
    if SHAPES in spec or dynamic_dims(inputs):
        return {**spec, **_data(r, spec, path, inputs, spec.get("samples"))}
    return r.calibration(spec, path, inputs)


def reject_parts(r, spec: dict | None, path: tuple) -> None:
    """``methods`` and ``shapes`` are validation's: calibration takes one npz or image folder."""
    for part in (METHODS, SHAPES):
        if spec and part in spec:
            raise r.doc.error(path + (part,), f"'{part}' is validation data only; {path[-1]} takes 'npz' or 'images'")


def _methods(r, entries: dict, path: tuple, kind, methods: tuple, cap: int | None) -> dict:
    names = [m for m, _ in methods]
    takes = [m for m in names if m in SEQ2SEQ_DATA] if kind == ModelKind.SEQ2SEQ else names
    for name in entries:
        if name not in names:
            raise r.doc.error(path + (name,), f"the model has no method {name!r} (its methods: {', '.join(names)})")
        if name not in takes:
            raise r.doc.error(
                path + (name,),
                f"an encoder-decoder's {name} is driven step by step from the start token on the encoder's "
                f"output and takes no data: give data for {', '.join(takes)} only",
            )
    missing = [m for m in takes if m not in entries]
    if missing:
        raise r.doc.error(
            path,
            f"method {missing[0]!r} has no data: give an entry for each of {', '.join(takes)}"
            " (or drop validation: every method gets seeded random inputs)",
        )
    out = {}
    for name, inputs in methods:
        if name in entries:
            entry = entries[name]
            where = path + (name,)
            out[name] = {**entry, **_data(r, entry, where, inputs, entry.get("samples", cap))}
    return out


def _data(r, entry: dict, path: tuple, inputs: tuple, cap: int | None) -> dict:
    """One method's data: its npz (static inputs) or its named shapes (dynamic dims), resolved."""
    dims = dynamic_dims(inputs)
    if dims:
        if SHAPES not in entry:
            ranges = ", ".join(f"{n} {lo}..{hi}" for n, (lo, hi) in dims.items())
            raise r.doc.error(
                path + (next((k for k in ("npz", "images") if k in entry), SHAPES),),
                f"inputs with dynamic dims ({ranges}) take one npz per named shape: "
                "{shapes: {<name>: {npz: ...}, ...}}",
            )
        shapes = {}
        for name, part in entry[SHAPES].items():
            where = path + (SHAPES, name)
            resolved, shapes_of = _npz(r, part, where, inputs)
            sizes = shape_problem(shapes_of, inputs)
            if isinstance(sizes, str):
                raise r.doc.error(where + ("npz",), f"{part['npz']} {sizes}")
            shapes[name] = {**part, **resolved, "dims": sizes, **_cap(part.get("samples", cap))}
        return {SHAPES: shapes}
    if SHAPES in entry:
        raise r.doc.error(
            path + (SHAPES,),
            "the inputs have no dynamic dims: give one file (npz: ...) instead of named shapes",
        )
    if "npz" not in entry:  # an image folder: one method of one NCHW input (etforge.builders.capture.samples)
        raise r.doc.error(path, "per-method data is an npz ({npz: <file>})")
    resolved, shapes_of = _npz(r, entry, path, inputs)
    problem = fit_problem(shapes_of, inputs)
    if problem:
        raise r.doc.error(path + ("npz",), f"{entry['npz']} {problem}")
    return {**resolved, **_cap(cap)}


def _cap(cap: int | None) -> dict:
    return {} if cap is None else {"samples": cap}


def _npz(r, entry: dict, path: tuple, inputs: tuple) -> tuple[dict, dict]:
    """({"npz": rel path, "sha256": digest}, {array: shape}) of the npz ``entry`` names, fed ``inputs``."""
    where = path + ("npz",)
    full = r.inside_root(entry["npz"], where)
    if not full.is_file():
        raise r.doc.error(where, f"validation file {entry['npz']!r} not found")
    content = r.file_digest(full, where)
    try:  # memoised by content: a no-op run reads no archive
        shapes = r.digests.derived("npz_shapes", content, lambda: npz_index.array_shapes(full))
    except npz_index.NpzError as exc:
        raise r.doc.error(where, f"{entry['npz']} {exc}") from None
    problem = npz_index.feeding_problem(shapes, inputs)
    if problem:
        raise r.doc.error(where, f"{entry['npz']} {problem}")
    return {"npz": r.rel(full), "sha256": content}, shapes


def input_array(shapes: dict, item, i: int) -> str:
    """The array that feeds input ``i`` (etforge.builders.capture.samples): its name, else ``input_<i>``."""
    return item.name if item.name in shapes else f"input_{i}"


def sample_shape(array_shape: list, item) -> tuple | None:
    """The shape of one sample of an array of ``array_shape`` (samples along its first axis) as
    input ``item`` takes it: the rest of the axes, with a static leading axis of 1 added when left
    out; None when the rank fits neither."""
    rest = tuple(array_shape[1:])
    if len(rest) == len(item.shape):
        return rest
    dynamic_axes = {axis for axis, *_ in item.dims}
    if len(rest) == len(item.shape) - 1 and item.shape[0] == 1 and 0 not in dynamic_axes:
        return (1, *rest)
    return None


def shape_problem(shapes: dict, inputs) -> dict | str:
    """{dim name: its size} of an npz of ``shapes`` whose samples fit dynamic ``inputs``, else why not."""
    sizes: dict = {}  # dim name -> (size, input, axis) where first seen
    for i, item in enumerate(inputs):
        name = input_array(shapes, item, i)
        shape = sample_shape(shapes[name], item)
        if shape is None:
            return (
                f"array {name!r} has shape {shapes[name]}: expected [samples, {_declared(item)}] for input {item.name}"
            )
        dims = {axis: (lo, hi, dim) for axis, lo, hi, dim in item.dims}
        for axis, value in enumerate(shape):
            if axis not in dims:
                if value != item.shape[axis]:
                    return f"input {item.name} axis {axis} is {value}, the model declares {item.shape[axis]}"
                continue
            lo, hi, dim = dims[axis]
            if not lo <= value <= hi:
                return f"input {item.name} axis {axis} is {value}, outside dim {dim!r} {lo}..{hi}"
            seen = sizes.setdefault(dim, (value, item.name, axis))
            if seen[0] != value:
                return (
                    f"input {item.name} axis {axis} is {value} where input {seen[1]} axis {seen[2]} is "
                    f"{seen[0]}: both are dim {dim!r}, one size per file"
                )
    return {dim: value for dim, (value, _, _) in sizes.items()}


def fit_problem(shapes: dict, inputs) -> str | None:
    """Why the samples of an npz of ``shapes`` cannot take static ``inputs``' shapes, or None: what the
    loader (etforge.builders.capture.samples) does with a sample, reshape it when it holds as many values
    as one batch row, else broadcast it to the input's shape."""
    for i, item in enumerate(inputs):
        name = input_array(shapes, item, i)
        rest, shape = list(shapes[name][1:]), list(item.shape)
        if _numel(rest) * shape[0] == _numel(shape) or _broadcasts(rest, shape):
            continue
        return f"array {name!r} holds samples of shape {rest}, which do not fit input {item.name} {shape}"
    return None


def _declared(item) -> str:
    named = {axis: f"{dim} {lo}..{hi}" for axis, lo, hi, dim in item.dims}
    return ", ".join(named.get(axis, str(d)) for axis, d in enumerate(item.shape))


def _broadcasts(source: list, target: list) -> bool:
    if len(source) > len(target):
        return False
    return all(s in (1, t) for s, t in zip(reversed(source), reversed(target)))


def _numel(shape: list) -> int:
    n = 1
    for d in shape:
        n *= d
    return n
