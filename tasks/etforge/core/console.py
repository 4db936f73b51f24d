"""Lines for the person running doit, on the process's real stderr.

``sys.__stderr__``: doit's JSON reporter swaps ``sys.stdout``/``sys.stderr`` for
buffers, and stdout must stay JSON.
"""

from __future__ import annotations

import sys


def say(line: str) -> None:
    stream = sys.__stderr__ or sys.stderr
    stream.write(line.rstrip("\n") + "\n")
    stream.flush()
