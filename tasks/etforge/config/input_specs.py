"""A method's ``inputs`` list of pipeline.yaml into InputSpecs: shapes, dynamic dims, dtypes,
sample ranges and attention masks, each checked with the file, line and key of a mistake."""

from __future__ import annotations

from etforge.config import defaults
from etforge.config.model import INTEGER_DTYPES, InputSpec
from etforge.config.yamlfile import LoadedYaml

MAX_INPUT_ELEMENTS = 1 << 26  # 64 Mi elements: far beyond any on-device input


def input_specs(doc: LoadedYaml, items: list, where: tuple, dim_ranges: dict) -> tuple:
    """InputSpecs of one method's ``inputs`` list at key path ``where``."""
    out = []
    for i, item in enumerate(items):
        shape, dims = _dims(doc, item, i, where, dim_ranges)
        elements = 1
        for d in shape:
            elements *= d
        if elements > MAX_INPUT_ELEMENTS:
            raise doc.error(
                where + (i, "shape"), f"expected at most {MAX_INPUT_ELEMENTS} elements in total, got {elements}"
            )
        dtype = item.get("dtype", defaults.INPUT_DTYPE)
        out.append(
            InputSpec(
                item.get("name", f"input_{i}"),
                shape,
                dtype,
                _range(doc, item.get("range"), dtype, where + (i, "range")),
                dims,
                _sample(doc, item, dtype, where + (i,)),
            )
        )
    return tuple(out)


def _dims(doc: LoadedYaml, item: dict, i: int, path: tuple, ranges: dict) -> tuple[tuple, tuple]:
    """(shape with each dynamic dim at its max, ((axis, min, max, name), ...)); ``ranges``: the
    dims named so far in this model (name -> (min, max)), which a shared name must match."""
    shape, dims = [], []
    for axis, d in enumerate(item["shape"]):
        if isinstance(d, int):
            shape.append(d)
            continue
        where = path + (i, "shape", axis)
        name = d.get("name") or f"{item.get('name', f'input_{i}')}_{axis}"
        lo, hi = d["min"], d["max"]
        if not lo < hi:
            raise doc.error(where, f"a dynamic dim needs min < max, got min {lo}, max {hi}")
        if ranges.setdefault(name, (lo, hi)) != (lo, hi):
            raise doc.error(
                where,
                f"dim {name!r} is [{ranges[name][0]}, {ranges[name][1]}] on an "
                f"earlier input, [{lo}, {hi}] here: a shared name needs one range",
            )
        shape.append(hi)
        dims.append((axis, lo, hi, name))
    return tuple(shape), tuple(dims)


def _sample(doc: LoadedYaml, item: dict, dtype: str, path: tuple) -> str | None:
    """``sample: attention_mask``: an integer or bool input without ``range`` (its values are 0/1)."""
    kind = item.get("sample")
    if kind is None:
        return None
    if dtype not in INTEGER_DTYPES and dtype != "bool":
        raise doc.error(path + ("sample",), f"an attention mask is an integer or bool input, not {dtype}")
    if "range" in item:
        raise doc.error(
            path + ("range",),
            "an attention_mask input takes no range (its samples are ones for a prefix, then zeros)",
        )
    return kind


def _range(doc: LoadedYaml, value: list | None, dtype: str, path: tuple) -> tuple | None:
    """``range: [lo, hi]`` checked against the dtype: integers need integer bounds inside it."""
    if value is None:
        return None
    lo, hi = value
    if dtype == "bool":
        raise doc.error(path, "a bool input takes no range (its samples are True and False)")
    if dtype in INTEGER_DTYPES:
        if not all(float(v).is_integer() for v in value):
            raise doc.error(path, f"an {dtype} input needs integer bounds, got [{lo}, {hi}]")
        lo, hi = int(lo), int(hi)
        low, high = INTEGER_DTYPES[dtype]
        if lo < low or hi > high:
            raise doc.error(path, f"[{lo}, {hi}) does not fit {dtype} ([{low}, {high}))")
    if not lo < hi:
        raise doc.error(path, f"expected lo < hi (integers: hi is exclusive), got [{lo}, {hi}]")
    return (lo, hi)
