"""The one line a run keeps current on a terminal: tasks done of those to run, cells finished,
elapsed time and the time left, estimated from the durations recorded by earlier builds.

:class:`Progress` counts; :func:`render` says it (pure, tested in the unit tier); :class:`LiveLine`
keeps it at the bottom of a terminal with rich, while the timestamped lines scroll above it.
Off a terminal (CI, a pipe, ``--reporter json``) nothing of this runs: the lines stay plain.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field


def clock(seconds: float) -> str:
    """``1h02m``, ``4m05s``, ``12s``."""
    seconds = max(0, int(round(seconds)))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m"
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


@dataclass
class Progress:
    """What a run has done so far. ``tasks``: the tasks it may run (name -> the cell it belongs to,
    or None); ``durations``: task name -> seconds its last build took (etforge.engine.ci_plan
    recorded_durations); ``workers``: how many tasks run at once."""

    tasks: Mapping[str, str | None]
    durations: Mapping[str, float]
    workers: int = 1
    started_at: float = field(default_factory=time.monotonic)
    running: dict = field(default_factory=dict)  # task name -> when it started
    seen: set = field(default_factory=set)  # finished, failed or up to date

    def start(self, name: str, now: float | None = None) -> None:
        self.running[name] = time.monotonic() if now is None else now

    def finish(self, name: str) -> None:
        self.running.pop(name, None)
        self.seen.add(name)

    @property
    def cells(self) -> set:
        return {c for c in self.tasks.values() if c is not None}

    def cells_finished(self) -> int:
        seen = set(self.seen)  # a snapshot: the refresh thread reads while the reporter writes
        open_cells = {c for t, c in self.tasks.items() if c is not None and t not in seen}
        return len(self.cells - open_cells)

    def seconds_left(self, now: float | None = None) -> float | None:
        """The recorded durations of the tasks not yet done (a running one: what is left of its own),
        over the workers; None when no task still to do has a recorded duration."""
        now = time.monotonic() if now is None else now
        seen, running = set(self.seen), dict(self.running)  # snapshots (see cells_finished)
        left, known = 0.0, False
        for name in self.tasks:
            if name in seen or name not in self.durations:
                continue
            known = True
            took = self.durations[name]
            left += max(0.0, took - (now - running[name])) if name in running else took
        return left / max(1, self.workers) if known else None


def render(progress: Progress, now: float | None = None) -> str:
    """``[37/234 tasks] 5/64 cells · 1m12s elapsed · about 3m40s left (recorded durations)``."""
    now = time.monotonic() if now is None else now
    done, total = len(set(progress.seen) & set(progress.tasks)), len(progress.tasks)
    parts = [f"[{done}/{total} tasks] {progress.cells_finished()}/{len(progress.cells)} cells"]
    parts.append(f"{clock(now - progress.started_at)} elapsed")
    left = progress.seconds_left(now)
    parts.append("time left unknown (no recorded durations)" if left is None else f"about {clock(left)} left")
    running = len(dict(progress.running))
    if running:
        parts.append(f"running {running}")
    return " · ".join(parts)


class LiveLine:
    """The progress line at the bottom of a terminal (rich.live), the task lines printed above it."""

    def __init__(self, outstream, progress: Progress):
        from rich.console import Console
        from rich.live import Live
        from rich.text import Text

        self._text = Text
        self.progress = progress
        self.console = Console(file=outstream, highlight=False, markup=False, emoji=False)
        # redrawn once a second (the elapsed time moves) and on every task event
        self.live = Live(console=self.console, get_renderable=self._line, refresh_per_second=1, transient=True)
        self.live.start()

    def _line(self):
        return self._text(render(self.progress), overflow="ellipsis", no_wrap=True)

    def print(self, line: str) -> None:
        self.console.print(self._text(line), soft_wrap=True)
        self.refresh()

    def refresh(self) -> None:
        self.live.refresh()

    def stop(self) -> None:
        self.live.stop()
