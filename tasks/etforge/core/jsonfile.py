"""JSON that another process, machine or person wrote, read without trusting it.

    read_regular(path, limit)   the bytes of a regular file: a FIFO or a device is refused
                                without blocking, and at most ``limit`` bytes are read
    parse_json(raw)             the JSON value, or one UnusableJson (a BadValue) saying what is
                                wrong: not UTF-8, not JSON, nested deeper than MAX_NESTING,
                                an integer of more than MAX_DIGITS digits

Every reader of such a file (store manifests, task records, baselines, durations, etforge's
own memos) goes through these, so that none meets a RecursionError, a hang or an
OverflowError far from the file: whatever the bytes, the reader gets a value or one line.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import BinaryIO

from etforge.core.errors import BadValue

MAX_BYTES = 64 << 20  # a release's provenance of thousands of cells is a few MB: more is refused unread
MAX_DIGITS = 30  # no figure etforge records has more digits; a 5,000-digit integer is refused as it is parsed
MAX_NESTING = 64  # etforge's files nest a few levels; deeper is damage a recursive reader would choke on


class UnusableJson(BadValue):
    """Bytes that hold no JSON value a reader can use (see the module docstring)."""


def _kind_of(mode: int) -> str:
    for test, what in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return what
    return "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "a special file"


def _regular(mode: int) -> None:
    if not stat.S_ISREG(mode):
        raise BadValue(f"is {_kind_of(mode)}, not a regular file")


def open_regular(path: Path) -> BinaryIO:
    """``path`` (links followed) opened for reading when it is a regular file, else BadValue saying
    what it is: it is stat'ed before it is opened (a FIFO or a device is not even opened), opened
    with O_NONBLOCK (one swapped in meanwhile cannot block the open) and fstat'ed again. OSError
    when it cannot be (FileNotFoundError: there is none)."""
    _regular(os.stat(path).st_mode)
    f = open(os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC), "rb")
    try:
        _regular(os.fstat(f.fileno()).st_mode)
    except BaseException:
        f.close()
        raise
    return f


def read_regular(path: Path, limit: int = MAX_BYTES) -> bytes:
    """The bytes of the regular file at ``path`` (:func:`open_regular`), at most ``limit`` of them:
    BadValue when it holds more."""
    with open_regular(path) as f:
        size = os.fstat(f.fileno()).st_size
        data = f.read(limit + 1) if size <= limit else b""  # (it may grow while read)
    if size > limit or len(data) > limit:
        raise BadValue(f"is larger than {limit:,} bytes, the most read")
    return data


def _bounded_int(text: str) -> int:
    digits = len(text.lstrip("-"))
    if digits > MAX_DIGITS:
        raise UnusableJson(f"holds an integer of {digits:,} digits")
    return int(text)


def parse_json(raw: bytes | str):
    """The JSON value in ``raw``, else UnusableJson saying what is wrong: nothing here raises
    anything else, whatever the bytes."""
    try:
        value = json.loads(raw.decode("utf-8") if isinstance(raw, bytes) else raw, parse_int=_bounded_int)
    except UnusableJson:
        raise
    except UnicodeDecodeError:
        raise UnusableJson("is not UTF-8 text") from None
    except RecursionError:
        raise UnusableJson(f"nests deeper than {MAX_NESTING} levels") from None
    except ValueError as exc:
        raise UnusableJson(f"is not JSON ({exc})") from None
    if _deeper_than(value, MAX_NESTING):
        raise UnusableJson(f"nests deeper than {MAX_NESTING} levels")
    return value


def _deeper_than(value, limit: int) -> bool:
    """Iterative, so that any depth is safe to measure."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is None:
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in children)
    return False
