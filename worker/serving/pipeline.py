"""BatchWorker: an rq SimpleWorker that serves one model's queues many requests at a time, as a pipeline.

Three stages joined by bounded hand-offs, so the device never waits for Redis or the tokenizer:

    take thread     take (Lua: queue -> started) -> decode -> verify + tokenise  -> [one round waits]   take.py
    main thread     forward passes over the round (length-sorted, token-budgeted) -> [one round waits]  forward.py
    finish thread   cut/normalise/cast -> answer + acknowledge (Lua: one EVALSHA per round)             finish.py
    heartbeat       leases renewed, dead workers' claims recovered, the watchdog, the advert            upkeep.py

Each piece of state the threads share has one owner, in a module of its own, with its guard:

    handoff.py      the two hand-offs and the slot: at most one prepared round waits for the device, so a
                    worker holds at most four rounds of `max_jobs` requests however deep the queue is
    gathering.py    the device's state (forward -> take) and when the next round is taken: with fewer than a
                    round's worth queued, as late as still lets it be ready when the device is free
    yielding.py     what runs between two forward passes: interactive work inside a bulk round, short work
                    queued behind a long round
    ledger.py       the jobs held, by claim: what the heartbeat renews
    lifecycle.py    stop and drain (SIGTERM / SIGINT), and the stage threads whose death stops the worker

This class is the rq adapter that wires them: rq's registration, maintenance, suspension and its answers for
the jobs its maintenance recovers. Each stage thread laps its own clock (worker/engine/stageclock.py) at every
stage and wait, exported as `embedfleet_worker_stage_seconds_total{thread, stage}`: the profile bench/cpuside.py
prints. A model has one queue per priority level, read in the order worker/serving/levels.py decides.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from uuid import uuid4

import redis
from redis import Redis
from rq.job import JobStatus
from rq.worker import SimpleWorker, WorkerStatus

from embedfleet.common.errors import InternalError
from embedfleet.common.names import PRIORITIES, slot_tag
from embedfleet.common.policy import HEARTBEAT_INTERVAL, MAINTENANCE_INTERVAL
from embedfleet.common.protocol import answering
from embedfleet.common.protocol.jobdata import job_reply_to
from embedfleet.common.protocol.keys import queue_name
from embedfleet.common.redisclient import MAX_BLOCK, is_cluster_client
from embedfleet.common.result import Result
from embedfleet.common.serializer import MsgpackSerializer
from embedfleet.worker.engine import stageclock
from embedfleet.worker.engine.seam import ServingEngine
from embedfleet.worker.serving.finish import FinishStage
from embedfleet.worker.serving.forward import ForwardStage
from embedfleet.worker.serving.gathering import Device
from embedfleet.worker.serving.handoff import Handoff
from embedfleet.worker.serving.heartbeat import Heartbeat, Watchdog
from embedfleet.worker.serving.inflight import InFlight
from embedfleet.worker.serving.ledger import Ledger
from embedfleet.worker.serving.levels import Levels
from embedfleet.worker.serving.lifecycle import Lifecycle
from embedfleet.worker.serving.livestats import LiveStats
from embedfleet.worker.serving.rounds import Round
from embedfleet.worker.serving.rqjob import SafeJob
from embedfleet.worker.serving.rqpubsub import PromptUnsubscribe
from embedfleet.worker.serving.spread import ChunkJobs
from embedfleet.worker.serving.steps import Steps
from embedfleet.worker.serving.storing import Store
from embedfleet.worker.serving.take import RqHooks, TakeStage
from embedfleet.worker.serving.upkeep import Upkeep

log = logging.getLogger("embedfleet.worker")


def unique_worker_name() -> str:
    """rq refuses a name that is still registered, and a crashed worker's stays so for minutes."""
    return f"embedfleet-{socket.gethostname()}-{os.getpid()}-{uuid4().hex[:8]}"


class BatchWorker(PromptUnsubscribe, SimpleWorker):
    """Serves `engine.caps.name`'s queue in pipelined rounds; the model stays loaded in this process. Built by
    worker/serving/builder.py's `build_worker` from the worker's settings, which hold every policy default.

    Args:
        engine: a worker.engine.engine.Engine, or anything that is a ServingEngine (worker/engine/seam.py): `caps`,
            `prepare(requests) -> Work`, `forward(Work)`, `finish(Work) -> results` (same order, never raising for
            a bad request), its forward-pass `shape()` and `shaper`, `combine_parts` (a spread request's result).
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
        chunks_per_job: a request with more chunks than this (a long input, worker/engine/chunking.py) is spread
            over the fleet as parts of at most this many (worker/serving/spread.py); 0: every request runs here.
        rq_records: what the protocol scripts write of rq's own bookkeeping, "lean" or "full" (docs/capacity.md).
        metrics: a worker.serving.metrics.WorkerMetrics to record into, or None.
        traces: (worker name, model) -> the worker.serving.traces.RoundTraces that makes each request's spans
            (tracing on), or None.
        Other keyword arguments go to rq's SimpleWorker.
    """

    def __init__(self, engine: ServingEngine, connection: Redis, *, cache, max_jobs: int, result_ttl: int,
                 poll_timeout: int, lease: float, max_deliveries: int, drain_timeout: float,
                 watchdog: tuple[float, float] | None, bulk_share: int, chunks_per_job: int, rq_records: str,
                 heartbeat_interval: float = HEARTBEAT_INTERVAL, name: str | None = None, queue: str | None = None,
                 info: dict | None = None, metrics=None, traces=None, **kwargs):
        if max_jobs < 1:
            raise ValueError(f"max_jobs must be at least 1, got {max_jobs}")
        if result_ttl < 1:
            raise ValueError(f"result_ttl must be at least 1 second, got {result_ttl}: results are stored "
                             "with an expiry, and 0 or -1 would lose every one of them")
        if lease <= 0 or max_deliveries < 1:
            raise ValueError(f"lease must be positive and max_deliveries at least 1, got {lease}, {max_deliveries}")
        kwargs.setdefault("maintenance_interval", MAINTENANCE_INTERVAL)  # rq's 600 s leaves dead jobs too long
        # One rq queue per priority level (worker/serving/levels.py), highest first; `queue` names a lone queue.
        # On a Redis Cluster the queues and the worker's name carry the model's hash tag (common/protocol/keys.py).
        tag = slot_tag(engine.caps.name, getattr(connection, "partition", "")) if is_cluster_client(connection) else ""
        queues = [queue] if queue else [queue_name(engine.caps.name, level, tag) for level in PRIORITIES]
        # SafeJob: rq's maintenance (registry cleanups, handle_job_failure) reads jobs through it, so nothing a
        # job's hash names is imported or called (worker/serving/rqjob.py).
        super().__init__(queues, name=tag + (name or unique_worker_name()),
                         connection=connection, serializer=MsgpackSerializer, job_class=SafeJob,
                         default_result_ttl=result_ttl, **kwargs)
        self.engine = engine
        self.steps = Steps(engine, cache, chunks_per_job)
        self.result_ttl = result_ttl
        self.queue = self.queues[0]
        self.levels = Levels(connection, [q.name for q in self.queues], self.name, result_ttl=result_ttl,
                             lease=lease, share=bulk_share, records=rq_records)
        self._rq_beat_at = float("-inf")  # rq's worker heartbeat before a blocking take: once an interval
        self._rq_beat_every = heartbeat_interval
        self.metrics = metrics  # worker/serving/metrics.py's WorkerMetrics, or None
        self.stages = stageclock.Stages()  # seconds per thread and stage (worker/engine/stageclock.py)
        if metrics is not None:
            metrics.watch_stages(self.stages)
        self.store = Store(self.levels, connection, engine.caps.name, self.name)  # within Redis's value limit
        self.chunk_jobs = ChunkJobs(connection, [q.name for q in self.queues], engine.caps.name, result_ttl=result_ttl,
                                    chunks_per_job=chunks_per_job, combine=engine.combine_parts,
                                    limit=self.store.limit)
        self.inflight = InFlight(connection, cache.identity) if cache is not None else None
        self.lifecycle = Lifecycle(self.name, drain_timeout)
        self.ledger = Ledger(self.inflight.release if self.inflight is not None else None)
        live, device = LiveStats(), Device()
        watchdog = Watchdog(*watchdog) if watchdog else None
        self.upkeep = Upkeep(self.name, self.levels, engine, ledger=self.ledger, lifecycle=self.lifecycle, live=live,
                             interval=heartbeat_interval, rq_beat=self.heartbeat, info=info,
                             stats=self.steps.stats, watchdog=watchdog, inflight=self.inflight)
        self.advertiser = self.upkeep.advertiser
        self.heartbeat_thread = Heartbeat(self.upkeep.beat, min(heartbeat_interval, lease / 3),
                                          f"heartbeat-{self.name}")
        rq = RqHooks(self._maintain, self.check_for_suspension, self._idle,
                     (self.exponential_backoff_factor, self.max_connection_wait_time))
        # A blocking read must end well inside the client's socket timeout (common.redisclient).
        poll_timeout = max(1, min(poll_timeout, self.dequeue_timeout, int(MAX_BLOCK)))
        self.taking = TakeStage(self.name, self.levels, self.steps, max_jobs=max_jobs, max_deliveries=max_deliveries,
                                poll_timeout=poll_timeout, ledger=self.ledger, device=device,
                                lifecycle=self.lifecycle, rq=rq, inflight=self.inflight, metrics=metrics)
        self.forwarding = ForwardStage(self.name, self.steps, self.levels, ledger=self.ledger, device=device,
                                       lifecycle=self.lifecycle, live=live, heartbeat=self.heartbeat_thread,
                                       watchdog=watchdog, metrics=metrics)
        self.finishing = FinishStage(self.name, self.steps, self.store, self.chunk_jobs, ledger=self.ledger, live=live,
                                     metrics=metrics,
                                     traces=traces(self.name, engine.caps.name) if traces is not None else None)
        self.handoff: Handoff | None = None  # the current work()'s hand-offs
        self.push_exc_handler(self._answer_abandoned)

    # -- the loop ---------------------------------------------------------------------------------------

    def work(self, burst: bool = False, logging_level: str | None = None, max_idle_time: int | None = None,
             with_scheduler: bool = False, **log_kwargs) -> bool:
        """Serve until stopped (or, with `burst`, until the queue is empty). True if any job was served."""
        self.bootstrap(logging_level, **log_kwargs)
        self.taking.burst, self.finishing.served = burst, 0
        self.handoff = handoff = Handoff()
        stages = [self.lifecycle.stage("take", self.taking.loop, handoff, max_idle_time, clocks=self.stages),
                  self.lifecycle.stage("finish", self.finishing.loop, handoff, clocks=self.stages)]
        try:
            self.advertiser.advertise()  # producers may submit as soon as this returns
            self.upkeep.advertised_at = time.time()
            self.heartbeat_thread.start()
            if with_scheduler:
                self._start_scheduler(burst, logging_level, **log_kwargs)
            if threading.current_thread() is threading.main_thread():
                self.lifecycle.install_signal_handlers(self.drain)
            for stage in stages:
                stage.start()
            stageclock.bind(self.stages, "forward")
            self.forwarding.loop(handoff, stages)
            for stage in stages:
                stage.join(timeout=60)  # a drain ends with the rounds held; a dead stage's partner soon
                if stage.is_alive():
                    log.error("worker %s: the %s stage did not end; leaving it", self.name, stage.name)
        finally:
            self.lifecycle.stop()  # a stage that outlived a crash of this loop must end too
            self.heartbeat_thread.stop()
            try:
                self.advertiser.withdraw()
            except redis.RedisError as exc:
                log.warning("worker %s: could not withdraw its advert (%s); it expires by itself", self.name, exc)
            try:
                self.teardown()
            except (redis.ConnectionError, redis.TimeoutError) as exc:  # rq's registration expires by itself
                log.warning("worker %s: could not unregister from Redis (%s)", self.name, exc)
        return self.finishing.served > 0

    def stop(self) -> None:
        """Warm stop from another thread: every job already taken is finished, then work() returns."""
        self.lifecycle.stop()

    def drain(self) -> None:
        """Graceful stop: finish the round on the device, give the rounds not yet on it back to the head of
        the queue, then `work()` returns. Past `drain_timeout` the process ends at once."""
        if self.lifecycle.begin_drain():
            self.forwarding.drain(self.handoff)

    @property
    def _stop_requested(self) -> bool:
        """rq's stop flag (its suspension wait reads it): the lifecycle's."""
        return self.lifecycle.stopped

    @_stop_requested.setter
    def _stop_requested(self, value: bool) -> None:
        if value:  # (rq's __init__ sets False before the lifecycle exists)
            self.lifecycle.stop()

    def _shutdown(self):
        """rq's `shutdown` command: only the flag (raising inside a Redis read could strand taken ids)."""
        self.lifecycle.stop()

    # -- the stages, for callers that run one step alone --------------------------------------------------

    def take_round(self, block: float | None, top: int = 0) -> Round | None:
        """Take and prepare one round (worker/serving/take.py); None: nothing taken."""
        return self.taking.take_round(block, top)

    def finish_round(self, round_: Round) -> None:
        """Answer, store and acknowledge one round (worker/serving/finish.py)."""
        self.finishing.finish_round(round_)

    def held_count(self) -> int:
        """Jobs taken and not yet acknowledged."""
        return len(self.ledger)

    def recover(self) -> int:
        """Requeue every lapsed claim of this model's queues (a dead worker's jobs); returns how many."""
        return self.upkeep.recover()

    # -- rq ---------------------------------------------------------------------------------------------

    def _maintain(self) -> None:
        if self.should_run_maintenance_tasks:
            self.run_maintenance_tasks()

    def _idle(self, pipe) -> None:
        """In a take's own round trip: idle unless jobs are held (lean: the take writes rq's worker state as it
        changes, worker/serving/levels.py), and rq's heartbeat once a heartbeat interval."""
        if self.levels.records == "full" and not self.held_count():
            self.set_state(WorkerStatus.IDLE, pipeline=pipe)
        if time.monotonic() - self._rq_beat_at >= self._rq_beat_every:
            self._rq_beat_at = time.monotonic()
            self.heartbeat(pipeline=pipe)

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
        answering.publish(self.connection, Result.failure(job.id, self.engine.caps.name, InternalError(message)),
                           self.result_ttl, job_reply_to(job), only_if_absent=True)
