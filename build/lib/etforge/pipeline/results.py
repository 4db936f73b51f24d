"""What a builder gets and hands back: the interface between the engine and tasks/builders/.

A stage's builder (named by dotted path in tasks/pipeline/stages.py) is called as
``builder(request) -> BuildResult`` inside the task's action; it may raise Skip
(this host cannot do it), Rejected (the scheme cannot apply to this model) or any error (the task fails with its first line).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class BuildResult:
    """What a builder returns: blobs it wrote and facts for the summary."""

    files: dict = field(default_factory=dict)  # blob name -> path in the work dir
    info: dict = field(default_factory=dict)
    status: str = "ok"  # ok | failed | skipped | not-runnable
    reason: str = ""  # one line, for failed/skipped/not-runnable


class Skip(Exception):
    """Raised by a builder when the host cannot do this task; the message says why."""


class Rejected(Exception):
    """Raised by a builder when the cell's scheme cannot apply to this model (e.g. it takes no layer
    of it); the message says why. Recorded as ``rejected``: the cell's outcome, never a failure."""


class Blocked(Exception):
    """Raised when an upstream task failed: recorded, never up to date, not a failure itself."""


@dataclass(frozen=True)
class Entry:
    """An upstream task's verified store entry."""

    task: str  # its task name, for messages
    files: dict  # blob name -> path in the store
    info: dict


@dataclass(frozen=True)
class BuildRequest:
    """Everything a stage's builder reads."""

    plan: object  # etforge.config.model.Plan: root (model code, data), seed, benchmark options
    subject: object  # the ModelSpec (capture) or the Cell
    upstream: dict  # relation name (tasks/pipeline/stages.py) -> Entry
    workdir: Path  # where the builder writes its blobs
