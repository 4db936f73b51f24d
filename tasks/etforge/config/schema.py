"""JSON Schema validation with one-line errors that name file, line and key.

The schemas under ``schemas/`` are the single source of validation. A schema
node may carry ``x-expected`` (a phrase such as "a list of positive
integers") used verbatim in the message. Beyond the schema, no number in a
validated file may be non-finite (see :func:`validate`).

jsonschema is imported on the first validation only: with a ``memo`` (etforge.config.validation_memo)
that has seen the same data pass under the same schemas and code, a no-op run validates nothing
and never imports it (0.1-0.4 s of a run that does nothing else).
"""

from __future__ import annotations

import difflib
import json
import math
from functools import cache
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import jsonschema

from etforge.config.yamlfile import LoadedYaml, format_path
from etforge.core.errors import PipelineError
from etforge.core.paths import SCHEMA_DIR


@cache
def load_schema(name: str) -> dict:
    return json.loads((SCHEMA_DIR / name).read_text(encoding="utf-8"))


def _short(value) -> str:
    if isinstance(value, float) and not math.isfinite(value):  # as YAML spells it; JSON cannot
        return ".nan" if math.isnan(value) else (".inf" if value > 0 else "-.inf")
    # default=str: never crash on a value JSON cannot spell (PyYAML can build a few).
    text = json.dumps(value, default=str)
    if len(text) > 60 and isinstance(value, dict):
        # A truncated JSON object hides what matters; its keys usually say it all.
        return "a mapping with keys " + ", ".join(map(str, value))
    return text if len(text) <= 60 else text[:57] + "..."


@cache
def _validator_class():
    import jsonschema

    # YAML tells 4 from 4.0; JSON Schema does not (4.0 "is" an integer). A shape of
    # [1, 4.0] would pass validation and reach torch as a float, so "integer" here
    # means a YAML integer. (bool is already excluded by jsonschema.)
    types = jsonschema.Draft202012Validator.TYPE_CHECKER.redefine(
        "integer", lambda checker, value: isinstance(value, int) and not isinstance(value, bool)
    )
    return jsonschema.validators.extend(jsonschema.Draft202012Validator, type_checker=types)


def validator(schema: dict) -> Any:
    """A Draft 2020-12 validator of ``schema`` in which an integer is a YAML integer."""
    return _validator_class()(schema)


_TYPE_NAMES = {
    "object": "a mapping",
    "array": "a list",
    "string": "a string",
    "integer": "an integer",
    "number": "a number",
    "boolean": "true or false",
    "null": "nothing",
}


# Size limits say something more precise than the node's x-expected: "a list of
# positive integers" would be a confusing answer to a list of nine of them.
_BOUNDS = ("minItems", "maxItems", "minLength", "maxLength", "minProperties")


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def _expected(error: jsonschema.ValidationError) -> str:
    v, arg = error.validator, error.validator_value
    if "x-expected" in error.schema and v not in _BOUNDS:
        return error.schema["x-expected"]
    if v == "type":
        kinds = arg if isinstance(arg, list) else [arg]
        return " or ".join(_TYPE_NAMES.get(k, str(k)) for k in kinds)
    if v == "enum":
        return "one of " + ", ".join(str(x) for x in arg)
    if v == "const":
        return repr(arg)
    if v == "pattern":
        return f"a string matching {arg}"
    if v in ("minimum", "exclusiveMinimum"):
        return f"a number {'>=' if v == 'minimum' else '>'} {arg}"
    if v in ("maximum", "exclusiveMaximum"):
        return f"a number {'<=' if v == 'maximum' else '<'} {arg}"
    if v == "minItems":
        return f"at least {_plural(arg, 'item')}"
    if v == "maxItems":
        return f"at most {_plural(arg, 'item')}"
    if v == "minProperties":
        return f"at least {arg} entr{'y' if arg == 1 else 'ies'}"
    if v == "minLength":
        return "a non-empty string"
    if v == "maxLength":
        return f"at most {_plural(arg, 'character')}"
    return error.message


def expectation(error: jsonschema.ValidationError) -> str:
    """'expected <what the schema wants>, got <value>' for one validation error."""
    return f"expected {_expected(error)}, got {_short(error.instance)}"


def _unknown_key_error(doc: LoadedYaml, error: jsonschema.ValidationError) -> PipelineError:
    path = tuple(error.absolute_path)
    allowed = sorted(error.schema.get("properties", {}))
    extras = sorted(set(error.instance) - set(allowed))
    key = extras[0] if extras else "?"
    hint = ""
    close = difflib.get_close_matches(key, allowed, n=1, cutoff=0.6)
    if close:
        hint = f"; did you mean {close[0]!r}?"
    elif allowed:
        hint = f"; known keys: {', '.join(allowed)}"
    return doc.error(path + (key,), f"unknown key {key!r}{hint}")


def _duplicate_item_error(doc: LoadedYaml, error: jsonschema.ValidationError) -> PipelineError:
    path = tuple(error.absolute_path)
    seen: list = []
    for i, item in enumerate(error.instance):
        if item in seen:
            first = seen.index(item)
            return doc.error(path + (i,), f"duplicate entry {_short(item)} (already at {format_path(path + (first,))})")
        seen.append(item)
    return doc.error(path, f"expected no duplicate entries, got {_short(error.instance)}")


def _to_pipeline_error(doc: LoadedYaml, error: jsonschema.ValidationError) -> PipelineError:
    # A oneOf/anyOf failure: report the alternative that got furthest.
    if error.validator in ("oneOf", "anyOf") and error.context:
        deepest = max(error.context, key=lambda e: (len(e.absolute_path), e.validator != "type"))
        if len(deepest.absolute_path) > len(error.absolute_path) or "x-expected" not in error.schema:
            return _to_pipeline_error(doc, deepest)
    if error.validator == "additionalProperties" and error.validator_value is False:
        return _unknown_key_error(doc, error)
    if error.validator == "uniqueItems":
        return _duplicate_item_error(doc, error)
    if "propertyNames" in error.absolute_schema_path:
        # The error is about a key; jsonschema reports the enclosing mapping.
        key = error.instance
        return doc.error(tuple(error.absolute_path) + (key,), f"expected {_expected(error)}, got {_short(key)}")
    if error.validator == "required":
        missing = [k for k in error.validator_value if k not in error.instance]
        return doc.error(tuple(error.absolute_path), f"missing required key {missing[0]!r}")
    got = _short(error.instance)
    if error.validator in ("oneOf", "anyOf") and isinstance(error.instance, dict):
        got = "a mapping with keys " + ", ".join(error.instance)  # which keys decide the branch
    return doc.error(tuple(error.absolute_path), f"expected {_expected(error)}, got {got}")


# Among errors on the same mapping, an unknown key comes first: `modles:` is
# best reported as "did you mean 'models'?", not as "missing 'models'".
_FIRST = {"additionalProperties": 0}


def nonfinite_paths(data, path: tuple = ()):
    """Key paths of every NaN or +-inf number in ``data``, in document order."""
    if isinstance(data, float) and not math.isfinite(data):
        yield path
    elif isinstance(data, dict):
        for key, value in data.items():
            yield from nonfinite_paths(value, path + (key,))
    elif isinstance(data, list):
        for i, value in enumerate(data):
            yield from nonfinite_paths(value, path + (i,))


def validate(doc: LoadedYaml, schema_name: str, memo: Any = None) -> None:
    """Raise PipelineError for the first (top-most in the file) schema error.

    YAML's .nan and .inf are numbers to JSON Schema, but a NaN threshold compares
    false against everything and silently switches its gate off: any non-finite
    number anywhere in the file is an error too, ahead of schema errors on its line.

    ``memo`` (a ValidationMemo, etforge.config.validation_memo): skip data it has seen pass
    under this schema; only a pass is remembered, so an error is found again every time.
    """
    if memo is None:
        _validate(doc, schema_name)
    else:
        memo.once(("schema", schema_name, doc.data), lambda: _validate(doc, schema_name))


def _validate(doc: LoadedYaml, schema_name: str) -> None:
    checker = validator(load_schema(schema_name))
    # (line, deeper paths first, priority, error factory)
    found = [
        (
            doc.line_of(path) or 0,
            -len(path),
            -1,
            lambda path=path: doc.error(path, f"expected a finite number, got {_short(_at(doc.data, path))}"),
        )
        for path in nonfinite_paths(doc.data)
    ]
    found += [
        (
            doc.line_of(tuple(e.absolute_path)) or 0,
            -len(e.absolute_path),
            _FIRST.get(e.validator, 1),
            lambda e=e: _to_pipeline_error(doc, e),
        )
        for e in checker.iter_errors(doc.data)
    ]
    if found:
        raise min(found, key=lambda f: f[:3])[3]()


def _at(data, path: tuple):
    for part in path:
        data = data[part]
    return data
