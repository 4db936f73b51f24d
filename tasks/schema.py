"""JSON Schema validation with one-line errors that name file, line and key.

The schemas under ``schemas/`` are the single source of validation. A schema
node may carry ``x-expected`` (a phrase such as "a list of positive
integers") used verbatim in the message.
"""

from __future__ import annotations

import difflib
import json
from functools import lru_cache
from pathlib import Path

import jsonschema

from tasks.errors import PipelineError
from tasks.yamlfile import LoadedYaml

SCHEMA_DIR = Path(__file__).resolve().parent.parent / "schemas"


@lru_cache(maxsize=None)
def load_schema(name: str) -> dict:
    return json.loads((SCHEMA_DIR / name).read_text(encoding="utf-8"))


def _short(value) -> str:
    text = json.dumps(value) if not isinstance(value, str) else json.dumps(value)
    return text if len(text) <= 60 else text[:57] + "..."


_TYPE_NAMES = {"object": "a mapping", "array": "a list", "string": "a string",
               "integer": "an integer", "number": "a number", "boolean": "true or false",
               "null": "nothing"}


def _expected(error: jsonschema.ValidationError) -> str:
    if "x-expected" in error.schema:
        return error.schema["x-expected"]
    v, arg = error.validator, error.validator_value
    if v == "type":
        kinds = arg if isinstance(arg, list) else [arg]
        return " or ".join(_TYPE_NAMES.get(k, k) for k in kinds)
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
        return f"at least {arg} item(s)"
    if v == "maxItems":
        return f"at most {arg} item(s)"
    if v == "minProperties":
        return f"at least {arg} entr{'y' if arg == 1 else 'ies'}"
    if v == "minLength":
        return "a non-empty string"
    return error.message


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


def _to_pipeline_error(doc: LoadedYaml, error: jsonschema.ValidationError) -> PipelineError:
    # A oneOf/anyOf failure: report the alternative that got furthest.
    if error.validator in ("oneOf", "anyOf") and error.context:
        deepest = max(error.context, key=lambda e: (len(e.absolute_path), e.validator != "type"))
        if len(deepest.absolute_path) > len(error.absolute_path) or "x-expected" not in error.schema:
            return _to_pipeline_error(doc, deepest)
    if error.validator == "additionalProperties" and error.validator_value is False:
        return _unknown_key_error(doc, error)
    if error.validator == "required":
        missing = [k for k in error.validator_value if k not in error.instance]
        return doc.error(tuple(error.absolute_path), f"missing required key {missing[0]!r}")
    return doc.error(tuple(error.absolute_path),
                     f"expected {_expected(error)}, got {_short(error.instance)}")


def validate(doc: LoadedYaml, schema_name: str) -> None:
    """Raise PipelineError for the first (top-most in the file) schema error."""
    schema = load_schema(schema_name)
    validator = jsonschema.Draft202012Validator(schema)
    errors = list(validator.iter_errors(doc.data))
    if not errors:
        return
    errors.sort(key=lambda e: (doc.line_of(tuple(e.absolute_path)) or 0, -len(e.absolute_path)))
    raise _to_pipeline_error(doc, errors[0])
