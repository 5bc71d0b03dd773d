"""The take stage: take a round (Lua: queue -> started), decode, verify and tokenise it, and hand it to the
forward stage; one round waits for the device at most (worker/serving/handoff.py), taken as late as the gathering
policy says (worker/serving/gathering.py).

A model has one queue per priority level; each take reads them in the order worker/serving/levels.py decides. A
round holds ROUND_PASSES forward passes of work by its jobs' estimated tokens, not a fixed number of requests.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import redis
from rq.exceptions import StopRequested

from embedfleet.common.errors import InternalError
from embedfleet.common.protocol.records import Outcome, Taken
from embedfleet.worker.engine import stageclock
from embedfleet.worker.serving import answers, rounds
from embedfleet.worker.serving.gathering import Device, Gathering, smoothed
from embedfleet.worker.serving.handoff import Handoff
from embedfleet.worker.serving.ledger import Ledger
from embedfleet.worker.serving.levels import Levels
from embedfleet.worker.serving.lifecycle import Lifecycle
from embedfleet.worker.serving.rounds import Round
from embedfleet.worker.serving.steps import Steps
from embedfleet.worker.serving.yielding import ROUND_PASSES

log = logging.getLogger("embedfleet.worker")

_OUTAGES = (redis.ConnectionError, redis.TimeoutError)


@dataclass
class RqHooks:
    """What the take stage asks of the rq worker around it (worker/serving/pipeline.py)."""

    maintain: Callable[[], None]  # rq's maintenance (registry cleanups), when due
    suspended: Callable[[bool], None]  # waits while `rq suspend` holds (raises StopRequested in burst mode)
    before_take: Callable  # (pipeline) -> None: idle state and rq's heartbeat, in the take's own round trip
    backoff: tuple[float, float]  # (factor, most seconds) between two tries while Redis is unreachable


class TakeStage:
    """Takes and prepares rounds for one worker; `loop` runs on its own thread, `take_round` may be called alone."""

    def __init__(self, name: str, levels: Levels, steps: Steps, *, max_jobs: int, max_deliveries: int,
                 poll_timeout: int, ledger: Ledger, device: Device, lifecycle: Lifecycle, rq: RqHooks,
                 inflight=None, metrics=None):
        self.name = name
        self.levels = levels
        self.steps = steps
        self.model = steps.engine.caps.name
        self.max_jobs = max_jobs
        self.max_deliveries = max_deliveries
        self.poll_timeout = poll_timeout
        self.ledger = ledger
        self.device = device
        self.gathering = Gathering(max_jobs)
        self.lifecycle = lifecycle
        self.rq = rq
        self.inflight = inflight  # worker/serving/inflight.py's InFlight, or None
        self.metrics = metrics
        self.burst = False
        self._prepare_seconds = 0.0  # a round's take and prepare, smoothed (the gathering policy's input)

    def loop(self, handoff: Handoff, max_idle_time: int | None) -> None:
        """Until stopped (burst mode: until nothing is queued or held): a slot, the gathering wait, a round."""
        backoff, idle_since = 1.0, time.monotonic()
        try:
            while not self.lifecycle.stopped:
                stageclock.lap("other")
                reserved = handoff.reserve(timeout=0.5)
                stageclock.lap("wait: device busy")
                if not reserved:
                    continue
                top = self._await_gathering()
                stageclock.lap("wait: gathering")
                try:
                    self.rq.maintain()
                    round_ = self.take_round(None if self.burst or top else self.poll_timeout, top)
                    backoff = 1.0
                except StopRequested:
                    handoff.unreserve()
                    break
                except _OUTAGES as exc:
                    handoff.unreserve()
                    log.error("worker %s: Redis unreachable (%s); retrying in %.0f s", self.name, exc, backoff)
                    backoff = self._pause(backoff)
                    continue
                except Exception:
                    handoff.unreserve()
                    log.exception("worker %s: unexpected error in the take stage", self.name)
                    backoff = self._pause(backoff)
                    continue
                if round_ is not None:
                    idle_since = time.monotonic()
                    stageclock.lap("other")
                    handoff.offer(round_)
                    stageclock.lap("wait: hand-off full")
                    continue
                handoff.unreserve()
                if self.burst and self._drained():
                    log.info("worker %s: queue empty, burst done", self.name)
                    break
                if max_idle_time is not None and time.monotonic() - idle_since > max_idle_time:
                    log.info("worker %s: idle for %d s, quitting", self.name, max_idle_time)
                    break
            if self.lifecycle.stopped:
                log.info("worker %s: stopping on request; finishing the jobs it holds", self.name)
        finally:
            self._flush_parked(handoff)
            handoff.close(timeout=30)  # full only if the forward stage is gone

    def _pause(self, backoff: float) -> float:
        """Wait `backoff` seconds after a failed take, or until the worker is asked to stop (a stop during an
        outage's backoff, up to rq's max_connection_wait_time, ends the worker at once); the next pause, longer
        (rq's backoff)."""
        self.lifecycle.stopping.wait(backoff)
        factor, most = self.rq.backoff
        return min(backoff * factor, most)

    def _await_gathering(self) -> int:
        """The gathering policy's wait (worker/serving/gathering.py) while a round is on the device; returns how
        many levels, from the highest, the take reads (0: a whole round, from every level)."""
        if self.device.take_now.is_set() or self.lifecycle.stopped:
            return 0
        now = self.device.now()
        if self.gathering.due(now, self._prepare_seconds):
            return 0  # no time left to gather in: the queue's depth is not asked (an LLEN per level)
        try:
            queued = self.levels.queued()
        except _OUTAGES:
            return 0  # the take that follows meets the outage and rides it out
        plan = self.gathering.plan(now, queued, self._prepare_seconds, self.levels.levels_up_to(now.lower))
        if plan is None:
            return 0
        return self.gathering.wait(plan, woken=self.device.take_now.wait, stopped=lambda: self.lifecycle.stopped,
                                   waiting=self._waiting)

    def _waiting(self, top: int) -> bool:
        try:
            return self.levels.waiting(top)
        except _OUTAGES:
            return False  # the next take meets the outage

    def _drained(self) -> bool:
        """Burst mode: nothing held any more (a retry may requeue a job), and the queue still empty. Waits
        while rounds are held, unless a paused bulk round wants the interactive work that arrived meanwhile
        (then False: this stage takes it)."""
        parked = len(self.inflight.parked) if self.inflight is not None else 0
        while len(self.ledger) > parked and not self.lifecycle.stopped:
            if self.device.wanted.wait(0.005):
                self.device.wanted.clear()
                return False
        return not parked and self.levels.queued() == 0

    def take_round(self, block: float | None, top: int = 0) -> Round | None:
        """Take up to max_jobs jobs (started in Redis as they are taken), decode and prepare them: a round of
        ROUND_PASSES passes of work, or with `top`, one of about one pass from the `top` highest levels (work
        to run between two passes of the round on the device)."""
        if self.inflight is not None:
            block = self.inflight.block(block)
        stageclock.lap("other")
        jobs, passes, shape = self.max_jobs, ROUND_PASSES, self.steps.engine.shape()
        if top:  # about one pass: its estimated tokens, and no more requests than a pass has rows
            jobs, passes = min(jobs, shape.rows) if shape is not None else jobs, 1
        max_tokens = passes * shape.tokens if shape is not None else 0  # 0: no limit but max_jobs
        take_began = time.time_ns()
        suspended, taken = self.levels.take(jobs, block, before=self.rq.before_take, max_tokens=max_tokens, top=top)
        stageclock.lap("take")
        taken_at = time.time_ns()
        began = time.monotonic()  # after the (maybe blocking) read: what is measured is the work
        if suspended:
            self.rq.suspended(self.burst)  # waits (logged) until `rq resume`
            return None
        answered, resumed = self.inflight.poll() if self.inflight is not None else ([], [])
        if not taken and not answered and not resumed:
            return None
        round_ = Round(time.time(), lower=self.levels.lower(taken), preemptible=self.levels.preemptible(taken))
        round_.stamps.take, round_.stamps.taken = take_began, taken_at
        self.ledger.hold(taken, round_.began)
        try:
            self.prepare(round_, taken, answered, resumed)
        except Exception as exc:  # a bug here must not strand what was taken: all of it goes back (Retry)
            log.exception("worker %s: preparing a round of %d failed", self.name, len(taken))
            error = InternalError(f"preparing the request failed: {type(exc).__name__}: {exc}")
            round_.runnable, round_.work = [], None
            followers = [job for job, *_ in answered + resumed]
            round_.answers = [answers.failed(job, error, Outcome.RETRY, None, self.model)
                              for job in taken + followers if job.claimed]
        self._prepare_seconds = smoothed(self._prepare_seconds, time.monotonic() - began)
        return round_ if round_.size else None  # all it took was parked (followers of requests in flight)

    def prepare(self, round_: Round, taken: list[Taken], answered=(), resumed=()) -> None:
        """Triage the taken jobs (worker/serving/rounds.py), park the ones identical to a request in flight
        elsewhere, and prepare the rest (worker/serving/steps.py). Parked followers whose wait ended come
        along: `answered` with their leader's bytes, `resumed` to run."""
        for job, request, result in answered:
            round_.answers.append(answers.served(job, result, request.reply_to, self.model))
        stageclock.lap("other")
        requests = rounds.triage(round_, taken, self.model, self.max_deliveries, time.time(),
                                 self.metrics.waited if self.metrics is not None else None)
        stageclock.lap("decode")
        if self.inflight is not None and self.steps.sends_claims(self.inflight.connection):
            self._prepare_claiming(round_, requests, resumed)
        else:
            if self.inflight is not None:  # requests identical to one in flight elsewhere park (inflight.py)
                round_.runnable, requests = self.inflight.attach(round_.runnable, requests)
                for job, request in resumed:
                    round_.run(job, request)
                    requests.append(request)
            round_.stamps.tokenise = time.time_ns()
            if requests:
                self.steps.prepare(round_, requests)
        round_.passes, round_.largest = rounds.passes_of(round_, self.steps.engine.shape())
        round_.stamps.prepared = time.time_ns()

    def _prepare_claiming(self, round_: Round, requests: list, resumed) -> None:
        """`prepare` where the in-flight markers and the vector cache share a Redis: tokenise the round first,
        then claim its markers and look its vectors up in one round trip (not one each). A round where some
        request follows one in flight elsewhere (rare: identical requests on two workers at once) is prepared
        again without it, which parks."""
        jobs, claim = list(round_.runnable), self.inflight.claim(requests)
        for job, request in resumed:  # parked followers whose leader let them go: they run, claiming nothing
            round_.run(job, request)
        everything = requests + [request for _, request in resumed]
        round_.stamps.tokenise = time.time_ns()
        if not everything:
            return
        self.steps.prepare(round_, everything, claim)
        kept_jobs, kept = self.inflight.settle(claim, jobs, requests)
        if len(kept) == len(requests):
            return
        round_.runnable = kept_jobs + [job for job, _ in resumed]
        kept += [request for _, request in resumed]
        self.steps.cache.uncount(round_.lookup)
        round_.work = round_.lookup = None
        round_.spread = {}
        if kept:
            self.steps.prepare(round_, kept)

    def _flush_parked(self, handoff: Handoff) -> None:
        """Stopping: parked followers stop waiting for their leaders (answered now, or run in a last round)."""
        if self.inflight is None or not self.inflight.parked:
            return
        answered, run = self.inflight.poll(everything=True)
        round_ = Round(time.time())
        self.prepare(round_, [], answered, run)
        handoff.reserve(timeout=30)  # (the forward stage frees it: a drain's thread, or the loop)
        handoff.offer(round_, timeout=30)
