"""The bulk tool's progress bar (rich, on stderr): texts done of all, texts/s and the time left."""

from __future__ import annotations

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, ProgressColumn, TextColumn, TimeRemainingColumn
from rich.progress import Progress as RichProgress
from rich.text import Text


class _Rate(ProgressColumn):
    def render(self, task) -> Text:
        return Text(f"{task.speed:,.0f} texts/s" if task.speed else "- texts/s")


class Progress:
    """A context manager; `advance(n)` as texts are done. `shown=False` prints nothing."""

    def __init__(self, total: int, done: int, shown: bool):
        self._bar = RichProgress(TextColumn("embedding"), BarColumn(), MofNCompleteColumn(), _Rate(),
                                 TextColumn("ETA"), TimeRemainingColumn(), console=Console(stderr=True),
                                 disable=not shown)
        self._task = self._bar.add_task("embed", total=total, completed=done)

    def __enter__(self) -> Progress:
        self._bar.start()
        return self

    def __exit__(self, *exc) -> None:
        self._bar.stop()

    def advance(self, texts: int) -> None:
        self._bar.advance(self._task, texts)
