"""A declared expected failure costs nothing once recorded: its failure is replayed under its key.

The fake export of a/xnnpack/fp32 raises, and ``matrix.expected_failures`` names that cell. The
first run fails it (the console says ``expected-failure``, never ``FAILED``) and blocks its
verdicts; a second run runs nothing. It runs again when its key changes or with
``--retry-failed``; an undeclared failure still runs again every time.
"""

from __future__ import annotations

import re

from unit.support import PIPELINE
from unit.test_unit_engine_run import PROVISIONAL, Etforge

CELL = "a/xnnpack/fp32"
DECLARED = (
    PIPELINE
    + "matrix:\n  expected_failures:\n"
    + "    - {model: a, backend: xnnpack, quantization: fp32, reason: fake export breaks, link: https://x.org/1}\n"
)
# The tasks of CELL that `export validate` runs: the export fails, the validation is blocked.
OWN = {f"export:{CELL}", f"validate:{CELL}"}


def _etforge(unit_project, monkeypatch, capfd) -> Etforge:
    unit_project.write_pipeline(DECLARED)
    etforge = Etforge(unit_project, monkeypatch, capfd)
    etforge.control(fail={f"export:{CELL}": "raise"})
    return etforge


def test_a_declared_failure_is_recorded_once_and_replayed(unit_project, monkeypatch, capfd):
    etforge = _etforge(unit_project, monkeypatch, capfd)
    first = etforge("export", "validate")
    assert first.code == 0, first.out + first.err
    assert etforge.statuses() == {**PROVISIONAL, CELL: "expected-failure"}
    line = re.search(rf"^\[[\d:]+\] (\S+) +export:{CELL} ", first.out, re.M)
    assert line and line.group(1) == "expected-failure", first.out
    assert "FAILED" not in first.out
    # Every status word fits the column: the task names line up.
    columns = {m.start(2) - m.start(1) for m in re.finditer(r"^\[[\d:]+\] (\S+ +)(\S+:\S+)", first.out, re.M)}
    assert len(columns) == 1, first.out

    second = etforge("export", "validate")
    assert second.code == 0, second.out + second.err
    assert second.started == set() and second.calls == []
    assert re.search(r"0 task\(s\) run, \d+ up to date", second.out)
    assert etforge.statuses() == {**PROVISIONAL, CELL: "expected-failure"}  # replayed from its record

    retried = etforge("--retry-failed", "export", "validate")
    assert retried.started == OWN and [t for t, _ in retried.calls] == [f"export:{CELL}"]
    assert etforge.statuses()[CELL] == "expected-failure"

    # Its key changes (the model's code): it runs again, and so does everything of model a.
    unit_project.write("models/a.py", "# edited\n" + unit_project.root.joinpath("models/a.py").read_text())
    edited = etforge("export", "validate")
    assert OWN <= edited.started and all(":a" in t or ":a/" in t for t in edited.started), edited.started
    assert etforge("export", "validate").started == set()


def test_fixed_but_still_declared_it_passes_only_when_retried(unit_project, monkeypatch, capfd):
    etforge = _etforge(unit_project, monkeypatch, capfd)
    assert etforge("export", "validate").code == 0
    etforge.control()  # the fake export works now; nothing the key covers changed
    assert etforge("export", "validate").started == set()
    retried = etforge("--retry-failed", "export", "validate")
    assert retried.started == OWN
    assert retried.code == 1 and etforge.statuses()[CELL] == "unexpectedly-passing"


def test_an_undeclared_failure_still_runs_again(unit_project, monkeypatch, capfd):
    etforge = Etforge(unit_project, monkeypatch, capfd)
    etforge.control(fail={f"export:{CELL}": "raise"})
    first = etforge("export", "validate")
    assert first.code == 1 and re.search(rf"^\[[\d:]+\] FAILED +export:{CELL} ", first.out, re.M), first.out
    again = etforge("export", "validate")
    assert again.code == 1 and again.started == OWN
