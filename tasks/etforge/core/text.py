"""One-line texts for tables, comments and error messages (one copy of each rule)."""

from __future__ import annotations


def one_line(text, limit: int = 200) -> str:
    """``text`` on one line (whitespace runs become one space), cut to ``limit`` characters with '...'."""
    line = " ".join(str(text).split())
    return line if len(line) <= limit else line[: limit - 3] + "..."


def first_line(exc: BaseException) -> str:
    """'TypeName: first line of the message'; an OSError names its path ("No space left on device: /x")."""
    if isinstance(exc, OSError) and exc.filename:
        return f"{type(exc).__name__}: {exc.strerror}: {exc.filename}"
    if isinstance(exc, SystemExit):  # str() is only the code: "0" says nothing
        return f"SystemExit: the code called sys.exit({exc.code!r})"
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")
