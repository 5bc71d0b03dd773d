"""worker/serving/livestats.py: texts/s over the last minute and the 10-second history, on a clock the test moves."""

from __future__ import annotations

from embedfleet.worker.serving.livestats import BUCKETS, LiveStats


class Clock:
    def __init__(self, now: float):
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_rate_is_over_the_time_running_then_over_the_last_minute():
    clock = Clock(1000.0)
    stats = LiveStats(clock)
    clock.now = 1005.0
    stats.finished(50)
    assert stats.facts()["texts_per_s"] == 10.0  # 50 texts in the 5 s it has run
    clock.now = 1104.0
    stats.finished(600)
    facts = stats.facts()
    # the window: the current bucket (4 s so far) and the five before it; the 50 texts are 99 s old
    assert facts["texts_per_s"] == round(600 / 54, 3)
    assert facts["texts_done"] == 650 and facts["rounds"] == 2
    history = facts["texts_history"]
    assert len(history) == BUCKETS and history[-1] == 600 and history[-11] == 50 and sum(history) == 650


def test_history_forgets_what_is_older_than_ten_minutes_and_reports_the_round_on_the_device():
    clock = Clock(0.0)
    stats = LiveStats(clock)
    stats.finished(7)
    stats.on_device(3, 120)
    clock.now = 10 * 60 + 5.0
    facts = stats.facts()
    assert sum(facts["texts_history"]) == 0 and facts["texts_per_s"] == 0
    assert (facts["current_requests"], facts["current_texts"]) == (3, 120)
