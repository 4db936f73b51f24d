"""User-facing errors: one line, naming the file, line and key path."""

from __future__ import annotations


class PipelineError(Exception):
    """A mistake in a user's pipeline or recipe file.

    Rendered as ``<file>:<line>: <key path>: <message>``; never shown with a
    traceback.
    """

    def __init__(self, message: str, *, file: str | None = None, line: int | None = None, key: str | None = None):
        self.message = message
        self.file = file
        self.line = line
        self.key = key
        super().__init__(str(self))

    def __str__(self) -> str:
        where = ""
        if self.file:
            where = self.file + (f":{self.line}" if self.line else "") + ": "
        key = f"{self.key}: " if self.key else ""
        return f"{where}{key}{self.message}"
