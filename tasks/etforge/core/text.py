"""One-line texts for tables, comments and error messages (one copy of each rule)."""

from __future__ import annotations

from etforge.core.errors import EtforgeError


def one_line(text, limit: int = 200) -> str:
    """``text`` on one line (whitespace runs become one space), cut to ``limit`` characters with '...'."""
    line = " ".join(str(text).split())
    return line if len(line) <= limit else line[: limit - 3] + "..."


def first_line(exc: BaseException) -> str:
    """'TypeName: first line of the message'; an OSError names its path ("No space left on device: /x");
    an error etforge raised on purpose is its own line (``file:line: key: message``)."""
    if isinstance(exc, EtforgeError):
        return one_line(str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__, 10_000)
    if isinstance(exc, OSError) and exc.filename:
        return f"{type(exc).__name__}: {exc.strerror}: {exc.filename}"
    if isinstance(exc, SystemExit):  # str() is only the code: "0" says nothing
        return f"SystemExit: the code called sys.exit({exc.code!r})"
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")
