"""Faults, bounded in count and time: a worker killed mid-batch, Redis restarted under a live worker."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest
import redis
from rq import Queue
from rq.job import JobStatus

from embedfleet.common.errors import UnavailableError
from embedfleet.common.policy import JOB_RETRIES
from embedfleet.common.protocol import keys
from embedfleet.common.serializer import MsgpackSerializer
from embedfleet import Producer
from tests.harness import burst, idle_worker, serve
from tests.crashworker import MODEL, workers
from tests.tinymodels import sample_texts


def wait_until(check, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while not (value := check()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)
    return value


@pytest.mark.parametrize("records", ["lean", "full"])
def test_jobs_of_a_worker_killed_mid_batch_are_retried_by_the_next_worker(
        redis_url, redis_client, minilm_path, minilm_engine, records):
    worker = subprocess.Popen(
        [sys.executable, "-m", "embedfleet.worker", "--redis-url", redis_url, "--model", minilm_path,
         "--served-model-name", "minilm", "--poll-timeout", "1", "--probe-seconds", "1", "--rq-records", records],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        producer = Producer(redis_url)
        wait_until(lambda: "minilm" in producer.models(), 120, "the worker's advert")
        long_texts = [" ".join(sample_texts(30, seed=i, max_words=60)) for i in range(48)]  # slow batch
        ids = producer.submit_many([long_texts[i:i + 8] for i in range(0, 48, 8)], truncate_prompt_tokens=-1)
        queue = Queue(keys.queue_name("minilm"), connection=redis_client, serializer=MsgpackSerializer)
        wait_until(lambda: len(queue.started_job_registry.get_job_ids()) >= 1, 60, "a round to start")
        started = set(queue.started_job_registry.get_job_ids())
    finally:
        worker.send_signal(signal.SIGKILL)
        worker.wait(10)
    assert all(producer.get(i) is None for i in ids), "the batch finished before the kill; make it longer"

    # rq counts a job as abandoned once its started-registry score passes: ~90 s after the worker's last
    # beat (3 beats + 60 s, BatchWorker.get_heartbeat_ttl). Fast-forward that clock.
    for member in redis_client.zrange(queue.started_job_registry.key, 0, -1):
        redis_client.zadd(queue.started_job_registry.key, {member: 1})
    burst(minilm_engine, redis_client, rq_records=records)  # maintenance runs first

    for request_id in ids:
        result = producer.wait(request_id, timeout=5)
        assert result.ok and result.embeddings.shape == (8, 384)
        job = queue.fetch_job(request_id)  # the killed worker's jobs were retried (rq's Retry), the rest queued
        if records == "lean":  # a served job's answer is its record
            assert job is None
            continue
        retries = JOB_RETRIES - 1 if request_id in started else JOB_RETRIES
        assert job.get_status() == JobStatus.FINISHED and job.retries_left == retries


def test_queued_requests_survive_a_redis_restart_and_a_live_worker_rides_it_out(
        restartable_redis, minilm_engine):
    url = restartable_redis.url
    producer = Producer(url)
    worker = idle_worker(minilm_engine, redis.Redis.from_url(url))  # submits queue up: Redis restarts first
    queued = [producer.submit([f"queued before restart {i}"]) for i in range(5)]

    restartable_redis.restart()
    assert producer.queue_depth("minilm") == 5  # AOF kept the queue and the jobs

    with serve(worker):  # its exit asserts the worker's thread ended, after the restarts too
        assert all(producer.wait(i, timeout=30).ok for i in queued)

        restartable_redis.restart()  # under a worker blocked in BLMOVE: it backs off and reconnects
        after = producer.submit(["submitted after the second restart"], "minilm")
        assert producer.wait(after, timeout=60).ok


def test_every_request_accepted_before_a_redis_restart_completes_after_it(restartable_redis):
    url = restartable_redis.url
    client = redis.Redis.from_url(url)
    with workers(url, 2, "--max-jobs", "8") as procs:
        wait_until(lambda: client.zcard(keys.model_workers_key(MODEL)) >= 2, 60, "the workers' adverts")
        producer = Producer(url)
        ids = producer.submit_many([[f"before {i}"] * 30 for i in range(150)], MODEL)
        wait_until(lambda: client.zcard(f"rq:wip:{keys.queue_name(MODEL)}"), 20, "a round in flight")
        restartable_redis.restart()  # AOF: the queue, the jobs and the claims survive
        ids += producer.submit_many([[f"after {i}"] for i in range(50)], MODEL)
        results = [producer.wait(i, timeout=60) for i in ids]
        assert all(proc.poll() is None for proc in procs), "a worker crashed on the restart"
    assert all(result.ok for result in results)
    assert client.zcard(f"rq:wip:{keys.queue_name(MODEL)}") == 0


def test_a_redis_out_of_memory_gives_the_producer_a_clear_unavailable_error(restartable_redis):
    url = restartable_redis.url
    client = redis.Redis.from_url(url)
    with workers(url, 1):
        wait_until(lambda: client.zcard(keys.model_workers_key(MODEL)) >= 1, 60, "the worker's advert")
        producer = Producer(url)
        assert producer.wait(producer.submit(["fits"], MODEL), timeout=30).ok
        client.config_set("maxmemory-policy", "noeviction")
        client.config_set("maxmemory", max(1, client.info("memory")["used_memory"] - 200_000))  # full now
        started = time.monotonic()
        with pytest.raises(UnavailableError, match="Redis is full") as caught:
            producer.submit(["does not fit"], MODEL)
        assert time.monotonic() - started < 5 and caught.value.code == "redis_unavailable"
        client.config_set("maxmemory", 0)  # room again: the same producer goes on
        assert producer.wait(producer.submit(["fits again"], MODEL), timeout=30).ok
