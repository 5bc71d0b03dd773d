"""The forward-pass shape (padded-token budget, row cap), learned from the passes served.

A start-up probe measures a few seconds on whatever the machine is doing then; a worker started during a
load spike (a scale-up, a neighbour's job, a GPU still warming) would keep that guess for life. The shaper
keeps measuring instead: every full pass reports its tokens (the texts' own, not the padding) and seconds,
and now and then a round runs at a neighbouring shape (twice or half the budget or the rows). A neighbour
that serves clearly more of the texts' tokens per second than the current shape (the median of its trial
passes against the median of the current shape's recent passes, measured on the same traffic) becomes the
shape. Medians over several passes, a margin, and old measurements forgotten keep a few disturbed passes
from moving it; bounds keep it sane (never below the device's floor, worker/engine/probe.py `device_floor`,
nor one pass of the model's longest input); a flag pins a dimension.

A bad first guess is left within seconds: a move that won is tried again at once, twice as far (x2, x4,
x8: 1 -> 64 rows in three trials, not six of 28 passes each), and a trial that is clearly far faster or
slower after two passes is judged then.

Pure: no torch, no Redis; the engine asks `shape()` per round and calls `observe()` per pass.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections import deque
from dataclasses import dataclass

WINDOW = 8  # recent passes of the current shape that its rate is the median of
TRIAL_PASSES = 4  # passes a neighbouring shape runs before it is judged
EXPLORE_EVERY = 24  # full passes of the current shape between two trials
MARGIN = 0.05  # a neighbour must be this much faster (relative) to become the shape
HORIZON = 120.0  # seconds after which a measurement is forgotten
FULL = 0.5  # a pass counts when it used at least this share of its shape's budget or rows
MAX_STEP = 8  # the farthest a repeated winning move jumps at once
CLEAR = 2.0  # a trial this many times faster (or slower) than the current shape on its first passes is judged early
EARLY_PASSES = 2  # trial passes enough for such a clear verdict


@dataclass(frozen=True)
class Shape:
    tokens: int  # padded tokens per forward pass (rows * longest row)
    rows: int  # rows per forward pass


class Shaper:
    """The shape to run the next round at (`shape()`), learned from `observe()`d passes.

    start: the first guess (a short start-up probe, flags, or a device's safe shape).
    min_tokens, min_rows: the floor (the device's, and at least the model's longest input: one such pass must
        always fit); a start below it is raised to it, and no trial goes under it.
    max_tokens, max_rows: the largest shape worth trying on this device.
    pin_tokens, pin_rows: keep that dimension as `start` has it (a flag fixed it).
    """

    def __init__(self, start: Shape, *, min_tokens: int, max_tokens: int, max_rows: int, min_rows: int = 1,
                 pin_tokens: bool = False, pin_rows: bool = False, source: str = "probe", clock=time.monotonic):
        if min_tokens < 1 or max_tokens < min_tokens or max_rows < min_rows or min_rows < 1:
            raise ValueError(f"shape bounds out of order: tokens {min_tokens}..{max_tokens}, "
                             f"rows {min_rows}..{max_rows}")
        self.min_tokens, self.max_tokens = min_tokens, max_tokens
        self.min_rows, self.max_rows = min_rows, max_rows
        self.pin_tokens, self.pin_rows = pin_tokens, pin_rows
        self.source = source
        self._clock = clock
        self._lock = threading.Lock()  # the forward stage observes, the heartbeat reads facts
        self.current = self._bounded(start)
        self._recent: deque[tuple[float, float]] = deque(maxlen=WINDOW)  # (when, tokens/s) at the current shape
        self._trial: Shape | None = None
        self._trial_move: tuple[str, bool, int] | None = None  # (dimension, up, factor) of the trial
        self._momentum: tuple[str, bool, int] | None = None  # the move that last won, to repeat farther
        self._trial_rates: list[float] = []
        self._since_trial = 0
        self._turn = 0  # which neighbour the next trial tries
        self.moves = 0  # shapes adopted

    @property
    def learning(self) -> bool:
        return not (self.pin_tokens and self.pin_rows)

    def shape(self) -> Shape:
        """The shape for the next round: a neighbour on trial, or the current one."""
        with self._lock:
            return self._trial or self.current

    def observe(self, shape: Shape, rows: int, padded_tokens: int, seconds: float,
                tokens: int | None = None) -> None:
        """One forward pass run at `shape`: `rows` rows, `padded_tokens` = rows * longest, of which `tokens`
        are the texts' own (None: all of them), in `seconds`. The rate compared is the texts' own tokens per
        second: padded ones are work the device did for nobody, and a larger shape pads more of mixed-length
        traffic (MiniLM on the corpus, 2 CPU cores: 64 rows served 11% fewer texts/s than 16 while computing
        more padded tokens/s, and the shaper moved up)."""
        if seconds <= 0 or not self.learning:
            return
        if padded_tokens < FULL * shape.tokens and rows < FULL * shape.rows:
            return  # a pass the traffic kept small says nothing about its shape
        rate = (padded_tokens if tokens is None else tokens) / seconds
        now = self._clock()
        with self._lock:
            if self._trial is not None and shape == self._trial:
                self._trial_rates.append(rate)
                if len(self._trial_rates) >= TRIAL_PASSES or self._clear(now):
                    self._judge()
            elif shape == self.current:
                self._recent.append((now, rate))
                self._since_trial += 1
                if self._trial is None and self._since_trial >= EXPLORE_EVERY and len(self._fresh(now)) >= WINDOW // 2:
                    self._start_trial()

    def rate(self) -> float | None:
        """The current shape's measured tokens per second, the texts' own (median of its recent passes)."""
        with self._lock:
            fresh = self._fresh(self._clock())
            return statistics.median(fresh) if fresh else None

    def facts(self) -> dict:
        """For the worker's advert: the shape in use, where it came from, and its measured rate."""
        rate = self.rate()
        return {"max_batch_tokens": self.current.tokens, "max_batch_size": self.current.rows,
                "budget_source": f"{self.source}, learned ({self.moves} moves)" if self.learning else self.source,
                **({"pass_tokens_per_s": round(rate, 1)} if rate is not None else {})}

    # -- internals ----------------------------------------------------------------------------------

    def _fresh(self, now: float) -> list[float]:
        return [rate for when, rate in self._recent if now - when <= HORIZON]

    def _moved(self, move: tuple[str, bool, int]) -> Shape:
        dimension, up, factor = move
        s = self.current
        if dimension == "tokens":
            return self._bounded(Shape(s.tokens * factor if up else s.tokens // factor, s.rows))
        return self._bounded(Shape(s.tokens, s.rows * factor if up else s.rows // factor))

    def _neighbours(self) -> list[tuple[tuple[str, bool, int], Shape]]:
        """Larger first (a spike's guess is too small far more often than too large), within bounds/pins."""
        moves = ([("tokens", True, 2), ("tokens", False, 2)] if not self.pin_tokens else []) + \
                ([("rows", True, 2), ("rows", False, 2)] if not self.pin_rows else [])
        moves.sort(key=lambda move: not move[1])  # up before down
        return [(move, shape) for move, shape in ((m, self._moved(m)) for m in moves) if shape != self.current]

    def _start_trial(self) -> None:
        if self._momentum is not None and (shape := self._moved(self._momentum)) != self.current:
            self._trial_move, self._trial = self._momentum, shape  # the last winner again, farther
        else:
            candidates = self._neighbours()
            if not candidates:
                return
            self._trial_move, self._trial = candidates[self._turn % len(candidates)]
            self._turn += 1
        self._trial_rates = []

    def _clear(self, now: float) -> bool:
        """After EARLY_PASSES, a trial all of whose passes beat (or all trail) the current shape's median by
        CLEAR: no need to run the rest (a starved start should not wait for more of its slow passes)."""
        fresh = self._fresh(now)
        if len(self._trial_rates) < EARLY_PASSES or not fresh:
            return False
        median = statistics.median(fresh)
        return min(self._trial_rates) > CLEAR * median or max(self._trial_rates) * CLEAR < median

    def _judge(self) -> None:
        fresh = self._fresh(self._clock())
        trial, move, rates = self._trial, self._trial_move, self._trial_rates
        self._trial, self._trial_move, self._trial_rates, self._since_trial = None, None, [], 0
        if fresh and statistics.median(rates) > (1 + MARGIN) * statistics.median(fresh):
            self.current = trial
            self._recent.clear()
            self._recent.extend((self._clock(), rate) for rate in rates)
            self._turn = 0  # from a new shape, look up first again
            self.moves += 1
            dimension, up, factor = move
            self._momentum = (dimension, up, min(factor * 2, MAX_STEP))
            self._since_trial = EXPLORE_EVERY  # a winning direction is tried again at the next pass
        else:
            self._momentum = None  # too far, or the peak: back to single steps every EXPLORE_EVERY passes

    def _bounded(self, shape: Shape) -> Shape:
        tokens = shape.tokens if self.pin_tokens else min(max(shape.tokens, self.min_tokens), self.max_tokens)
        rows = shape.rows if self.pin_rows else min(max(shape.rows, self.min_rows), self.max_rows)
        return Shape(tokens, rows)
