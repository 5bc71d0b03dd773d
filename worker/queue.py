"""BatchWorker: an rq SimpleWorker that serves one model's queue many requests at a time.

One round reads as: dequeue batch -> decode -> start -> run -> store + acknowledge, in four Redis round
trips per batch (take, fetch, start, finish) whatever its size. Status decisions:
- engine answered (embeddings, or an error result that is the request's own fault, such as a validation
  error): rq job FINISHED, because the request was served and the error is its answer;
- engine answered internal_error for a request (its forward pass failed even alone, or pre/postprocessing
  crashed), raised, or returned a wrong result list: rq job FAILED (internal_error), or requeued by rq's
  Retry when the job has retries left, since the fault may be the machine's (e.g. CUDA out of memory);
- message undecodable (bad msgpack, wrong fields, wrong job args, unreadable job data): rq job FAILED with a
  decode_error reason and a decode_error result blob; never retried, the bytes will not change;
- an rq CANCELED status (a cancel that raced the dequeue): rq job CANCELED, a `cancelled` result
  blob unless one exists.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import traceback
from uuid import uuid4

import redis
from redis import Redis
from rq.exceptions import DeserializationError, StopRequested
from rq.job import JobStatus
from rq.utils import now
from rq.worker import SimpleWorker, WorkerStatus

from common.errors import CancelledError, DecodeError, EmbedfleetError, InternalError
from common.keys import HEARTBEAT_INTERVAL, JOB_FUNC, MAINTENANCE_INTERVAL, RESULT_TTL, queue_name
from common.redisclient import MAX_BLOCK
from common.request import EmbedRequest, job_reply_to
from common.result import Result, publish
from common.serializer import MsgpackSerializer
from worker import bookkeeping
from worker.advertise import Advertiser
from worker.bookkeeping import Batch, Item
from worker.dequeue import fetch_jobs, take_batch
from worker.heartbeat import Heartbeat, started_ttl, timed_out

log = logging.getLogger("embedfleet.worker")


def unique_worker_name() -> str:
    """rq refuses a name that is still registered, and a crashed worker's stays so for minutes."""
    return f"embedfleet-{socket.gethostname()}-{os.getpid()}-{uuid4().hex[:8]}"


class BatchWorker(SimpleWorker):
    """Serves `engine.caps.name`'s queue in batches; the model stays loaded in this process (no fork).

    Args:
        engine: has `caps` (ModelCapabilities) and `run(requests) -> results` (same order, never raising for
            a bad request).
        connection: Redis client.
        max_jobs: most requests taken from the queue per round (one engine.run call per round).
        result_ttl: seconds result blobs, notify lists and finished rq jobs are kept; at least 1 (Redis
            refuses SET EX 0, which inside the store transaction would lose every result).
        poll_timeout: seconds one blocking dequeue waits; a stop request is honoured within this time.
        heartbeat_interval: seconds between capability adverts and started-job refreshes during a batch; a
            dead worker's jobs are recovered about 3 intervals + 60 s after its last beat.
        name: rq worker name; default unique per start.
        Other keyword arguments go to rq's SimpleWorker.
    """

    def __init__(self, engine, connection: Redis, *, max_jobs: int = 64, result_ttl: int = RESULT_TTL,
                 poll_timeout: int = 5, heartbeat_interval: float = HEARTBEAT_INTERVAL,
                 name: str | None = None, queue: str | None = None, **kwargs):
        if max_jobs < 1:
            raise ValueError(f"max_jobs must be at least 1, got {max_jobs}")
        if result_ttl < 1:
            raise ValueError(f"result_ttl must be at least 1 second, got {result_ttl}: results are stored "
                             "with an expiry, and 0 or -1 would lose every one of them")
        kwargs.setdefault("maintenance_interval", MAINTENANCE_INTERVAL)  # rq's 600 s leaves dead jobs too long
        super().__init__([queue or queue_name(engine.caps.name)], name=name or unique_worker_name(),
                         connection=connection, serializer=MsgpackSerializer,
                         default_result_ttl=result_ttl, **kwargs)
        self.engine = engine
        self.max_jobs = max_jobs
        self.result_ttl = result_ttl
        # A blocking read must end well inside the client's socket timeout (common.redisclient).
        self.poll_timeout = max(1, min(poll_timeout, self.dequeue_timeout, int(MAX_BLOCK)))
        self.queue = self.queues[0]
        self.advertiser = Advertiser(connection, engine.caps, self.name)
        self.heartbeat_interval = heartbeat_interval
        self.heartbeat_thread = Heartbeat(self._beat, heartbeat_interval, f"heartbeat-{self.name}")
        self._inflight: list[Item] = []
        self._inflight_since = now()
        self._inflight_lock = threading.Lock()
        self.batches = 0
        self.push_exc_handler(self._answer_abandoned)

    # -- the loop ---------------------------------------------------------------------------------------

    def work(self, burst: bool = False, logging_level: str | None = None, max_idle_time: int | None = None,
             with_scheduler: bool = False, **log_kwargs) -> bool:
        """Serve until stopped (or, with `burst`, until the queue is empty). True if any job was served."""
        self.bootstrap(logging_level, **log_kwargs)
        served, backoff, idle_since = 0, 1.0, time.monotonic()
        try:
            self.advertiser.advertise()  # producers may submit as soon as this returns
            self.heartbeat_thread.start()
            if with_scheduler:
                self._start_scheduler(burst, logging_level, **log_kwargs)
            if threading.current_thread() is threading.main_thread():
                self._install_signal_handlers()
            while True:
                try:
                    self.check_for_suspension(burst)
                    if self.should_run_maintenance_tasks:
                        self.run_maintenance_tasks()
                    if self._stop_requested:
                        log.info("worker %s: stopping on request", self.name)
                        break
                    self.heartbeat_thread.ensure_alive()
                    job_ids = self.dequeue_batch(None if burst else self.poll_timeout)
                    backoff = 1.0
                    if job_ids:
                        served += self.process_batch(job_ids)
                        idle_since = time.monotonic()
                    elif burst:
                        log.info("worker %s: queue empty, burst done", self.name)
                        break
                    elif max_idle_time is not None and time.monotonic() - idle_since > max_idle_time:
                        log.info("worker %s: idle for %d s, quitting", self.name, max_idle_time)
                        break
                except StopRequested:
                    break
                except (redis.ConnectionError, redis.TimeoutError) as exc:
                    log.error("worker %s: Redis unreachable (%s); retrying in %.0f s", self.name, exc, backoff)
                    time.sleep(backoff)
                    backoff = min(backoff * self.exponential_backoff_factor, self.max_connection_wait_time)
                except Exception:
                    log.exception("worker %s: unexpected error in the work loop", self.name)
                    if burst:
                        break
                    time.sleep(backoff)
                    backoff = min(backoff * self.exponential_backoff_factor, self.max_connection_wait_time)
        finally:
            self._shut_down_heartbeat()
            try:
                self.teardown()
            except (redis.ConnectionError, redis.TimeoutError) as exc:  # rq's registration expires by itself
                log.warning("worker %s: could not unregister from Redis (%s)", self.name, exc)
        return served > 0

    def stop(self) -> None:
        """Warm stop from another thread: the current batch completes, then work() returns."""
        self._stop_requested = True

    def _shutdown(self):
        """Signals only set the flag: raising inside a Redis read could strand dequeued ids (rq's way)."""
        self._stop_requested = True

    def process_batch(self, job_ids: list[str]) -> int:
        """One round after the dequeue; returns how many jobs were served (finished)."""
        items = fetch_jobs(self.connection, job_ids, self.serializer, self.job_class)
        runnable = self.decode(items)
        batch = self.start(items, runnable)
        try:
            if runnable:
                self.run(runnable)
                self._with_retries(lambda: self.store_and_acknowledge(runnable, batch))
        finally:
            with self._inflight_lock:
                self._inflight = []
                self.executions.clear()
        self.batches += 1
        served = sum(item.result is not None and item.failure is None for item in items)
        log.info("worker %s: batch of %d: %d served, %d failed, %d canceled in %.3f s", self.name,
                 len(job_ids), served, sum(item.failure is not None for item in items),
                 sum(item.cancelled and item.job is not None for item in items),
                 (now() - batch.began).total_seconds())
        return served

    # -- the named steps --------------------------------------------------------------------------------

    def dequeue_batch(self, timeout: int | None) -> list[str]:
        """Up to max_jobs ids, moved into the intermediate list, with rq's idle state and heartbeat."""
        def idle(pipe):
            self.set_state(WorkerStatus.IDLE, pipeline=pipe)
            self.heartbeat(pipeline=pipe)

        self.procline(f"Listening on {self.queue.name}")
        return take_batch(self.connection, self.queue.key, self.queue.intermediate_queue_key, self.max_jobs,
                          timeout, before=idle)

    def decode(self, items: list[Item]) -> list[Item]:
        """Sets each item's request, or the reason it fails; returns the items the engine should run."""
        runnable = []
        for item in items:
            if item.job is None:
                continue
            if item.job.get_status(refresh=False) == JobStatus.CANCELED:
                item.cancelled = True
                continue
            try:
                item.request = self._decode_job(item)
                runnable.append(item)
            except DecodeError as exc:
                item.failure = exc
                item.exc_string = f"{JOB_FUNC}: job {item.job_id}: {exc.message}"
        return runnable

    def _decode_job(self, item: Item) -> EmbedRequest:
        if item.unreadable:
            raise DecodeError(item.unreadable)
        job = item.job
        try:
            func, args, kwargs = job.func_name, job.args, job.kwargs
        except DeserializationError as exc:
            raise DecodeError(f"job data is not msgpack rq job data: {exc.__cause__!r}") from exc
        if func != JOB_FUNC:
            raise DecodeError(f"job function is {func!r}; this queue only serves {JOB_FUNC!r}")
        if kwargs or not isinstance(args, list | tuple) or len(args) != 1 or not isinstance(args[0], bytes):
            raise DecodeError(f"job args must be [<encoded EmbedRequest bytes>] and no kwargs; got "
                              f"{type(args).__name__} of {len(args) if hasattr(args, '__len__') else '?'} "
                              f"item(s) and kwargs {sorted(kwargs) if isinstance(kwargs, dict) else kwargs!r}")
        request = EmbedRequest.decode(args[0])
        if request.id != job.id:
            raise DecodeError(f"request id {request.id!r} does not match its job id {job.id!r}")
        return request

    def start(self, items: list[Item], runnable: list[Item]) -> Batch:
        """One transaction: runnable jobs STARTED, undecodable ones FAILED, cancelled ones CANCELED, and
        every id out of the intermediate list (atomically with its started-registry entry, as rq needs)."""
        began = now()
        batch = Batch(self.queue, self.key, self.executions_key, began, began)
        ttl = max((self.get_heartbeat_ttl(item.job) for item in runnable), default=0)
        with self.connection.pipeline() as pipe:
            for item in runnable:
                bookkeeping.start(pipe, batch, item, self.name, self.get_heartbeat_ttl(item.job))
            bookkeeping.add_executions_index(pipe, batch, ttl)
            for item in items:
                if item.job is not None and item.cancelled:
                    bookkeeping.cancel(pipe, batch, item)
                    publish(pipe, Result.failure(item.job_id, self.engine.caps.name, CancelledError(
                        "the request was cancelled before a worker took it")), self.result_ttl,
                        job_reply_to(item.job), only_if_absent=True)
                elif item.failure is not None:
                    self._fail(pipe, batch, item)
                pipe.lrem(self.queue.intermediate_queue_key, 1, item.job_id)
            if runnable:
                self.set_state(WorkerStatus.BUSY, pipeline=pipe)
            batch.flush(pipe)
            pipe.execute()
        with self._inflight_lock:
            self._inflight, self._inflight_since = runnable, began
            self.executions.update({item.execution.id: item.execution for item in runnable})
        self.procline(f"Embedding {len(runnable)} requests from {self.queue.name}")
        return batch

    def run(self, items: list[Item]) -> None:
        """One engine call for the whole batch; an engine failure fails every job of it, retryably."""
        if not items:
            return
        try:
            results = self.engine.run([item.request for item in items])
            if len(results) != len(items):
                raise InternalError(f"engine returned {len(results)} results for {len(items)} requests")
        except Exception as exc:
            log.exception("worker %s: engine failed on a batch of %d", self.name, len(items))
            for item in items:
                self._mark_internal(item, exc, traceback.format_exc())
            return
        for item, result in zip(items, results):
            if result is None or result.id != item.job_id:
                self._mark_internal(item, InternalError(f"engine returned no result for request {item.job_id}"))
            elif result.error_code == InternalError.code:  # not the request's fault: rq's Retry may help
                self._mark_internal(item, result.error)
            else:
                item.result = result

    def store_and_acknowledge(self, items: list[Item], batch: Batch) -> None:
        """One transaction: every answer stored and every rq job finished or failed, so a producer never
        sees a result whose job still looks started, nor the reverse."""
        batch.now = now()
        with self.connection.pipeline() as pipe:
            for item in items:
                if item.failure is not None:
                    self._fail(pipe, batch, item)
                    continue
                # store: the producer's answer
                publish(pipe, item.result, self.result_ttl, item.request.reply_to)
                # acknowledge: rq's view
                bookkeeping.finish(pipe, batch, item, self.name, self._job_result_ttl(item.job))
            batch.flush(pipe)
            # one batch is one stretch of work, however many jobs it served
            pipe.hincrbyfloat(self.key, "total_working_time", (batch.now - batch.began).total_seconds())
            with self._inflight_lock:  # a beat after this EXEC would recreate the executions it deletes
                self._inflight = []
            pipe.execute()

    def _job_result_ttl(self, job) -> int:
        """The job's own result_ttl when positive, else the worker's: rq's 0 (delete at once) and -1 (keep
        forever) are not honoured, the rq job's summary should live about as long as the result blob."""
        ttl = job.result_ttl
        return ttl if ttl is not None and ttl > 0 else self.result_ttl

    # -- failures ---------------------------------------------------------------------------------------

    def _mark_internal(self, item: Item, exc: Exception, exc_string: str | None = None) -> None:
        item.failure = exc if isinstance(exc, EmbedfleetError) else InternalError(f"engine failed: {exc!r}")
        item.exc_string = exc_string or f"{type(exc).__name__}: {exc}"
        item.retryable = True

    def _fail(self, pipe, batch: Batch, item: Item) -> None:
        """rq job FAILED (or requeued by its Retry); the producer gets an error blob unless it was requeued."""
        if not bookkeeping.fail(pipe, batch, item, self.name):
            error = item.failure
            answer = Result.failure(item.job_id, self.engine.caps.name, error)
            reply_to = item.request.reply_to if item.request else job_reply_to(item.job)
            publish(pipe, answer, self.result_ttl, reply_to)

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
        with self.connection.pipeline() as pipe:
            publish(pipe, Result.failure(job.id, self.engine.caps.name, InternalError(message)), self.result_ttl,
                    job_reply_to(job), only_if_absent=True)
            pipe.execute()

    def get_heartbeat_ttl(self, job, working_time: float = 0.0) -> int:
        """A dead worker's jobs are recovered ~3 beats + 60 s after its last beat, a hung batch's (stuck in
        native code, which rq's death penalty cannot interrupt) job.timeout + 60 s after it began."""
        return started_ttl(job.timeout, working_time, self.heartbeat_interval)

    # -- background heartbeat ---------------------------------------------------------------------------

    def _beat(self) -> None:
        """Advertise the model; during a batch also keep rq's worker key and started entries alive, each
        job only until its timeout, after which rq's maintenance retries or fails it as abandoned."""
        self.advertiser.advertise()
        with self._inflight_lock:
            if not self._inflight:
                return
            stamp = now()
            working = (stamp - self._inflight_since).total_seconds()
            alive = [(item, self.get_heartbeat_ttl(item.job, working)) for item in self._inflight
                     if not timed_out(item.job.timeout, working)]
            with self.connection.pipeline(transaction=False) as pipe:
                self.heartbeat(pipeline=pipe)
                bookkeeping.refresh(pipe, self.queue, alive, stamp)
                pipe.execute()

    def _shut_down_heartbeat(self) -> None:
        self.heartbeat_thread.stop()
        try:
            self.advertiser.withdraw()
        except redis.RedisError as exc:
            log.warning("worker %s: could not withdraw its advert (%s); it expires by itself", self.name, exc)

    def _with_retries(self, write, attempts: int = 5) -> None:
        """The engine's work is in memory: ride out a short Redis outage rather than lose the batch."""
        delay = 1.0
        for attempt in range(attempts):
            try:
                return write()
            except (redis.ConnectionError, redis.TimeoutError) as exc:
                if attempt == attempts - 1:
                    raise
                log.error("worker %s: storing a batch failed (%s); retrying in %.0f s", self.name, exc, delay)
                time.sleep(delay)
                delay *= 2
