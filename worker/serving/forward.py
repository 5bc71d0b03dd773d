"""The forward stage: the device's loop, on the thread that called `work()`. Each prepared round is run on the
device (its forward passes, with the cache around them: worker/serving/steps.py) and handed to the finish stage;
between two of its passes another round may cut in (worker/serving/yielding.py decides, this stage does it).

A round still waiting for the device goes back to the head of its queue when the worker drains, or when it is
preemptible bulk work and interactive work arrived (worker/serving/levels.py); a drain's own thread gives back
the rounds the take stage hands over meanwhile, while the device finishes its round.
"""

from __future__ import annotations

import logging
import threading
import time

import redis

from embedfleet.worker.engine import stageclock
from embedfleet.worker.serving.gathering import Device
from embedfleet.worker.serving.handoff import END, Handoff
from embedfleet.worker.serving.heartbeat import Heartbeat, Watchdog
from embedfleet.worker.serving.ledger import Ledger
from embedfleet.worker.serving.levels import Levels
from embedfleet.worker.serving.lifecycle import Lifecycle
from embedfleet.worker.serving.livestats import LiveStats
from embedfleet.worker.serving.rounds import Round
from embedfleet.worker.serving.steps import Steps
from embedfleet.worker.serving.storing import with_retries
from embedfleet.worker.serving.yielding import PAUSE_WAIT, Move, after_call, between_passes, yields_at_pickup

log = logging.getLogger("embedfleet.worker")


class ForwardStage:
    """Runs one worker's rounds on the device. `loop` and everything it calls run on one thread (the engine
    calls `between` back on it too), so the share's round set aside is this stage's alone; `drain` may come
    from any thread."""

    def __init__(self, name: str, steps: Steps, levels: Levels, *, ledger: Ledger, device: Device,
                 lifecycle: Lifecycle, live: LiveStats, heartbeat: Heartbeat, watchdog: Watchdog | None = None,
                 metrics=None):
        self.name = name
        self.steps = steps
        self.levels = levels
        self.ledger = ledger
        self.device = device
        self.lifecycle = lifecycle
        self.live = live
        self.heartbeat = heartbeat
        self.watchdog = watchdog
        self.metrics = metrics
        self._set_aside: Round | None = None  # the share's bulk round, set aside for interactive work
        self._drainer: threading.Thread | None = None  # a drain's thread that gives the waiting rounds back
        self._drainer_lock = threading.Lock()

    def loop(self, handoff: Handoff, stages: list[threading.Thread]) -> None:
        """Until the take stage closes its hand-off (or a stage thread dies)."""
        while True:
            if self._set_aside is not None:  # a share's round set aside for interactive work: its turn now
                round_, self._set_aside = self._set_aside, None
                self._run(round_, handoff, stages)
                continue
            if (drainer := self._draining_thread()) is not None:  # it takes the waiting rounds back
                drainer.join()
            stageclock.lap("other")
            round_ = handoff.next_round(timeout=1.0)
            stageclock.lap("wait: for a round")
            if round_ is None:
                self.heartbeat.ensure_alive()
                if not all(stage.is_alive() for stage in stages):
                    log.error("worker %s: a stage thread is gone; stopping", self.name)
                    self.lifecycle.stop()
                    handoff.end_finish()
                    return
                continue
            if round_ is END:
                if (drainer := self._draining_thread()) is not None and drainer.is_alive():
                    # a drain's thread collects the rounds handed over until this end: let it have it, and
                    # wait until it has given them back (else the process could end with them still taken)
                    handoff.close()
                    drainer.join()
                    handoff.next_round()  # the end, which it puts back
                self._pass_on(handoff, END, stages)
                return
            self.heartbeat.ensure_alive()  # also under constant load, when no wait times out
            self._run(round_, handoff, stages)

    def _run(self, round_: Round, handoff: Handoff, stages) -> None:
        """One round picked up: given back (a drain; a bulk round that interactive work arrived behind), or
        run on the device; then handed to the finish stage."""
        if self.lifecycle.draining.is_set():
            self.give_back(round_)
        elif yields_at_pickup(round_, self._higher_waiting):
            self.give_back(round_, why="interactive work arrived")
        elif round_.work is not None:
            self._forward(round_, self._between(round_, handoff, stages))
        self._pass_on(handoff, round_, stages)

    def _forward(self, round_: Round, between=None, nested: bool = False) -> None:
        """The round's forward passes; `between` runs between two of them. A `nested` round (run inside
        another's `between`) leaves the device state, the watchdog and the timing to the outer round."""
        if self.watchdog is not None and not nested:
            self.watchdog.arm(round_.work)
        began, texts = time.monotonic(), round_.work.texts
        if not nested:
            self.device.busy(began, texts, round_.largest, round_.lower)
            self.live.on_device(len(round_.runnable), texts)
        round_.stamps.forward = time.time_ns()
        try:
            self.steps.forward(round_, between)
            if self.metrics is not None:
                self.metrics.forwarded(round_.work, time.monotonic() - began)
                self._report_shape()
            if not nested:  # how long a text takes on the device: when the take stage takes the next round
                self.device.measured(texts, time.monotonic() - began)
        except Exception as exc:  # an engine bug: every job of the round fails, retryably
            log.exception("worker %s: forward stage failed on a round of %d", self.name, round_.size)
            round_.engine_error = exc
        finally:
            round_.stamps.forwarded = time.time_ns()
            if not nested:
                self.device.free()
                self.live.on_device(0, 0)
                if self.watchdog is not None:
                    self.watchdog.disarm()

    def _between(self, outer: Round, handoff: Handoff, stages):
        """What the engine calls between two passes of `outer` (worker/serving/yielding.py decides)."""
        def between() -> None:
            if self.lifecycle.draining.is_set():  # the drain's thread takes what is prepared
                return
            ready = handoff.look()
            move, call = between_passes(ready, outer, self._higher_waiting, self._set_aside is not None)
            self._do(move, ready, handoff, stages)
            if call:  # the device waits for the take and the preparing of one round, no longer than PAUSE_WAIT
                self.device.call_for_interactive()
                ready = handoff.look(timeout=PAUSE_WAIT)
                self._do(after_call(ready), ready, handoff, stages)  # not ready yet: after the next pass

        return between

    def _do(self, move: Move, ready, handoff: Handoff, stages) -> None:
        if move is Move.RUN:
            round_ = handoff.keep(ready)
            if round_.work is not None:
                self._forward(round_, nested=True)
            self._pass_on(handoff, round_, stages)
        elif move is Move.LEAVE and not handoff.put_back(ready):  # the take stage queued its end meanwhile
            self.give_back(ready, why="the worker is stopping")
            self._pass_on(handoff, ready, stages)
        elif move is Move.GIVE_BACK:
            self.give_back(handoff.keep(ready), why="interactive work arrived")
            self._pass_on(handoff, ready, stages)
        elif move is Move.SET_ASIDE:  # the share's round keeps its turn: it runs next
            self._set_aside = handoff.keep(ready)

    def _pass_on(self, handoff: Handoff, item, stages) -> None:
        """To the finish stage, unless it is gone (its jobs stay started and are recovered)."""
        if not handoff.pass_on(item, lambda: all(stage.is_alive() for stage in stages)):
            self.lifecycle.stop()

    def _higher_waiting(self) -> bool:
        try:
            return self.levels.higher_waiting()
        except (redis.ConnectionError, redis.TimeoutError):
            return False  # run the round: the outage is the take stage's to ride out

    def _report_shape(self) -> None:
        shaper = self.steps.engine.shaper
        if shaper is not None:
            self.metrics.shaped(shaper.current.tokens, shaper.current.rows, shaper.rate())

    def give_back(self, *rounds: Round, why: str = "draining") -> None:
        """These rounds have not reached the device (a drain, or a round yielding to higher-level work): their
        runnable jobs go back to the head of their queues, in the order they were taken."""
        jobs = [job for round_ in rounds for job in round_.runnable]
        for round_ in rounds:
            round_.runnable, round_.work = [], None
        if not jobs:
            return
        try:
            returned = with_retries(lambda: self.levels.give_back(jobs), self.name)
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            log.error("worker %s: could not return %d jobs (%s); their leases will lapse", self.name, len(jobs), exc)
            returned = 0
        self.ledger.release(computed=jobs)
        log.log(logging.INFO if self.lifecycle.draining.is_set() else logging.DEBUG, "worker %s: %s: returned %d "
                "jobs to the head of their queue", self.name, why, returned)

    # -- a drain ----------------------------------------------------------------------------------------

    def drain(self, handoff: Handoff | None) -> None:
        """The round waiting for the device goes back now, not after the one on it: a thread of its own takes
        every round the take stage hands over until its end (the loop gives back any it picks up first)."""
        if handoff is None:  # not serving (yet)
            return
        with self._drainer_lock:
            self._drainer = threading.Thread(target=self._return_waiting, args=(handoff,),
                                             name=f"drain-{self.name}", daemon=True)
            self._drainer.start()

    def _draining_thread(self) -> threading.Thread | None:
        with self._drainer_lock:
            return self._drainer

    def _return_waiting(self, handoff: Handoff) -> None:
        held: list[Round] = []
        while (ready := handoff.next_round(timeout=0.2)) is not END:
            if ready is not None:
                held.append(ready)
        self.give_back(*held)  # all at once: the queue's head gets them in the order they were taken
        for round_ in held:
            handoff.pass_on(round_)  # its other answers (cancels, bad messages) are still written
        handoff.close()  # for the forward stage, which ends the pipeline
