"""etforge's own files that a crash, a full disk or a hand edit damaged: set aside, never fatal.

Every file etforge keeps for itself (memos, content keys) is a cache, treated the way doit
treats its database: a file that does not parse is moved out of the way as ``<name>.damaged``
with one warning, and the run goes on as if it were not there.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from etforge.core.errors import BadValue
from etforge.core.jsonfile import parse_json, read_regular


def set_aside(path: Path, why: str) -> None:
    """Move a damaged file of etforge's own out of the way (``<name>.damaged``), with one warning."""
    aside = path.with_name(path.name + ".damaged")
    try:
        os.replace(path, aside)
        kept = f"; set aside as {aside.name}"
    except OSError:
        kept = ""
    print(f"etforge: warning: {path}: {why}{kept}; starting it afresh", file=sys.stderr, flush=True)


def load_kept_json(path: Path) -> object | None:
    """The JSON value in ``path``; None when there is none, or when it is damaged (set aside)."""
    try:
        return parse_json(read_regular(path))
    except OSError:
        return None
    except BadValue as exc:  # not a regular file, too large, not JSON, too deep
        set_aside(path, str(exc))
    return None
