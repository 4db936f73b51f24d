"""What a builder gets and hands back: the interface between the engine and etforge.builders.

A stage's builder (named by dotted path in etforge.pipeline.stages, one per model kind) is
called as ``builder(request) -> BuildResult`` inside the task's action; it may raise Skip
(this host cannot do it), Rejected (the scheme cannot apply to this model) or any error
(the task fails with its first line). What it found is its stage's result
(etforge.pipeline.stage_results).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import TypeVar

from etforge.config.model import Cell, ModelSpec, Plan
from etforge.core.errors import BadValue, EtforgeError
from etforge.pipeline.stage_results import StageResult

R = TypeVar("R", bound=StageResult)


class TaskStatus(StrEnum):
    """How a task ended, as its state record says."""

    OK = "ok"
    FAILED = "failed"
    SKIPPED = "skipped"  # this host cannot do it (says what it lacks)
    NOT_RUNNABLE = "not-runnable"  # a verdict this host cannot run: bundled for the device instead
    REJECTED = "rejected"  # the scheme cannot apply to this model
    BLOCKED = "blocked"  # a task it needs did not succeed

    @property
    def done(self) -> bool:
        """A record with this status may be up to date (failures and blocks run again)."""
        return self in (TaskStatus.OK, TaskStatus.SKIPPED, TaskStatus.NOT_RUNNABLE, TaskStatus.REJECTED)

    @property
    def stored(self) -> bool:
        """Its result is in the store."""
        return self in (TaskStatus.OK, TaskStatus.NOT_RUNNABLE)


def task_status(value) -> TaskStatus | None:
    """A record's status, or None when it holds none etforge knows (a damaged or foreign record)."""
    try:
        return TaskStatus(value)
    except ValueError:
        return None


@dataclass
class BuildResult:
    """What a builder returns: blobs it wrote, its stage's result, and how it ended."""

    files: dict = field(default_factory=dict)  # blob name -> path in the work dir
    result: StageResult | None = None
    status: TaskStatus = TaskStatus.OK  # ok | failed | not-runnable
    reason: str = ""  # one line, for failed/not-runnable

    @property
    def info(self) -> dict:
        """The JSON a record and a store entry keep: the result's fields, the status and reason."""
        found = self.result.to_json() if self.result is not None else {}
        return {**found, "status": str(self.status), "reason": self.reason}


class Skip(EtforgeError):
    """Raised by a builder when the host cannot do this task; the message says why."""


class Rejected(EtforgeError):
    """Raised by a builder when the cell's scheme cannot apply to this model (e.g. it takes no layer
    of it); the message says why. Recorded as ``rejected``: the cell's outcome, never a failure."""


class Blocked(EtforgeError):
    """Raised when an upstream task failed: recorded, never up to date, not a failure itself."""


@dataclass(frozen=True)
class Entry:
    """An upstream task's verified store entry."""

    task: str  # its task name, for messages
    files: dict  # blob name -> path in the store
    info: dict  # its result's JSON form (read it with the stage's result class)
    sha256: dict = field(default_factory=dict)  # blob name -> sha256, as the store verified it (not hashed again)

    def result(self, kind: type[R]) -> R:
        """The entry's result as ``kind`` (a StageResult class)."""
        return kind.from_json(self.info)


@dataclass(frozen=True)
class BuildRequest:
    """Everything a stage's builder reads."""

    plan: Plan  # root (model code, data), seed, benchmark options
    subject: ModelSpec | Cell  # the ModelSpec of a model stage (capture), else the Cell
    upstream: dict[str, Entry]  # relation name (etforge.pipeline.stages RELATIONS) -> its entry
    workdir: Path  # where the builder writes its blobs

    @property
    def cell(self) -> Cell:
        """The subject of a graph or cell stage."""
        if not isinstance(self.subject, Cell):
            raise BadValue(f"a model stage's builder asked for a cell (its subject is model {self.subject.name!r})")
        return self.subject

    @property
    def model(self) -> ModelSpec:
        """The model of the subject (a model stage's subject itself)."""
        return self.subject.model if isinstance(self.subject, Cell) else self.subject
