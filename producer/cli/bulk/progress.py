"""The bulk tool's progress bar (rich, on stderr): texts done of all, texts in flight, texts/s and time left;
once all are done, "done", the run's rate and its time.

Results land a request (or a worker's round of requests: up to 16 forward passes, seconds on a CPU) at a
time, so the bar moves in steps; a spinner and the time elapsed show the run is alive meanwhile. The rate is
the run's average since its first submit, not rich's speed over the last few steps (a step of a thousand
texts landing at once would read as hundreds of thousands of texts/s).
"""

from __future__ import annotations

import time

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, ProgressColumn, SpinnerColumn, TextColumn
from rich.progress import Progress as RichProgress
from rich.text import Text


class _InFlight(ProgressColumn):
    def render(self, task) -> Text:
        return Text("done" if task.finished else f"{task.fields['in_flight']:,} in flight")


class _Rate(ProgressColumn):
    def render(self, task) -> Text:
        rate = task.fields["rate"]
        return Text(f"{rate:,.1f} texts/s" if rate else "- texts/s")


class _Time(ProgressColumn):
    """The time elapsed and left while running; the run's time once done."""

    def render(self, task) -> Text:
        elapsed = _clock(task.finished_time if task.finished else task.elapsed or 0)
        if task.finished:
            return Text(f"in {elapsed}")
        rate, left = task.fields["rate"], task.total - task.completed
        return Text(f"{elapsed}, ETA {_clock(left / rate) if rate else '-'}")


def _clock(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


class Progress:
    """A context manager; `advance(n)` as texts are done, `in_flight(n)` as they are submitted or land.
    `shown=False` prints nothing."""

    def __init__(self, total: int, done: int, shown: bool):
        self._bar = RichProgress(TextColumn("embedding"), SpinnerColumn(finished_text="✓"), BarColumn(),
                                 MofNCompleteColumn(), _InFlight(), _Rate(), _Time(), console=Console(stderr=True),
                                 disable=not shown)
        self._task = self._bar.add_task("embed", total=total, completed=done, in_flight=0, rate=0.0)
        self._began: float | None = None
        self._done_here = 0  # texts done by this run (a resumed run's earlier ones do not count in its rate)

    def __enter__(self) -> Progress:
        self._bar.start()
        return self

    def __exit__(self, *exc) -> None:
        self._bar.stop()

    def in_flight(self, texts: int) -> None:
        if self._began is None and texts:
            self._began = time.monotonic()
        self._bar.update(self._task, in_flight=texts)

    def advance(self, texts: int) -> None:
        self._done_here += texts
        elapsed = time.monotonic() - (self._began or time.monotonic())
        self._bar.update(self._task, advance=texts, rate=self._done_here / elapsed if elapsed > 0 else 0.0)
