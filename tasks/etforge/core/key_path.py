"""How an error names a key in a YAML file: ``models.small_cnn.inputs[0].shape``."""

from __future__ import annotations

import json
import re

KeyPath = tuple  # of str | int

_PLAIN_KEY = re.compile(r"^[A-Za-z0-9_-]+$")


def format_path(path: KeyPath) -> str:
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        elif _PLAIN_KEY.match(str(part)):
            out += ("." if out else "") + str(part)
        else:  # quoted, so that a key like "../x" or "a.b" stays unambiguous
            out += f"[{json.dumps(str(part))}]"
    return out or "(top level)"
