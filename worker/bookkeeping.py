"""rq's per-job bookkeeping, queued for a whole batch on one pipeline.

What rq 3.0's SimpleWorker does per job in ~20 round trips is written here as the same keys and fields, so
that `rq info`, the registries, `Job.get_status()`, `Job.latest_result()` and `Worker.get_current_job()`
read the same truth; registry and worker-set updates are merged into one multi-member command per batch.
Knowingly left out: dependents (embedding jobs have none), callbacks, webhooks, rate limits, Repeat.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field
from datetime import datetime
from uuid import uuid4

from redis.client import Pipeline
from rq.defaults import DEFAULT_FAILURE_TTL
from rq.executions import Execution, ExecutionRegistry
from rq.job import Job, JobStatus
from rq.queue import Queue
from rq.results import Result as RqResult
from rq.utils import utcformat

from common.errors import EmbedfleetError
from common.request import EmbedRequest
from common.result import Result

@dataclass
class Item:
    """One dequeued job id on its way through a batch."""

    job_id: str
    job: Job | None  # None: the hash is gone (expired or deleted) and the id is only dropped
    cancelled: bool = False  # rq status CANCELED when dequeued: answered "cancelled", never run
    unreadable: str | None = None  # why the rq job hash or its data could not be read
    request: EmbedRequest | None = None
    execution: Execution | None = None
    result: Result | None = None
    failure: EmbedfleetError | None = None  # set: the rq job fails (decode or internal error)
    exc_string: str = ""  # the failed rq job's reason (exc_info, latest_result().exc_string)
    retryable: bool = False


@dataclass
class Batch:
    """Registry updates collected over a batch, flushed as one command per registry."""

    queue: Queue
    worker_key: str
    executions_key: str
    began: datetime
    now: datetime
    started: dict[str, float] = field(default_factory=dict)
    finished: dict[str, float] = field(default_factory=dict)
    failed: dict[str, float | str] = field(default_factory=dict)
    canceled: dict[str, float] = field(default_factory=dict)
    ended: list[Execution] = field(default_factory=list)
    ok_count: int = 0
    failed_count: int = 0

    def flush(self, pipe: Pipeline) -> None:
        """Queue the collected updates on `pipe` and start collecting afresh."""
        q = self.queue
        for key, members in ((q.started_job_registry.key, self.started),
                             (q.finished_job_registry.key, self.finished),
                             (q.failed_job_registry.key, self.failed),
                             (q.canceled_job_registry.key, self.canceled)):
            if members:
                pipe.zadd(key, members)
        if self.ended:
            composite = [e.composite_key for e in self.ended]
            pipe.delete(*(e.key for e in self.ended))
            pipe.zrem(q.started_job_registry.key, *composite)
            pipe.srem(self.executions_key, *composite)
        if self.ok_count:
            pipe.hincrby(self.worker_key, "successful_job_count", self.ok_count)
        if self.failed_count:
            pipe.hincrby(self.worker_key, "failed_job_count", self.failed_count)
        self.started, self.finished, self.failed, self.canceled, self.ended = {}, {}, {}, {}, []
        self.ok_count = self.failed_count = 0


def start(pipe: Pipeline, batch: Batch, item: Item, worker_name: str, ttl: int) -> None:
    """Job STARTED with a fresh Execution, as rq's prepare_execution + prepare_job_execution write it."""
    job = item.job
    execution = Execution(uuid4().hex, job.id, connection=job.connection, worker_name=worker_name)
    execution._job = job
    execution.save(ttl=ttl, pipeline=pipe)
    ExecutionRegistry(job.id, connection=pipe).add(execution, ttl=ttl, pipeline=pipe)
    job.prepare_for_execution(worker_name, pipeline=pipe)
    pipe.persist(job.key)  # a job older than its ttl must not vanish while it runs
    batch.started[execution.composite_key] = batch.now.timestamp() + ttl
    item.execution = execution


def add_executions_index(pipe: Pipeline, batch: Batch, ttl: int) -> None:
    """The worker's execution index, which `Worker.get_current_job()` reads from other processes."""
    if batch.started:
        pipe.sadd(batch.executions_key, *batch.started)
        pipe.expire(batch.executions_key, ttl + 60)


def _end_execution(pipe: Pipeline, batch: Batch, item: Item) -> dict:
    if item.execution is None:
        return {}
    batch.ended.append(item.execution)
    pipe.zrem(ExecutionRegistry(item.job_id, pipe).key, item.execution.id)
    return {"execution_id": item.execution.id, "execution_started_at": item.execution.created_at,
            "execution_ended_at": batch.now}


def finish(pipe: Pipeline, batch: Batch, item: Item, worker_name: str, result_ttl: int) -> None:
    """Job FINISHED: the request was served (its answer may be an error result, e.g. a validation error).
    `result_ttl` is at least 1: the worker refuses rq's 0 (delete at once) and -1 (keep forever)."""
    job = item.job
    job._status = JobStatus.FINISHED
    job.ended_at = batch.now
    pipe.hset(job.key, mapping={"status": JobStatus.FINISHED, "ended_at": utcformat(batch.now)})
    summary = {"status": item.result.status}
    if not item.result.ok:
        summary["code"] = item.result.error_code
    # rq's own result stream gets a small summary; the embeddings live only in the result blob.
    RqResult.create(job, RqResult.Type.SUCCESSFUL, ttl=result_ttl, return_value=summary,
                    worker_name=worker_name, pipeline=pipe, **_end_execution(pipe, batch, item))
    pipe.expire(job.key, result_ttl)
    batch.finished[job.id] = batch.now.timestamp() + result_ttl
    batch.ok_count += 1


def fail(pipe: Pipeline, batch: Batch, item: Item, worker_name: str) -> bool:
    """Job FAILED with `item.exc_string`, or requeued by rq's Retry when it has retries left and the failure
    is not the message's own fault. Returns True if it was requeued."""
    job = item.job
    ends = _end_execution(pipe, batch, item)
    batch.failed_count += 1
    if item.retryable and job.should_retry:
        job.retry(batch.queue, pipe)
        return True
    job._status = JobStatus.FAILED
    job.ended_at = batch.now
    pipe.hset(job.key, mapping={"status": JobStatus.FAILED, "ended_at": utcformat(batch.now),
                                "exc_info": zlib.compress(item.exc_string.encode())})
    ttl = job.failure_ttl if job.failure_ttl is not None else DEFAULT_FAILURE_TTL
    batch.failed[job.id] = "+inf" if ttl < 0 else batch.now.timestamp() + ttl
    if ttl > 0:
        pipe.expire(job.key, ttl)
    RqResult.create_failure(job, job.failure_ttl, exc_string=item.exc_string, worker_name=worker_name,
                            pipeline=pipe, **ends)
    return False


def cancel(pipe: Pipeline, batch: Batch, item: Item) -> None:
    """Job CANCELED: a cancel arrived while it waited; it never ran."""
    pipe.hset(Job.key_for(item.job_id), "status", JobStatus.CANCELED)
    batch.canceled[item.job_id] = batch.now.timestamp()


def refresh(pipe: Pipeline, queue: Queue, items: list[tuple[Item, int]], now: datetime) -> None:
    """Push the started-registry scores of a long batch forward, each (item, ttl) by its own ttl, as rq's
    maintain_heartbeats does per job."""
    for item, ttl in items:
        item.execution.heartbeat(queue.started_job_registry, ttl, pipeline=pipe)
        item.job.heartbeat(now, ttl, pipeline=pipe)
