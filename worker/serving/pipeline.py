"""BatchWorker: an rq SimpleWorker that serves one model's queues many requests at a time, as a pipeline.

A model has one queue per priority level; each take reads them in the order worker/serving/levels.py decides.

Three stages joined by bounded hand-offs, so the device never waits for Redis or the tokenizer:

    take thread   take (Lua: queue -> started) -> decode -> verify + tokenise   -> [one round waits]
    main thread   forward passes over the round (length-sorted, token-budgeted)  -> [one round waits]
    finish thread cut/normalise/cast -> answer + acknowledge (Lua: one EVALSHA per round)

The take stage takes a new round only once the forward stage has picked up the previous one, so a worker
holds at most four rounds of `max_jobs` requests (one being taken, one waiting, one on the device, one being
finished) however deep the queue is. With fewer than a round's worth queued it takes the next round as late as
still lets it be ready when the device is free (`_await_gathering`), so arrivals join it.

Each stage thread laps its own clock (worker/engine/stageclock.py) at every stage and wait, exported as
`embedfleet_worker_stage_seconds_total{thread, stage}`: the profile bench/cpuside.py prints.

Every job it holds is in rq's started registry under a lease (common/protocol/keys.py) that the heartbeat thread
renews every third of the lease, also during a long forward pass; the same thread requeues any worker's
lapsed claims (common/protocol/operations.py `recover`) and runs the watchdog: a forward pass past its deadline (from
its token count) ends the process with WATCHDOG_EXIT so that its supervisor restarts it, and its jobs are
recovered by their lapsed leases. A job whose workers died with it MAX_DELIVERIES times is failed as poison
when it is taken again, never run.

Stopping: `stop()` finishes every job already taken, then `work()` returns. SIGTERM / SIGINT (`drain()`)
finish the round on the device, return the rounds not yet started to the head of the queue, and exit within
the drain timeout; a second signal, or the timeout, ends the process at once (the leases recover its jobs).

Status decisions, per job:
- answered by the engine (embeddings, or the request's own error such as a validation error): FINISHED;
- the engine's internal_error (a forward pass failed even alone, a crash in pre/postprocessing): requeued
  while rq's Retry lasts (the fault may be the machine's, e.g. CUDA out of memory), then FAILED;
- undecodable job data, or a request for another model: FAILED at once with the reason, never retried;
- cancelled while queued: CANCELED, answered `cancelled` unless it has an answer;
- taken again after its workers died with it MAX_DELIVERIES times: FAILED `poison`, never run;
- a long request spread over the fleet: FINISHED without an answer once its parts are queued; a part: answered
  into its request's join, never under its own id, FAILED rather than retried (worker/serving/spread.py).
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue as stdqueue
import signal
import socket
import sys
import threading
import time
from uuid import uuid4

import redis
from redis import Redis
from rq.exceptions import StopRequested
from rq.job import JobStatus
from rq.worker import SimpleWorker, WorkerStatus

from common.errors import InternalError
from common.protocol import operations
from common.protocol.keys import (DRAIN_TIMEOUT, HEARTBEAT_INTERVAL, LEASE_SECONDS, MAINTENANCE_INTERVAL,
                         MAX_DELIVERIES, PRIORITIES, RECOVER_LIMIT, RESULT_TTL, queue_name)
from common.redisclient import MAX_BLOCK
from common.request import job_reply_to
from common.result import Result
from common.serializer import MsgpackSerializer
from worker.serving.advertise import Advertiser
from worker.serving.spread import ChunkJobs
from worker.serving.steps import Steps
from worker.serving.storing import Store, with_retries
from worker.serving import rounds
from worker.serving.rounds import Round
from worker.serving.heartbeat import Heartbeat, Watchdog, timed_out
from worker.serving.inflight import InFlight
from worker.serving import answers
from worker.serving.levels import BULK_SHARE, Levels
from worker.serving.livestats import LiveStats
from worker.engine import stageclock
from common.protocol.records import Outcome, Taken
from worker.serving.rqjob import SafeJob
from worker.serving.rqpubsub import PromptUnsubscribe

log = logging.getLogger("embedfleet.worker")
rounds_log = logging.getLogger("embedfleet.worker.rounds")  # a line per round (off: `worker --no-log-rounds`)

_END = object()  # closes a hand-off: no more rounds
PAUSE_WAIT = 0.05  # most seconds a paused bulk round waits for the take stage to prepare the interactive work
GATHER_LEAD = 0.05  # least seconds before the device is free that the next round is taken (and tokenised)
# forward passes of work (by estimated tokens) one round holds at most: enough inputs that sorting them by
# length saves most of the padding (rounds of 3 passes ran a 16-text-request load at 0.7x of one sorted
# round); interactive work does not wait for a bulk round's end (it runs between two passes, _between)
ROUND_PASSES = 16
# a round of at most this many passes runs between two passes of a longer round of its level or a lower one
# (_cuts_in): work that arrives behind a large request waits about one pass, and the large one still gets at
# least a third of the device however much such work keeps coming
CUT_IN_PASSES = 2
LOOK_EVERY = 0.02  # seconds between two looks (one LLEN) for work queued behind a round of several passes
WATCHDOG_EXIT = 70  # a forward pass hung past its deadline (EX_SOFTWARE): the supervisor restarts the worker
FORCED_EXIT = 1  # a second stop signal, or a drain past its timeout


def unique_worker_name() -> str:
    """rq refuses a name that is still registered, and a crashed worker's stays so for minutes."""
    return f"embedfleet-{socket.gethostname()}-{os.getpid()}-{uuid4().hex[:8]}"


class BatchWorker(PromptUnsubscribe, SimpleWorker):
    """Serves `engine.caps.name`'s queue in pipelined rounds; the model stays loaded in this process.

    Args:
        engine: has `caps` (ModelCapabilities), `prepare(requests) -> Work`, `forward(Work)` and
            `finish(Work) -> results` (same order, never raising for a bad request); worker.engine.engine.Engine.
        connection: Redis client.
        cache: the fleet's vector cache (worker/serving/cache.py) around the engine (worker/serving/steps.py),
            with in-flight dedup (worker/serving/inflight.py); None: neither.
        max_jobs: most requests taken from the queue in one round (one Work through the engine).
        result_ttl: seconds result blobs, notify lists and finished rq jobs are kept; at least 1 (Redis
            refuses SET EX 0, which would lose every result).
        poll_timeout: seconds one blocking take waits; a stop request is honoured within this time.
        heartbeat_interval: seconds between capability adverts.
        lease: seconds a claim on a taken job lives without renewal; renewed (and other workers' lapsed
            claims recovered) every third of it, so a dead worker's jobs are back within 4/3 of it.
        max_deliveries: a job whose worker died with it this often is failed as poison.
        drain_timeout: seconds a drain (SIGTERM) may take before the process ends at once.
        watchdog: (floor seconds, seconds per padded token) of a forward round's deadline; None: no watchdog.
        name: rq worker name; default unique per start.
        info: this worker's facts for its advert (device, dtype, batch budget; `embedfleet status`).
        queue: serve this one rq queue only; default: the model's queue of each priority level.
        bulk_share: one round in this many reads the lowest priority level first (worker/serving/levels.py).
        metrics: a worker.serving.metrics.WorkerMetrics to record into, or None.
        Other keyword arguments go to rq's SimpleWorker.
    """

    def __init__(self, engine, connection: Redis, *, cache=None, max_jobs: int = 64, result_ttl: int = RESULT_TTL,
                 poll_timeout: int = 5, heartbeat_interval: float = HEARTBEAT_INTERVAL,
                 lease: float = LEASE_SECONDS, max_deliveries: int = MAX_DELIVERIES,
                 drain_timeout: float = DRAIN_TIMEOUT, watchdog: tuple[float, float] | None = None,
                 name: str | None = None, queue: str | None = None, info: dict | None = None,
                 bulk_share: int = BULK_SHARE, metrics=None, **kwargs):
        if max_jobs < 1:
            raise ValueError(f"max_jobs must be at least 1, got {max_jobs}")
        if result_ttl < 1:
            raise ValueError(f"result_ttl must be at least 1 second, got {result_ttl}: results are stored "
                             "with an expiry, and 0 or -1 would lose every one of them")
        kwargs.setdefault("maintenance_interval", MAINTENANCE_INTERVAL)  # rq's 600 s leaves dead jobs too long
        # One rq queue per priority level (worker/serving/levels.py), highest first; `queue` names a lone queue.
        queues = [queue] if queue else [queue_name(engine.caps.name, level) for level in PRIORITIES]
        # SafeJob: rq's maintenance (registry cleanups, handle_job_failure) reads jobs through it, so nothing a
        # job's hash names is imported or called (worker/serving/rqjob.py).
        super().__init__(queues, name=name or unique_worker_name(),
                         connection=connection, serializer=MsgpackSerializer, job_class=SafeJob,
                         default_result_ttl=result_ttl, **kwargs)
        self.engine = engine
        self.steps = Steps(engine, cache)
        self.max_jobs = max_jobs
        self.result_ttl = result_ttl
        # A blocking read must end well inside the client's socket timeout (common.redisclient).
        self.poll_timeout = max(1, min(poll_timeout, self.dequeue_timeout, int(MAX_BLOCK)))
        self.queue = self.queues[0]
        if lease <= 0 or max_deliveries < 1:
            raise ValueError(f"lease must be positive and max_deliveries at least 1, got {lease}, {max_deliveries}")
        self.schema = Levels(connection, [q.name for q in self.queues], self.name, result_ttl=result_ttl,
                             lease=lease, share=bulk_share)
        self.metrics = metrics  # worker/serving/metrics.py's WorkerMetrics, or None
        self.live = LiveStats()
        self.stages = stageclock.Stages()  # seconds per thread and stage (worker/engine/stageclock.py)
        if metrics is not None:
            metrics.watch_stages(self.stages)
        self.advertiser = Advertiser(connection, engine.caps, self.name, info=info, live=self._live_facts,
                                     stats=self.steps.stats)  # cache hits and misses
        self.store = Store(self.schema, connection, engine.caps.name, self.name)  # within Redis's value limit
        self.chunk_jobs = ChunkJobs(connection, [q.name for q in self.queues], engine.caps.name, result_ttl=result_ttl,
                                    chunks_per_job=getattr(engine, "chunks_per_job", 0), limit=self.store.limit)
        self.heartbeat_interval = heartbeat_interval
        self.lease = lease
        self.max_deliveries = max_deliveries
        self.drain_timeout = drain_timeout
        self.watchdog = Watchdog(*watchdog) if watchdog else None
        self.recovered = 0  # jobs of dead workers this worker requeued
        self.inflight = InFlight(connection, cache.identity) if cache is not None else None
        self._advertised_at = float("-inf")
        self._draining = False
        self._handoffs: tuple[stdqueue.Queue, stdqueue.Queue] | None = None
        self._drainer: threading.Thread | None = None  # a drain's thread that gives the waiting rounds back
        self.heartbeat_thread = Heartbeat(self._beat, min(heartbeat_interval, lease / 3), f"heartbeat-{self.name}")
        # taken and not yet acknowledged, by claim (id, execution): (job, taken at)
        self._held: dict[tuple[str, str], tuple[Taken, float]] = {}
        self._held_lock = threading.Lock()
        self._slot = threading.Semaphore(1)  # one taken round may wait for the device
        # (began, expected end, passes, lower) of the round on the device (_await_gathering)
        self._device_busy: tuple[float, float, int | None, bool] = (0.0, 0.0, None, False)
        # set when the take stage should take the next round now: no round is on the device, or interactive
        # work waits behind a bulk round (_await_gathering); cleared when a round goes on the device
        self._take_now = threading.Event()
        self._take_now.set()
        self._wanted = threading.Event()  # a paused bulk round wants interactive work taken (burst mode's _drained)
        self._deferred: Round | None = None  # the share's bulk round, set aside for interactive work (_between)
        self._seconds_per_text = 0.0
        self._prepare_seconds = 0.0  # a round's take and prepare, smoothed (_await_gathering)
        self._burst = False
        self.batches = 0
        self.served = 0
        self.push_exc_handler(self._answer_abandoned)

    # -- the loop ---------------------------------------------------------------------------------------

    def work(self, burst: bool = False, logging_level: str | None = None, max_idle_time: int | None = None,
             with_scheduler: bool = False, **log_kwargs) -> bool:
        """Serve until stopped (or, with `burst`, until the queue is empty). True if any job was served."""
        self.bootstrap(logging_level, **log_kwargs)
        self._burst, self.served = burst, 0
        prepared: stdqueue.Queue = stdqueue.Queue(maxsize=1)
        forwarded: stdqueue.Queue = stdqueue.Queue(maxsize=1)
        self._handoffs = (prepared, forwarded)
        stages = [threading.Thread(target=self._stage, args=(name, loop, *args), name=f"{name}-{self.name}",
                                   daemon=True)
                  for name, loop, args in (("take", self._take_loop, (prepared, max_idle_time)),
                                           ("finish", self._finish_loop, (forwarded,)))]
        try:
            self.advertiser.advertise()  # producers may submit as soon as this returns
            self._advertised_at = time.time()
            self.heartbeat_thread.start()
            if with_scheduler:
                self._start_scheduler(burst, logging_level, **log_kwargs)
            if threading.current_thread() is threading.main_thread():
                self._install_signal_handlers()
            for stage in stages:
                stage.start()
            self._forward_loop(prepared, forwarded, stages)
            for stage in stages:
                stage.join(timeout=60)  # a drain ends with the rounds held; a dead stage's partner soon
                if stage.is_alive():
                    log.error("worker %s: the %s stage did not end; leaving it", self.name, stage.name)
        finally:
            self._stop_requested = True  # a stage that outlived a crash of this loop must end too
            self._shut_down_heartbeat()
            try:
                self.teardown()
            except (redis.ConnectionError, redis.TimeoutError) as exc:  # rq's registration expires by itself
                log.warning("worker %s: could not unregister from Redis (%s)", self.name, exc)
        return self.served > 0

    def stop(self) -> None:
        """Warm stop from another thread: every job already taken is finished, then work() returns."""
        self._stop_requested = True

    def drain(self) -> None:
        """Graceful stop: finish the round on the device, give the rounds not yet on it back to the head of
        the queue, then `work()` returns. Past `drain_timeout` the process ends at once."""
        if not self._draining:
            self._draining = self._stop_requested = True
            timer = threading.Timer(self.drain_timeout, self._drain_overdue)
            timer.daemon = True
            timer.start()
            if self._handoffs is not None:  # the round waiting for the device goes back now, not after it
                self._drainer = threading.Thread(target=self._return_waiting, args=self._handoffs,
                                                 name=f"drain-{self.name}", daemon=True)
                self._drainer.start()

    def _return_waiting(self, prepared: stdqueue.Queue, forwarded: stdqueue.Queue) -> None:
        """A drain: give back the rounds the take stage hands over from now on, while the device may still
        be busy with its own (the forward stage gives back any it picks up first)."""
        held: list[Round] = []
        while True:
            try:
                round_ = prepared.get(timeout=0.2)
            except stdqueue.Empty:
                continue
            if round_ is _END:
                break
            self._slot.release()
            held.append(round_)
        self._give_back(*held)  # all at once: the queue's head gets them in the order they were taken
        for round_ in held:
            forwarded.put(round_)  # its other answers (cancels, bad messages) are still written
        prepared.put(_END)  # for the forward stage, which ends the pipeline

    def _drain_overdue(self) -> None:
        log.error("worker %s: the drain took more than %g s; exiting now (the leases recover its jobs)",
                  self.name, self.drain_timeout)
        _exit_now(FORCED_EXIT)

    def _install_signal_handlers(self):
        """SIGTERM / SIGINT drain; a second one ends the process at once. Handlers only set flags: raising
        inside a Redis read could strand taken ids."""
        def on_signal(signum, frame):
            if self._draining:
                log.warning("worker %s: second %s; exiting now (the leases recover its jobs)", self.name,
                            signal.Signals(signum).name)
                _exit_now(FORCED_EXIT)
            log.info("worker %s: %s: draining (a second signal exits at once)", self.name,
                     signal.Signals(signum).name)
            self.drain()

        signal.signal(signal.SIGINT, on_signal)
        signal.signal(signal.SIGTERM, on_signal)

    def _shutdown(self):
        """Signals only set the flag: raising inside a Redis read could strand taken ids (rq's way)."""
        self._stop_requested = True

    def _stage(self, name: str, loop, *args) -> None:
        stageclock.bind(self.stages, name)
        try:
            loop(*args)
        except BaseException:
            log.exception("worker %s: the %s stage died; stopping the worker (its jobs are recovered from "
                          "the started registry)", self.name, name)
            self._stop_requested = True
            raise

    def _forward_loop(self, prepared: stdqueue.Queue, forwarded: stdqueue.Queue, stages) -> None:
        """The device stage, on the calling thread. Ends when the take stage closes its hand-off."""
        stageclock.bind(self.stages, "forward")
        while True:
            if self._deferred is not None:  # a share's round set aside for interactive work: its turn now
                round_, self._deferred = self._deferred, None
                self._run(round_, prepared, forwarded, stages)
                continue
            if self._drainer is not None:  # draining: the drain's thread takes the waiting rounds back
                self._drainer.join()
            stageclock.lap("other")
            try:
                round_ = prepared.get(timeout=1.0)
            except stdqueue.Empty:
                stageclock.lap("wait: for a round")
                self.heartbeat_thread.ensure_alive()
                if not all(stage.is_alive() for stage in stages):
                    log.error("worker %s: a stage thread is gone; stopping", self.name)
                    self._stop_requested = True
                    with contextlib.suppress(stdqueue.Full):
                        forwarded.put_nowait(_END)
                    return
                continue
            stageclock.lap("wait: for a round")
            if round_ is _END:
                if self._drainer is not None and self._drainer.is_alive():
                    # a drain's thread collects the rounds handed over until this end: let it have it, and
                    # wait until it has given them back (else the process could end with them still taken)
                    prepared.put(_END)
                    self._drainer.join()
                    prepared.get()  # the end, which it puts back
                self._hand_off(forwarded, _END, stages)
                return
            self.heartbeat_thread.ensure_alive()  # also under constant load, when no get times out
            self._slot.release()  # the take stage may prepare the next round while this one runs
            self._run(round_, prepared, forwarded, stages)

    def _run(self, round_: Round, prepared: stdqueue.Queue, forwarded: stdqueue.Queue, stages) -> None:
        """One round picked up by the forward stage: given back (a drain; a bulk round that interactive work
        arrived behind), or run on the device, then handed to the finish stage."""
        if self._draining:
            self._give_back(round_)
        elif round_.preemptible and round_.work is not None and self._higher_waiting():
            self._give_back(round_, why="interactive work arrived")
        elif round_.work is not None:
            self._forward(round_, self._between(round_, prepared, forwarded, stages))
        self._hand_off(forwarded, round_, stages)

    def _forward(self, round_: Round, between=None, nested: bool = False) -> None:
        """The round's forward passes; `between` runs between two of them. A `nested` round (run inside
        another's `between`) leaves the device state, the watchdog and the timing to the outer round."""
        if self.watchdog is not None and not nested:
            self.watchdog.arm(round_.work)
        began, texts = time.monotonic(), round_.work.texts
        if not nested:
            self._take_now.clear()
            self._device_busy = (began, began + texts * self._seconds_per_text, round_.passes, round_.lower)
            self.live.on_device(len(round_.runnable), texts)
        try:
            self.steps.forward(round_.work, between)
            if self.metrics is not None:
                self.metrics.forwarded(round_.work, time.monotonic() - began)
                self._report_shape()
            if texts and not nested:  # how long a text takes on the device, smoothed: when to take next
                spent = (time.monotonic() - began) / texts
                self._seconds_per_text = 0.7 * self._seconds_per_text + 0.3 * spent
        except Exception as exc:  # an engine bug: every job of the round fails, retryably
            log.exception("worker %s: forward stage failed on a round of %d", self.name, round_.size)
            round_.engine_error = exc
        finally:
            if not nested:
                self._take_now.set()
                self.live.on_device(0, 0)
                if self.watchdog is not None:
                    self.watchdog.disarm()

    def _between(self, outer: Round, prepared: stdqueue.Queue, forwarded: stdqueue.Queue, stages):
        """Between two passes of `outer`, a prepared round that cuts in (_cuts_in: higher-level work into a
        bulk round; a short round of the same level or higher, which the take stage takes as soon as it is
        queued, _await_gathering) runs here, and `outer` then goes on where it paused: work behind a large
        round waits about one pass, and none of the large round's work is thrown away. In a bulk round, when
        interactive work waits, the take stage takes it now (a bulk round it had prepared goes back to its
        queue to make room) and the bulk round waits up to PAUSE_WAIT for it."""
        def between() -> None:
            if self._draining:  # the drain's thread takes what is prepared
                return
            try:
                ready = prepared.get_nowait()
            except stdqueue.Empty:
                ready = None
            if _cuts_in(ready, outer):
                return self._run_nested(ready, forwarded, stages)
            if not outer.lower or ready is _END or not self._higher_waiting():
                return self._put_back(ready, prepared, forwarded, stages)
            if ready is not None:  # a bulk round not yet on the device makes room for the take stage
                if ready.preemptible:  # back to its queue
                    self._slot.release()
                    self._give_back(ready, why="interactive work arrived")
                    self._hand_off(forwarded, ready, stages)
                elif self._deferred is None:  # the share's round keeps its turn: set aside, it runs next
                    self._slot.release()
                    self._deferred = ready
                else:
                    return self._put_back(ready, prepared, forwarded, stages)
            self._take_now.set()
            self._wanted.set()
            try:  # the device waits for the take and the preparing of one round, no longer than PAUSE_WAIT
                ready = prepared.get(timeout=PAUSE_WAIT)
            except stdqueue.Empty:
                return None  # not ready yet: it runs after the next pass
            if _interactive(ready):
                return self._run_nested(ready, forwarded, stages)
            return self._put_back(ready, prepared, forwarded, stages)  # another worker took the interactive work

        return between

    def _run_nested(self, round_: Round, forwarded: stdqueue.Queue, stages) -> None:
        """A round run between two passes of another (which keeps the device state)."""
        self._slot.release()
        if round_.work is not None:
            self._forward(round_, nested=True)
        self._hand_off(forwarded, round_, stages)

    def _put_back(self, ready, prepared: stdqueue.Queue, forwarded: stdqueue.Queue, stages) -> None:
        """A prepared round (or the end) not for now, back where it was: the take stage holds no slot to
        fill the hand-off meanwhile; but once it stops, it queues its end: then the round goes back."""
        if ready is None:
            return
        try:
            prepared.put_nowait(ready)
        except stdqueue.Full:  # (the end is last: nothing follows it in the hand-off)
            self._slot.release()
            self._give_back(ready, why="the worker is stopping")
            self._hand_off(forwarded, ready, stages)

    def _report_shape(self) -> None:
        shaper = getattr(self.engine, "shaper", None)
        if shaper is not None:
            self.metrics.shaped(shaper.current.tokens, shaper.current.rows, shaper.rate())

    def _round_tokens(self, passes: int = ROUND_PASSES) -> int:
        """A round holds about `passes` forward passes of work (by its jobs' estimated tokens), not a fixed
        number of requests; 0 (no limit) for an engine without a shape."""
        shape = self._shape()
        return passes * shape.tokens if shape is not None else 0

    def _shape(self):
        """The engine's forward-pass shape now (worker/engine/shaper.py), or None for an engine without one."""
        shape = getattr(self.engine, "shape", None)
        return shape() if shape is not None else None

    def _higher_waiting(self) -> bool:
        try:
            return self.schema.higher_waiting()
        except (redis.ConnectionError, redis.TimeoutError):
            return False  # run the round: the outage is the take stage's to ride out

    def _give_back(self, *rounds: Round, why: str = "draining") -> None:
        """These rounds have not reached the device (a drain, or a round yielding to higher-level work): their
        runnable jobs go back to the head of their queues, in the order they were taken."""
        jobs = [job for round_ in rounds for job in round_.runnable]
        for round_ in rounds:
            round_.runnable, round_.work = [], None
        if not jobs:
            return
        try:
            returned = with_retries(lambda: self.schema.give_back(jobs), self.name)
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            log.error("worker %s: could not return %d jobs (%s); their leases will lapse", self.name, len(jobs), exc)
            returned = 0
        with self._held_lock:
            for job in jobs:
                self._held.pop((job.id, job.execution), None)
        if self.inflight is not None:
            self.inflight.release([job.id for job in jobs])
        log.log(logging.INFO if self._draining else logging.DEBUG, "worker %s: %s: returned %d jobs to the head of "
                "their queue", self.name, why, returned)

    def _hand_off(self, forwarded: stdqueue.Queue, item, stages) -> None:
        """Put, unless the finish stage is gone (its jobs stay started and are recovered)."""
        stageclock.lap("other")
        while True:
            try:
                return forwarded.put(item, timeout=1.0)
            except stdqueue.Full:
                stageclock.lap("wait: hand-off full")
                if not all(stage.is_alive() for stage in stages):
                    self._stop_requested = True
                    return

    # -- take stage -------------------------------------------------------------------------------------

    def _take_loop(self, prepared: stdqueue.Queue, max_idle_time: int | None) -> None:
        backoff, idle_since = 1.0, time.monotonic()
        try:
            while not self._stop_requested:
                stageclock.lap("other")
                if not self._slot.acquire(timeout=0.5):
                    stageclock.lap("wait: device busy")
                    continue
                stageclock.lap("wait: device busy")
                top = self._await_gathering()
                stageclock.lap("wait: gathering")
                try:
                    if self.should_run_maintenance_tasks:
                        self.run_maintenance_tasks()
                    round_ = self.take_round(None if self._burst or top else self.poll_timeout, top)
                    backoff = 1.0
                except StopRequested:
                    self._slot.release()
                    break
                except (redis.ConnectionError, redis.TimeoutError) as exc:
                    self._slot.release()
                    log.error("worker %s: Redis unreachable (%s); retrying in %.0f s", self.name, exc, backoff)
                    time.sleep(backoff)
                    backoff = min(backoff * self.exponential_backoff_factor, self.max_connection_wait_time)
                    continue
                except Exception:
                    self._slot.release()
                    log.exception("worker %s: unexpected error in the take stage", self.name)
                    time.sleep(backoff)
                    backoff = min(backoff * self.exponential_backoff_factor, self.max_connection_wait_time)
                    continue
                if round_ is not None:
                    idle_since = time.monotonic()
                    stageclock.lap("other")
                    prepared.put(round_)
                    stageclock.lap("wait: hand-off full")
                    continue
                self._slot.release()
                if self._burst and self._drained():
                    log.info("worker %s: queue empty, burst done", self.name)
                    break
                if max_idle_time is not None and time.monotonic() - idle_since > max_idle_time:
                    log.info("worker %s: idle for %d s, quitting", self.name, max_idle_time)
                    break
            if self._stop_requested:
                log.info("worker %s: stopping on request; finishing the jobs it holds", self.name)
        finally:
            self._flush_parked(prepared)
            with contextlib.suppress(stdqueue.Full):  # full only if the forward stage is gone
                prepared.put(_END, timeout=30)

    def _flush_parked(self, prepared: stdqueue.Queue) -> None:
        """Stopping: parked followers stop waiting for their leaders (answered now, or run in a last round)."""
        if self.inflight is None or not self.inflight.parked:
            return
        answered, run = self.inflight.poll(everything=True)
        round_ = Round(time.time())
        self._prepare_round(round_, [], answered, run)
        self._slot.acquire(timeout=30)
        with contextlib.suppress(stdqueue.Full):
            prepared.put(round_, timeout=30)

    def _await_gathering(self) -> int:
        """While the device is busy and fewer jobs than a round are queued, take the next round only as late
        as still lets it be taken and prepared before the device is free (by the device's measured time per
        text and this stage's measured time per round): requests that arrive meanwhile join it, so a closed
        loop of small requests still fills whole batches. With a round's worth queued there is nothing to
        gather: it is taken at once, so the device never waits for the tokenizer. The wait ends as soon as
        the device is free, however wrong the estimate (a stall or a paused process inflates it).

        Behind a round of more than CUT_IN_PASSES passes, work of its level or a higher one is not left to
        wait for its end: looked for every LOOK_EVERY seconds, it is taken at once, as a round of about one
        pass, which runs between two passes of the round on the device (_between). Returns how many levels,
        from the highest, that take reads; 0: a whole round, from every level."""
        if self._take_now.is_set() or self._stop_requested:
            return 0
        try:
            if self.schema.queued() >= self.max_jobs:
                return 0
        except (redis.ConnectionError, redis.TimeoutError):
            return 0  # the take that follows meets the outage and rides it out
        _began, free_at, passes, lower = self._device_busy
        take_at = free_at - max(GATHER_LEAD, 2 * self._prepare_seconds)  # twice the time it takes: a margin
        top = self.schema.levels_up_to(lower) if passes is not None and passes > CUT_IN_PASSES else 0
        while (wait := take_at - time.monotonic()) > 0 and not self._stop_requested:
            if self._take_now.wait(min(wait, LOOK_EVERY if top else 0.1)):
                break
            if top and self._waiting(top):
                return top
        return 0

    def _waiting(self, top: int) -> bool:
        try:
            return self.schema.waiting(top)
        except (redis.ConnectionError, redis.TimeoutError):
            return False  # the next take meets the outage

    def _drained(self) -> bool:
        """Burst mode: nothing held any more (a retry may requeue a job), and the queue still empty. Waits
        while rounds are held, unless a paused bulk round wants the interactive work that arrived meanwhile
        (then False: the take stage takes it)."""
        parked = len(self.inflight.parked) if self.inflight is not None else 0
        while self.held_count() > parked and not self._stop_requested:
            if self._wanted.wait(0.005):
                self._wanted.clear()
                return False
        return not parked and self.schema.queued() == 0

    def take_round(self, block: float | None, top: int = 0) -> Round | None:
        """Take up to max_jobs jobs (started in Redis as they are taken), decode and prepare them: a round of
        ROUND_PASSES passes of work, or with `top`, one of about one pass from the `top` highest levels (work
        to run between two passes of the round on the device, _await_gathering)."""
        def idle(pipe):
            if not self.held_count():
                self.set_state(WorkerStatus.IDLE, pipeline=pipe)
            self.heartbeat(pipeline=pipe)

        if self.inflight is not None:
            block = self.inflight.block(block)
        stageclock.lap("other")
        jobs, passes, shape = self.max_jobs, ROUND_PASSES, self._shape()
        if top:  # about one pass: its estimated tokens, and no more requests than a pass has rows
            jobs, passes = min(jobs, shape.rows) if shape is not None else jobs, 1
        suspended, taken = self.schema.take(jobs, block, before=idle, max_tokens=self._round_tokens(passes), top=top)
        stageclock.lap("take")
        began = time.monotonic()  # after the (maybe blocking) read: what is measured is the work
        if suspended:
            self.check_for_suspension(self._burst)  # waits (logged) until `rq resume`
            return None
        answered, resumed = self.inflight.poll() if self.inflight is not None else ([], [])
        if not taken and not answered and not resumed:
            return None
        round_ = Round(time.time(), lower=self.schema.lower(taken), preemptible=self.schema.preemptible(taken))
        with self._held_lock:
            for job in taken:
                if job.claimed:
                    self._held[job.id, job.execution] = (job, round_.began)
        try:
            self._prepare_round(round_, taken, answered, resumed)
        except Exception as exc:  # a bug here must not strand what was taken: all of it goes back (Retry)
            log.exception("worker %s: preparing a round of %d failed", self.name, len(taken))
            error = InternalError(f"preparing the request failed: {type(exc).__name__}: {exc}")
            round_.runnable, round_.work = [], None
            followers = [job for job, *_ in answered + resumed]
            round_.answers = [answers.failed(job, error, Outcome.RETRY, None, self.engine.caps.name)
                             for job in taken + followers if job.claimed]
        self._prepare_seconds = 0.7 * self._prepare_seconds + 0.3 * (time.monotonic() - began)
        return round_ if round_.size else None  # all it took was parked (followers of requests in flight)

    def _prepare_round(self, round_: Round, taken: list[Taken], answered=(), resumed=()) -> None:
        """Triage the taken jobs (worker/serving/rounds.py), park the ones identical to a request in flight
        elsewhere, and prepare the rest (worker/serving/steps.py). Parked followers whose wait ended come
        along: `answered` with their leader's bytes, `resumed` to run."""
        model = self.engine.caps.name
        for job, request, result in answered:
            round_.answers.append(answers.served(job, result, request.reply_to, model))
        stageclock.lap("other")
        requests = rounds.triage(round_, taken, model, self.max_deliveries, time.time(),
                                 self.metrics.waited if self.metrics is not None else None)
        stageclock.lap("decode")
        if self.inflight is not None:  # requests identical to one in flight elsewhere park (inflight.py)
            round_.runnable, requests = self.inflight.attach(round_.runnable, requests)
            for job, request in resumed:
                round_.run(job, request)
                requests.append(request)
        if requests:
            round_.work = self.steps.prepare(requests)
        round_.passes = rounds.passes_of(round_.work, self._shape())

    # -- finish stage -----------------------------------------------------------------------------------

    def _finish_loop(self, forwarded: stdqueue.Queue) -> None:
        while True:
            stageclock.lap("other")
            round_ = forwarded.get()
            stageclock.lap("wait: for a round")
            if round_ is _END:
                break
            try:
                self.finish_round(round_)
            except Exception:  # its jobs stay started and are recovered by maintenance
                log.exception("worker %s: could not store a round of %d; its jobs will be recovered",
                              self.name, round_.size)
                self._release(round_)

    def finish_round(self, round_: Round) -> None:
        """Answers for every job of the round, then the script that stores and acknowledges them (one call, or
        a few for a round of large results: worker/serving/storing.py)."""
        stageclock.lap("other")
        found = rounds.results(round_, self.steps.finish, self.engine.caps.name)
        written = rounds.answers_of(round_, found, self.engine.caps.name)
        written = self.chunk_jobs.settle(round_, written)  # long requests spread, parts of them joined
        stageclock.lap("answers")
        done, written = self.store.write(written, time.time() - round_.began)
        stageclock.lap("publish")
        self._release(round_)
        if self.metrics is not None:
            self.metrics.answered([answer.code for answer in written])
        self.batches += 1
        self.served += done.finished
        self.live.finished(sum(result.shape[0] for result in found if result is not None and result.ok))
        for request_id, problem in done.problems:
            log.warning("worker %s: request %s: %s", self.name, request_id, problem)
        if not round_.size:  # it went back to its queue before the device (logged there)
            return
        rounds_log.info("worker %s: round of %d: %d served, %d failed, %d requeued%s in %.3f s", self.name,
                        round_.size, done.finished, done.failed, done.requeued,
                        f", {done.late} answered late (their claim had lapsed)" if done.late else "",
                        time.time() - round_.began)

    # -- held jobs --------------------------------------------------------------------------------------

    def held_count(self) -> int:
        with self._held_lock:
            return len(self._held)

    def _release(self, round_: Round) -> None:
        with self._held_lock:
            for answer in round_.answers:
                self._held.pop((answer.taken.id, answer.taken.execution), None)
            for job in round_.runnable:
                self._held.pop((job.id, job.execution), None)
        if self.inflight is not None:  # after their answers: followers see a result, or run on their own
            self.inflight.release([job.id for job in round_.runnable])

    # -- rq's maintenance answers for jobs it recovers ----------------------------------------------------

    def _answer_abandoned(self, job, exc_type, exc_value, tb):
        """rq's maintenance fails abandoned jobs without telling the producer; leave it an error blob."""
        if exc_type is not None and not job.should_retry:
            self._answer_failed(job, f"the worker serving this request died or hung past the job timeout "
                                     f"({exc_type.__name__}); resubmit it")

    def handle_job_failure(self, job, queue, started_job_registry=None, exc_string="", execution=None):
        """rq's maintenance calls this for ids stuck in the intermediate list; answer the producer too."""
        super().handle_job_failure(job, queue, started_job_registry, exc_string, execution)
        if job.get_status(refresh=False) == JobStatus.FAILED:
            self._answer_failed(job, "the request was stuck in the intermediate list: its worker died before "
                                     "starting it; resubmit it")

    def _answer_failed(self, job, message: str) -> None:
        """An internal_error blob unless the request has an answer, on every path a waiter may listen to."""
        operations.publish(self.connection, Result.failure(job.id, self.engine.caps.name, InternalError(message)),
                           self.result_ttl, job_reply_to(job), only_if_absent=True)

    # -- background heartbeat ---------------------------------------------------------------------------

    def _beat(self) -> None:
        """Every third of the lease: the watchdog, renew the leases of the jobs held (each only until its
        timeout), requeue other workers' lapsed claims; every heartbeat interval, the advert."""
        if self.watchdog is not None and (overdue := self.watchdog.overdue()):
            log.critical("worker %s: a forward pass over %d padded tokens has run %.0f s, past its %.0f s "
                         "deadline; exiting with %d so that the supervisor restarts the worker (the leases "
                         "recover its jobs)", self.name, *overdue, WATCHDOG_EXIT)
            _exit_now(WATCHDOG_EXIT)
        stamp = time.time()
        with self._held_lock:
            held = [job for job, since in self._held.values() if not timed_out(job.timeout, stamp - since)]
        if held:
            self.schema.refresh(held)
        if self.inflight is not None:
            self.inflight.renew()  # the markers of the requests it computes: their followers keep waiting
        if stamp - self._advertised_at >= self.heartbeat_interval:
            self.advertiser.advertise()
            if held:
                self.heartbeat()
            self._advertised_at = stamp
        else:
            self.advertiser.publish_live()
        self.recover()

    def _live_facts(self) -> dict:
        """The advert's changing part: idle, busy (holding taken jobs) or draining, and worker.serving.livestats'."""
        state = "draining" if self._draining else "busy" if self.held_count() else "idle"
        shaper = getattr(self.engine, "shaper", None)  # the shape in use and its measured rate
        return {"state": state, **self.live.facts(), **(shaper.facts() if shaper is not None else {})}

    def recover(self) -> int:
        """Requeue every lapsed claim of this model's queue (a dead worker's jobs); returns how many."""
        recovered = self.schema.recover(RECOVER_LIMIT)
        if recovered:
            self.recovered += len(recovered)
            owners = sorted({r.worker or "?" for r in recovered})
            log.warning("worker %s: requeued %d jobs of %s, whose lease lapsed (up to %.1f s ago)", self.name,
                        len(recovered), ", ".join(owners), max(r.overdue for r in recovered))
        return len(recovered)

    def _shut_down_heartbeat(self) -> None:
        self.heartbeat_thread.stop()
        try:
            self.advertiser.withdraw()
        except redis.RedisError as exc:
            log.warning("worker %s: could not withdraw its advert (%s); it expires by itself", self.name, exc)


def _interactive(ready) -> bool:
    """Whether what the take stage handed over is a round of higher-level (interactive) work."""
    return ready is not None and ready is not _END and not ready.lower


def _cuts_in(ready, outer: Round) -> bool:
    """Whether a prepared round runs between two passes of `outer`: higher-level work in a lower round,
    whatever its size; work of the same level or higher when it is short (at most CUT_IN_PASSES passes, and
    fewer than `outer`'s). Lower-level work never runs inside a higher round."""
    if not isinstance(ready, Round) or (ready.lower and not outer.lower):
        return False
    if (outer.lower and not ready.lower) or ready.work is None:
        return True
    return ready.passes is not None and outer.passes is not None and \
        ready.passes <= CUT_IN_PASSES and ready.passes < outer.passes


def _exit_now(code: int) -> None:
    """End the process without unwinding: a hung device call would never let a normal exit finish."""
    for handler in logging.getLogger().handlers + log.handlers:
        with contextlib.suppress(Exception):
            handler.flush()
    sys.stderr.flush()
    os._exit(code)
