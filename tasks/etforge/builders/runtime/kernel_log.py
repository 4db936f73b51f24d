"""Name the operator a program failed in: the runtime logs it, the Python error does not.

ExecuTorch's pybindings raise ``RuntimeError: method->execute() failed with error 0x12`` and nothing
more; the runtime's own log (``ET_LOG``, written to file descriptor 2 by the C++ library) says which
kernel refused which argument (``KernelCall failed at instruction 0:42 in operator
llama::update_cache.out``, after the ``Check failed (...)`` that tripped). The pybindings write it
through Python's ``sys.stderr``, a C++ kernel may write to descriptor 2: :func:`kernel_failures`
keeps both while the runtime runs, passes them on to stderr unchanged (the task's log keeps them),
and turns a failed call into one line that names the operator and the check.
"""

from __future__ import annotations

import io
import os
import re
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager, redirect_stderr

from etforge.core.errors import BuildError

_OPERATOR = re.compile(r"in operator ([^\s:]+(?:::[^\s:]+)*)")
_INSTRUCTION = re.compile(r"at instruction (\S+) in operator")
_CHECK = re.compile(r"Check failed \((.*)\): ?(.*)$")
_MAX_CHECK = 200  # characters of the failed check in the one line


def failure_line(error: str, log: str) -> str:
    """One line for a failed runtime call: the operator and instruction the runtime named, the last
    check that failed before it (its message, else its condition), and the runtime's own error."""
    lines = log.splitlines()
    found = [(i, m) for i, m in enumerate(map(_OPERATOR.search, lines)) if m]
    if not found:
        return f"the ExecuTorch runtime failed: {error} (it named no operator)"
    at, named = found[-1]
    operator = named.group(1)
    instruction = _INSTRUCTION.search(lines[at])
    checks: list[re.Match] = []  # the run of failed checks just before the kernel call: the innermost first
    for line in reversed(lines[:at]):
        match = _CHECK.search(line)
        if match is None:
            break
        checks.insert(0, match)
    said = ""
    if checks:
        condition, message = checks[0].group(1).strip(), checks[0].group(2).strip()
        said = f": {(message or condition)[:_MAX_CHECK]}"
    where = f" (instruction {instruction.group(1)})" if instruction else ""
    return f"the ExecuTorch runtime failed in operator {operator}{where}{said} [{error}]"


@contextmanager
def kernel_failures() -> Iterator[None]:
    """Run the block with fd 2 kept in a file; a RuntimeError from the runtime becomes a BuildError
    naming the operator it failed in. Its log is written on to stderr either way."""
    sys.stderr.flush()
    python_side = io.StringIO()
    with tempfile.TemporaryFile() as sink:
        saved = os.dup(2)
        os.dup2(sink.fileno(), 2)
        failure = None
        try:
            with redirect_stderr(python_side):
                yield
        except RuntimeError as error:
            if isinstance(error, BuildError):
                raise
            failure = error
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            sink.seek(0)
            log = sink.read().decode(errors="replace") + python_side.getvalue()
            sys.stderr.write(log)
        if failure is not None:
            raise BuildError(failure_line(str(failure), log)) from failure
