"""Every error etforge raises on purpose derives from EtforgeError: one line, naming the file, line and
key path when it knows them (``<file>:<line>: <key path>: <message>``), never shown with a traceback.

    EtforgeError      the base; ``exit_code`` is what the command exits with when it reaches the top
    PipelineError     a mistake in a user's pipeline or recipe file
    BadValue          a value etforge cannot use (a data file, an argument, a record) (also a ValueError)
    BuildError        a step that could not do its job (also a RuntimeError)
    Unsupported       what etforge does not do (yet) (also a NotImplementedError)

One handler (etforge.app.cli main) prints any that reaches it as ``etforge: error: <line>``.
"""

from __future__ import annotations


class EtforgeError(Exception):
    """An error etforge raises on purpose (see the module docstring)."""

    exit_code = 3  # doit's code for an error before any task runs

    def __init__(self, message: str = "", *, file: str | None = None, line: int | None = None, key: str | None = None):
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


class PipelineError(EtforgeError):
    """A mistake in a user's pipeline or recipe file."""


class BadValue(EtforgeError, ValueError):
    """A value etforge cannot use: a data file, an argument, a record."""


class BuildError(EtforgeError, RuntimeError):
    """A step that could not do its job: what it was given, and what it found."""


class Unsupported(EtforgeError, NotImplementedError):
    """Something etforge does not do (yet), said plainly."""
