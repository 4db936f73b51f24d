"""The JSON form of etforge's typed records (frozen dataclasses): what a record file keeps, read back safely.

    record.to_json() -> dict           every field that has a value (None left out), tuples as lists
    Kind.from_json(data) -> record     only the fields it knows, each only as a value of its type
    Kind.of(values) -> record          from measured values (lists become tuples); an unknown name is a TypeError

``from_json`` takes, for each field, only a value of the field's type (a float field only a
finite number; a field typed as another record, that record's JSON form), so that a
hand-edited, damaged or older file can never smuggle a malformed value into a decision. A
field the data lacks or holds wrongly keeps its default.
"""

from __future__ import annotations

import math
import typing
from dataclasses import fields, is_dataclass
from functools import cache

from etforge.core.errors import BadValue


@cache
def _type_hints(cls: typing.Any) -> dict:
    return typing.get_type_hints(cls)


def field_types(cls: type) -> dict:
    """The field types of a record class (memoised: every record read asks)."""
    return _type_hints(typing.cast(typing.Any, cls))


def _base(kind):
    """The one non-None type of ``kind`` (``float | None`` -> float), or ``kind`` itself."""
    args = set(typing.get_args(kind)) - {type(None)}
    base = next(iter(args)) if len(args) == 1 else kind
    return typing.get_origin(base) or base


def coerce(kind, value):
    """``value`` as a field of type ``kind`` holds it, else None (the field's default is used)."""
    base = _base(kind)
    if isinstance(base, type) and issubclass(base, TypedRecord):
        return base.from_json(value) if isinstance(value, dict) else None
    if base is float:
        ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
        return float(value) if ok else None
    if base is int:
        return value if isinstance(value, int) and not isinstance(value, bool) else None
    if base is bool or base is str:
        return value if isinstance(value, base) else None
    if base is dict:
        return dict(value) if isinstance(value, dict) else None
    if base is tuple:
        return tuple(value) if isinstance(value, list | tuple) else None
    return None


class TypedRecord:
    """A frozen dataclass with a JSON form (subclasses are ``@dataclass(frozen=True)``)."""

    @classmethod
    def from_json(cls, data):
        data = data if isinstance(data, dict) else {}
        hints = field_types(cls)
        values = {}
        for f in fields(cls):  # type: ignore[arg-type]
            if f.name in data:
                value = cls._read_field(f.name, hints[f.name], data[f.name])
                if value is not None:
                    values[f.name] = value
        return cls(**values)

    @classmethod
    def _read_field(cls, name: str, kind, value):
        """One field's value from its JSON form (a subclass reads a field of its own kind here)."""
        return coerce(kind, value)

    @classmethod
    def of(cls, values: dict):
        """A record from measured values (lists become tuples); an unknown field is a TypeError, so a
        writer cannot record what no reader knows."""
        hints = field_types(cls)
        return cls(
            **{k: tuple(v) if _base(hints.get(k)) is tuple and isinstance(v, list) else v for k, v in values.items()}
        )

    def to_json(self) -> dict:
        """Every field that has a value (None left out), tuples as lists, records as their JSON form."""
        out = {}
        for f in fields(self):  # type: ignore[arg-type]
            value = getattr(self, f.name)
            if value is not None:
                out[f.name] = to_json_value(value)
        return out


def to_json_value(value):
    """A field's value as JSON: a record's JSON form, a tuple as a list (of JSON values)."""
    if isinstance(value, TypedRecord):
        return value.to_json()
    if isinstance(value, tuple):
        return [to_json_value(v) for v in value]
    if is_dataclass(value) and not isinstance(value, type):
        raise BadValue(f"{type(value).__name__} is a dataclass without a JSON form")
    return value
