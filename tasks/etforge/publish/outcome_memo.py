"""The cells' outcomes of one run, each decided once while the records it read stay as they were.

    run = RunOutcomes(plan, host)     made once per run by the loader (etforge.app.loader)
    run.of(cell) -> CellOutcome       etforge.publish.outcome cell_outcome, the one decision
    run.outcomes(cells=None) -> [CellOutcome], in the order given (default: the plan's cells)
    run.by_name(cells=None) -> {cell name: CellOutcome}

A run reads the outcomes of its cells several times: the manifests' and the report's content
(when doit asks whether they are up to date, and again when they run), the exit status and the
summary table. Each reader gets this object, so that a no-op run decides each cell once.

A kept outcome is used again only while every record file its decision read (outcome.py reads
them through the ``read`` it is handed) keeps its stat signature (size, mtime, ctime, inode, or
missing), so a record written by a task of this run, in this process or a worker, is read again.
A record written less than RACY_NS before it was read is not trusted (git's "racily clean" rule,
as etforge.config.digest_cache): a rewrite within one timestamp tick could keep every field.
"""

from __future__ import annotations

from etforge.cache.records import RunRecords, signature, trusted
from etforge.checks.table import CHECKS, CheckTable
from etforge.config.model import Cell, Plan
from etforge.pipeline.specs import TaskSpec
from etforge.publish.outcome import CellOutcome, cell_outcome


class _Reader:
    """outcome.py's ``read``: the current record, with the signature its file had before it was read."""

    def __init__(self, records: RunRecords):
        self.records = records
        self.read: list = []  # (path, signature) of every record file read
        self.trusted = True  # False once a file was too fresh to vouch for its signature

    def __call__(self, spec: TaskSpec) -> dict | None:
        sig, record = self.records.state(spec.state_file)
        self.trusted = self.trusted and trusted(sig)
        self.read.append((spec.state_file, sig))
        return record if isinstance(record, dict) and record.get("key") == spec.key else None


class RunOutcomes:
    def __init__(
        self, plan: Plan, host: dict | None = None, records: RunRecords | None = None, checks: CheckTable = CHECKS
    ):
        self.plan = plan
        self.host = host  # etforge.config.machine.host_fingerprint(): benchmarks are read for it
        self.records = records or RunRecords()  # the run's parsed records, shared with the up-to-date checks
        self.checks = checks  # what reads the records' checks and derives the others (etforge.checks.table)
        self._kept: dict = {}  # cell name -> ([(record file, signature)], CellOutcome)
        self.decided = 0  # outcomes decided rather than kept: what a no-op run's test counts

    def of(self, cell: Cell) -> CellOutcome:
        kept = self._kept.get(cell.name)
        if kept is not None and all(signature(path) == sig for path, sig in kept[0]):
            return kept[1]
        reader = _Reader(self.records)
        result = cell_outcome(self.plan, cell, self.host, read=reader, checks=self.checks)
        self.decided += 1
        if reader.trusted:
            self._kept[cell.name] = (reader.read, result)
        else:
            self._kept.pop(cell.name, None)
        return result

    def outcomes(self, cells=None) -> list:
        return [self.of(c) for c in (self.plan.cells if cells is None else cells)]

    def by_name(self, cells=None) -> dict:
        return {o.cell: o for o in self.outcomes(cells)}
