"""The progress line of a run on a terminal: rendered from recorded durations (no clock, no TTY)."""

from __future__ import annotations

import io

from etforge.publish.progress import _is_terminal
from etforge.publish.progress_line import LiveLine, Progress, clock, render

TASKS = {
    "capture:a": None,
    "export:a/xnnpack/fp32": "a/xnnpack/fp32",
    "validate:a/xnnpack/fp32": "a/xnnpack/fp32",
    "export:a/portable/fp32": "a/portable/fp32",
    "report": None,
}
RECORDED = {"capture:a": 10.0, "export:a/xnnpack/fp32": 30.0, "validate:a/xnnpack/fp32": 5.0, "report": 2.0}


def test_the_line_counts_tasks_and_cells_and_prices_what_is_left_from_recorded_durations():
    progress = Progress(TASKS, RECORDED, workers=1, started_at=0.0)
    assert render(progress, now=0.0) == "[0/5 tasks] 0/2 cells · 0s elapsed · about 47s left"
    progress.finish("capture:a")
    progress.start("export:a/xnnpack/fp32", now=10.0)
    # 20 s of the export's recorded 30 s are left, then validate 5 and report 2
    assert render(progress, now=20.0) == "[1/5 tasks] 0/2 cells · 20s elapsed · about 27s left · running 1"
    for name in ("export:a/xnnpack/fp32", "validate:a/xnnpack/fp32"):
        progress.finish(name)
    assert "[3/5 tasks] 1/2 cells" in render(progress, now=50.0)  # a/xnnpack/fp32 has no task left


def test_workers_share_the_time_left_and_an_overrun_task_counts_nothing():
    progress = Progress(TASKS, RECORDED, workers=2, started_at=0.0)
    assert progress.seconds_left(now=0.0) == 47 / 2
    progress.start("capture:a", now=0.0)
    assert progress.seconds_left(now=100.0) == (30 + 5 + 2) / 2  # capture ran past its 10 s


def test_without_recorded_durations_the_time_left_is_said_to_be_unknown():
    progress = Progress({"export:b/xnnpack/fp32": "b/xnnpack/fp32"}, {}, started_at=0.0)
    assert (
        render(progress, now=65.0)
        == "[0/1 tasks] 0/1 cells · 1m05s elapsed · time left unknown (no recorded durations)"
    )
    assert clock(3725) == "1h02m" and clock(59.6) == "1m00s"


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_on_a_terminal_the_task_lines_scroll_above_the_line_and_it_goes_at_the_end(monkeypatch):
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.setenv("TERM", "xterm")
    out = Terminal()
    assert _is_terminal(out) and not _is_terminal(io.StringIO())
    monkeypatch.setenv("CI", "true")
    assert not _is_terminal(out)  # CI runners give pseudo-terminals: plain lines there
    live = LiveLine(out, Progress(TASKS, RECORDED, started_at=0.0))
    live.print("[12:00:00] start  capture:a")
    live.progress.finish("capture:a")
    live.refresh()
    live.stop()
    text = out.getvalue()
    assert "[12:00:00] start  capture:a" in text and "[1/5 tasks]" in text
