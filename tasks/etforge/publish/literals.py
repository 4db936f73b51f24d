"""Literals of the languages etforge writes (Dart, CMake, YAML, C++), as Jinja filters
(etforge.publish.templates): any text from a pipeline becomes a valid, escaped literal.
"""

from __future__ import annotations

import json
import math

from etforge.core.text import one_line

C_COMMENT_LIMIT = 160  # characters of a // comment line in the C++ header
COMMENT_LIMIT = 200  # characters of a comment line in the Dart, YAML and CMake manifests


def comment(value) -> str:
    """Text for a # or // comment line of a manifest: one line."""
    return one_line(value, COMMENT_LIMIT)


def dart_string(value) -> str:
    """A single-quoted Dart string literal."""
    text = str(value)
    for a, b in (("\\", "\\\\"), ("'", "\\'"), ("$", "\\$"), ("\n", "\\n"), ("\r", "\\r")):
        text = text.replace(a, b)
    return f"'{text}'"


def dart_double(value) -> str:
    """A Dart ``double?`` literal (null: not measured)."""
    return "null" if value is None else repr(float(value))


def cmake_string(value) -> str:
    """A double-quoted CMake argument."""
    text = str(value)
    for a, b in (("\\", "\\\\"), ('"', '\\"'), ("$", "\\$"), (";", "\\;"), ("\n", "\\n")):
        text = text.replace(a, b)
    return f'"{text}"'


def yaml_string(value) -> str:
    """A double-quoted YAML scalar."""
    return json.dumps(str(value), ensure_ascii=False)  # a JSON string is a YAML double-quoted scalar


def c_string(value) -> str:
    """A C++ string literal for any text: printable ASCII as is, the rest as octal escapes."""
    out = []
    for byte in str(value).encode("utf-8"):
        ch = chr(byte)
        if ch in '"\\':
            out.append("\\" + ch)
        elif ch == "?":
            out.append("\\?")  # never part of a trigraph, whatever the compiler's mode
        elif 0x20 <= byte < 0x7F:
            out.append(ch)
        else:
            out.append(f"\\{byte:03o}")  # at most three digits: never swallows what follows
    return '"' + "".join(out) + '"'


def c_double(value) -> str:
    """A C++ double expression: a finite number, infinity, or NaN for None (not measured)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "std::numeric_limits<double>::quiet_NaN()"
    if math.isinf(value):
        return ("-" if value < 0 else "") + "std::numeric_limits<double>::infinity()"
    return repr(float(value))


def c_comment(value) -> str:
    """Text safe inside a // comment: one line, no trailing backslash (a line splice)."""
    text = one_line(value, C_COMMENT_LIMIT)
    return text.rstrip("\\")
