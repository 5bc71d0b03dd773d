"""A result larger than Redis's proto-max-bulk-len (issue 36, item 2): a real redis-server that refuses any value
over 1 MB and a real worker process. The request whose result Redis cannot take fails once, at once, with the
sizes and what to do; its round-mates are answered; nothing is computed twice or left to a lapsing lease."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time

import numpy as np
import pytest
import redis

from embedfleet.common.protocol import keys, rqkeys
from embedfleet.common.request import EmbedRequest
from embedfleet.common.result import Result
from embedfleet import Producer
from tests.commands import ROOT
from tests.harness import burst, idle_worker
from embedfleet.worker.engine.engine import Engine
from embedfleet.worker.engine.models.nullmodel import NullModel
from embedfleet.worker.serving.spread import ChunkJobs
from embedfleet.worker.serving.storing import BulkLimit

MODEL = "wide"
DIM = 384  # 1,000 inputs of float32: 1.5 MB, over the 1 MB limit; float16 halves it under
LIMIT = 1024 * 1024


@pytest.fixture
def small_redis(configured_redis):
    return configured_redis("proto-max-bulk-len 1mb")


@pytest.fixture
def secretive_redis(configured_redis):
    """The same limit, and no CONFIG command (as a managed Redis, or an ACL user without @dangerous)."""
    return configured_redis("proto-max-bulk-len 1mb", 'rename-command CONFIG ""')


@contextlib.contextmanager
def worker_process(url: str, *flags: str):
    """`python -m embedfleet.worker` on the null model (the result path is the model's; the null model only skips the
    compute), a short lease so that a lapse would show within the test; killed on the way out."""
    proc = subprocess.Popen([sys.executable, "-m", "embedfleet.worker", "--redis-url", url, "--model", f"null:{DIM}",
                             "--served-model-name", MODEL, "--poll-timeout", "1", "--lease-seconds", "2", *flags],
                            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait(10)
        log = proc.stderr.read().decode(errors="replace")
        proc.stderr.close()
        print(log[-4000:])


def served(producer: Producer, worker: subprocess.Popen) -> None:
    deadline = time.monotonic() + 60
    while MODEL not in producer.models():
        assert worker.poll() is None and time.monotonic() < deadline, "the worker did not come up"
        time.sleep(0.1)


def answer(connection: redis.Redis, request_id: str, timeout: float) -> Result:
    """The stored answer, ok or not (Producer.wait raises the request's error; the test reads the blob)."""
    deadline = time.monotonic() + timeout
    while (raw := connection.get(keys.result_key(request_id))) is None:
        assert time.monotonic() < deadline, f"request {request_id} got no answer in {timeout} s"
        time.sleep(0.05)
    return Result.decode(raw)


def test_a_result_over_redis_limit_fails_once_with_the_sizes_and_its_round_mates_are_answered(small_redis):
    connection = redis.Redis.from_url(small_redis.url)
    with worker_process(small_redis.url) as worker, Producer(small_redis.url) as producer:
        served(producer, worker)
        big_texts = [f"text {i}" for i in range(1000)]
        small, big, other = producer.submit_many([["before"], big_texts, ["after"]], MODEL)
        failed = answer(connection, big, timeout=20)  # at once: before the fix, minutes of retries and lapses
        assert failed.error_code == "result_too_large", failed
        message = failed.error_message
        size = 1000 * DIM * 4  # the rows alone; the header adds a little
        found = int(message.split(" bytes")[0].rsplit(" ", 1)[-1].replace(",", ""))
        assert size < found < size + 4096, message
        assert f"{LIMIT:,}" in message and "proto-max-bulk-len" in message, message
        assert "fewer inputs" in message and "embed_dtype" in message, message
        for request_id in (small, other):  # its round-mates
            assert producer.wait(request_id, timeout=20).shape == (1, DIM)
        job = connection.hgetall(rqkeys.rq_job_key(big))
        assert job[b"status"] == b"failed" and job[b"deliveries"] == b"1" and job.get(b"lapses", b"0") == b"0", job
        assert connection.zcard(rqkeys.rq_wip_key(keys.queue_name(MODEL))) == 0  # nothing left to lapse
        # what the message advises: the same inputs in float16 fit (768 KB), and the worker serves on
        halved = producer.submit(big_texts, MODEL, embed_dtype="float16")
        assert producer.wait(halved, timeout=20).shape == (1000, DIM)
        assert worker.poll() is None
    connection.close()


def test_a_redis_that_hides_its_limit_still_fails_only_the_request_it_refuses(secretive_redis):
    """CONFIG GET refused: the worker assumes Redis's default (512 MB), so the write is sent and refused, a
    3 MB value with a reset connection. Redis still answers PING, so it is no outage: the round is stored one
    answer per call, and the one refused alone fails `result_too_large`, once."""
    connection = redis.Redis.from_url(secretive_redis.url)
    with worker_process(secretive_redis.url) as worker, Producer(secretive_redis.url) as producer:
        served(producer, worker)
        small, big, other = producer.submit_many([["before"], [f"text {i}" for i in range(2000)], ["after"]],
                                                 MODEL)
        failed = answer(connection, big, timeout=20)
        assert failed.error_code == "result_too_large", failed
        assert "Redis refuses values of that size" in failed.error_message and "embed_dtype" in failed.error_message
        for request_id in (small, other):
            assert producer.wait(request_id, timeout=20).shape == (1, DIM)
        job = connection.hgetall(rqkeys.rq_job_key(big))
        assert job[b"status"] == b"failed" and job[b"deliveries"] == b"1" and job.get(b"lapses", b"0") == b"0", job
        # what the refusal taught it: the next result as large fails before the script, the worker serves on
        again = producer.submit([f"text {i}" for i in range(2000)], MODEL)
        assert answer(connection, again, timeout=20).error_code == "result_too_large"
        assert producer.wait(producer.submit(["later"], MODEL), timeout=20).ok
        assert worker.poll() is None
    connection.close()


def test_a_round_of_large_results_is_stored_in_calls_within_the_budget(redis_url, redis_client):
    """Results that fit one by one but not together: one finish call per budget's worth, every one stored."""
    engine = Engine(NullModel("null:1024", MODEL), max_batch_tokens=1 << 20, max_batch_size=4096)
    worker = idle_worker(engine, redis_client, max_jobs=64)  # the 9 requests queue up: one round
    worker.store.call_bytes = 1024 * 1024  # 400 KB results: two a call
    sent: list[int] = []
    finish = worker.levels.finish

    def counted(answers, seconds):
        sent.append(sum(len(answer.blob) for answer in answers))
        return finish(answers, seconds)

    worker.levels.finish = counted
    with Producer(redis_url) as producer:
        ids = producer.submit_many([[f"request {r} text {i}" for i in range(100)] for r in range(9)], MODEL)
        assert burst(worker)
        assert all(producer.wait(request_id, timeout=20).shape == (100, 1024) for request_id in ids)
    assert len(sent) == 5 and max(sent) <= 1024 * 1024, sent  # 9 answers, two a call


def test_a_spread_request_answered_from_its_parts_is_held_to_the_same_limit(small_redis):
    """The worker that joins the last part of a long request publishes the combined answer: over the limit, the
    request gets `result_too_large` instead (the plan's reply stream woken too), never a refused write."""
    connection = redis.Redis.from_url(small_redis.url)
    engine = Engine(NullModel(f"null:{DIM}", MODEL))
    chunk_jobs = ChunkJobs(connection, [keys.queue_name(MODEL)], MODEL, result_ttl=60, chunks_per_job=1,
                           combine=engine.combine_parts, limit=BulkLimit(connection))
    request = EmbedRequest(model=MODEL, inputs=["long"] * 700, reply_to=keys.reply_stream_key("p1"))
    combined = Result.success(request.id, MODEL, np.ones((700, DIM), np.float32), "float32", "little", 700)
    chunk_jobs._publish(combined, {"request": request.encode(), "result_ttl": 60})
    stored = Result.decode(connection.get(keys.result_key(request.id)))
    assert stored.error_code == "result_too_large" and f"{LIMIT:,}" in stored.error_message, stored
    assert "about 682 fit" in stored.error_message, stored.error_message
    assert connection.xlen(keys.reply_stream_key("p1")) == 1
    connection.close()
