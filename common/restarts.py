"""When a supervisor (`embedfleet up`, `embedfleet worker --gpus/--replicas`) starts a dead child again: a pause
that doubles with each quick death, and a limit."""

from __future__ import annotations

import signal

STABLE_SECONDS = 60.0  # a child that ran this long before it died starts a new count
FIRST_PAUSE = 1.0
LONGEST_PAUSE = 30.0


class Restarts:
    """The restart plan of one child. `after_exit(ran_seconds)` is called when it dies: the seconds to wait
    before starting it again, or None once it died `limit` times in a row, each within STABLE_SECONDS."""

    def __init__(self, limit: int):
        self.limit = limit
        self.failures = 0

    def after_exit(self, ran_seconds: float) -> float | None:
        if ran_seconds >= STABLE_SECONDS:
            self.failures = 0
        self.failures += 1
        if self.failures > self.limit:
            return None
        return min(FIRST_PAUSE * 2 ** (self.failures - 1), LONGEST_PAUSE)


def exit_reason(code: int | None) -> str:
    """How a child ended, for one line: `exited with code 3`, `was killed by SIGKILL`."""
    if code is None:
        return "is running"
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"
