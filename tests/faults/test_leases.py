"""Leases: a killed worker's jobs are back within the documented bound (4/3 of the lease), exactly once,
poison is capped, SIGTERM drains, the watchdog ends a hung forward pass. Real worker processes
(tests/crashworker.py), a real Redis; each test bounded in time and process count, and stops what it starts."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import redis
from rq.job import JobStatus

from embedfleet.common.policy import MAX_DELIVERIES
from embedfleet.common.protocol import keys
from embedfleet.common.protocol.claims import RqSchema
from embedfleet.common.request import EmbedRequest
from embedfleet import Producer
from tests.commands import ROOT, clean_env, embedfleet
from tests import harness
from tests.commands import wait_for
from tests.crashworker import LEASE, MODEL, token, vector, workers
from tests.rqjobs import enqueue, rq_queue
from embedfleet.worker.engine.engine import Engine
from embedfleet.worker.engine.models.nullmodel import NullModel

BOUND = LEASE * 4 / 3  # the documented bound: the lease, then at most one beat (a third of it)


def wait_for_workers(conn, count: int, timeout: float = 60) -> None:
    wait_for(lambda: conn.zcard(keys.model_workers_key(MODEL)) >= count, timeout)


def claims_of(conn, pid: int) -> set[bytes]:
    """The started-registry members whose job the worker process `pid` took (the job's worker_name, which
    both --rq-records write; full also names it in the claim's execution hash)."""
    wip = f"rq:wip:{keys.queue_name(MODEL)}"
    return {m for m in conn.zrange(wip, 0, -1)
            if f"-{pid}-" in (conn.hget(b"rq:job:" + m.split(b":")[0], "worker_name") or b"").decode()}


def test_two_live_workers_recovering_the_same_dead_one_requeue_each_job_once(redis_url, redis_client):
    engine = Engine(NullModel("null:4", MODEL))
    requests = [EmbedRequest(model=MODEL, inputs=[f"t{i}"]) for i in range(200)]
    for request in requests:
        enqueue(redis_client, request)
    dead = harness.worker(engine, redis_client, max_jobs=200, lease_seconds=0.2)
    assert dead.take_round(None).size == 200  # taken and started; then its heartbeat never runs
    time.sleep(0.3)  # the lease lapses

    queue = rq_queue(redis_client, MODEL)
    recovered: list[list[str]] = [[], []]
    start = threading.Barrier(2)

    def recover(slot: int) -> None:
        schema = RqSchema(redis.Redis.from_url(redis_url), queue.name, f"rescuer-{slot}", result_ttl=60, lease=2)
        start.wait()
        for _ in range(20):  # small limits: the two interleave over many runs
            recovered[slot] += [r.id for r in schema.recover(limit=7)]

    threads = [threading.Thread(target=recover, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    ids = [r.id for r in requests]
    assert sorted(recovered[0] + recovered[1]) == sorted(ids)  # each once, by one of them
    assert recovered[0] and recovered[1], "the two recoverers did not interleave; the test proves nothing"
    assert sorted(i.decode() for i in redis_client.lrange(queue.key, 0, -1)) == sorted(ids)  # queued once each
    assert redis_client.zcard(queue.started_job_registry.key) == 0
    assert {redis_client.hget(f"rq:job:{i}", "lapses") for i in ids} == {b"1"}
    assert {queue.fetch_job(i).get_status() for i in ids} == {JobStatus.QUEUED}


@pytest.mark.parametrize("records", ["lean", "full"])
def test_a_worker_killed_mid_batch_has_its_jobs_back_within_the_bound(redis_url, redis_client, records):
    texts = [[f"request {i} text {j}" for j in range(2)] for i in range(320)]
    with workers(redis_url, 2, "--max-jobs", "16", "--rq-records", records) as (victim, survivor):
        wait_for_workers(redis_client, 2)
        producer = Producer(redis_url)
        ids = producer.submit_many(texts, MODEL)
        wait_for(lambda: claims_of(redis_client, victim.pid), 30)  # the victim is mid-round
        victim.kill()
        killed_at = time.monotonic()
        victim.wait(10)
        held = claims_of(redis_client, victim.pid)  # what it held when it died
        assert held, "the victim held nothing when it was killed; the test proves nothing"
        wip = f"rq:wip:{keys.queue_name(MODEL)}"
        while any(redis_client.zscore(wip, m) is not None for m in held):
            assert time.monotonic() - killed_at < 3 * BOUND, "the dead worker's jobs were not requeued in time"
            time.sleep(0.02)
        recovery = time.monotonic() - killed_at
        results = [producer.wait(i, timeout=60) for i in ids]
        assert survivor.poll() is None
    assert held and recovery <= 3 * BOUND
    for request_texts, result in zip(texts, results):  # each with the clean run's vectors
        np.testing.assert_allclose(result.embeddings, np.stack([vector(token(t)) for t in request_texts]),
                                   rtol=1e-5, atol=1e-6)
    queue = rq_queue(redis_client, keys.queue_name(MODEL).split(".", 1)[1])
    assert redis_client.zcard(queue.started_job_registry.key) == 0
    if records == "lean":  # a served job's answer is its record (its lapses were counted while it waited: the
        assert not any(redis_client.exists(f"rq:job:{i}") for i in ids)  # poison test reads them)
        return
    assert {queue.fetch_job(i).get_status() for i in ids} == {JobStatus.FINISHED}
    lapsed = {m.decode().split(":")[0] for m in held}
    assert all(int(redis_client.hget(f"rq:job:{i}", "lapses")) == 1 for i in lapsed)
    print(f"recovered {len(held)} jobs {recovery:.2f} s after the kill (documented bound {BOUND:.2f} s)")


def test_a_request_that_kills_every_worker_ends_poison_and_can_be_requeued(redis_url, redis_client, tmp_path):
    producer = Producer(redis_url)
    with workers(redis_url, 1) as [first]:
        wait_for_workers(redis_client, 1)
        poison = producer.submit(["die"], MODEL)
        first.wait(30)
    assert first.returncode == -signal.SIGKILL
    queue = rq_queue(redis_client, MODEL)
    for _ in range(MAX_DELIVERIES + 1):  # each new worker recovers the last one's claim, takes, dies
        if queue.fetch_job(poison).get_status() == JobStatus.FAILED:
            break
        with workers(redis_url, 1) as [worker]:
            wait_for(lambda: worker.poll() is not None or queue.fetch_job(poison).get_status() == JobStatus.FAILED,
                     30)
    job = queue.fetch_job(poison)
    assert job.get_status() == JobStatus.FAILED
    assert redis_client.hget(job.key, "lapses") == str(MAX_DELIVERIES).encode()
    with pytest.raises(Exception, match="taken 3 times") as caught:
        producer.wait(poison, timeout=5)
    assert caught.value.code == "poison"

    env = clean_env(tmp_path, EMBEDFLEET_REDIS_URL=redis_url)
    listed = embedfleet("failed", "list", "--model", MODEL, env=env)
    assert listed.returncode == 0 and poison in listed.stdout and "poison" not in listed.stderr
    assert "taken 3 times" in listed.stdout and "1 failed request" in listed.stdout
    shown = embedfleet("failed", "show", poison, env=env)
    assert "workers died holding it: 3" in shown.stdout and "'die'" in shown.stdout
    requeued = embedfleet("failed", "requeue", poison, env=env)
    assert requeued.returncode == 0, requeued.stderr
    assert redis_client.lrange(queue.key, 0, -1) == [poison.encode()]
    assert job.get_status() == JobStatus.QUEUED and redis_client.hget(job.key, "lapses") is None
    assert producer.get(poison) is None  # the old error answer is gone: a waiter gets the new one
    missing = embedfleet("failed", "show", "nosuchid", env=env)
    assert missing.returncode == 1 and missing.stderr.startswith("embedfleet: no failed request nosuchid")


def test_sigterm_finishes_the_round_on_the_device_and_returns_the_rest_to_the_head(redis_url, redis_client):
    producer = Producer(redis_url)
    with workers(redis_url, 1, "--max-jobs", "8") as [worker]:
        wait_for_workers(redis_client, 1)
        ids = producer.submit_many([["hang" if i == 0 else f"text {i}"] for i in range(40)], MODEL)
        queue = rq_queue(redis_client, MODEL)
        wait_for(lambda: redis_client.zcard(queue.started_job_registry.key) == 16, 20)  # one round on the
        # device (hung: a long batch), the next taken and prepared
        worker.send_signal(signal.SIGTERM)  # the device round is hung: only the waiting round can go back
        wait_for(lambda: redis_client.llen(queue.key) == 40 - 8, 10)  # back, while the device's is held
        assert [i.decode() for i in redis_client.lrange(queue.key, 0, -1)] == ids[8:]  # at the head, in order
        assert all(redis_client.hget(f"rq:job:{i}", "deliveries") == b"0" for i in ids[8:16])
        worker.send_signal(signal.SIGTERM)  # a second signal: exit at once, the lease recovers its round
        assert worker.wait(10) == 1


def test_sigterm_drain_writes_the_round_and_exits_zero_with_nothing_started(redis_url, redis_client):
    producer = Producer(redis_url)
    with workers(redis_url, 1, "--max-jobs", "8") as [worker]:
        wait_for_workers(redis_client, 1)
        ids = producer.submit_many([[f"text {i}"] * 40 for i in range(60)], MODEL)  # 80 ms per round
        queue = rq_queue(redis_client, MODEL)
        # a round on the device and the next one taken (--max-jobs 8: 8 of these requests a round)
        wait_for(lambda: redis_client.zcard(queue.started_job_registry.key) > 8, 20)
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(30) == 0, worker.stderr.read().decode()[-2000:]
    assert redis_client.zcard(queue.started_job_registry.key) == 0  # nothing left started
    done = [i for i in ids if producer.get(i) is not None]
    assert done and all(producer.get(i).ok for i in done)
    assert [i.decode() for i in redis_client.lrange(queue.key, 0, -1)] == [i for i in ids if i not in done]
    assert {queue.fetch_job(i).get_status() for i in ids if i not in done} == {JobStatus.QUEUED}
    assert not redis_client.exists(keys.model_key(MODEL))  # the advert withdrawn


def test_the_watchdog_ends_a_hung_forward_pass_and_the_lease_recovers_its_jobs(redis_url, redis_client):
    producer = Producer(redis_url)
    with workers(redis_url, 1, "--watchdog", "1") as [worker]:
        wait_for_workers(redis_client, 1)
        hung = producer.submit(["hang"], MODEL)
        assert worker.wait(30) == 70  # the watchdog's exit code, for the supervisor to restart it
        assert b"past its" in worker.stderr.read()
    queue = rq_queue(redis_client, MODEL)
    schema = RqSchema(redis_client, queue.name, "rescuer", result_ttl=60, lease=LEASE)
    wait_for(lambda: [r.id for r in schema.recover()] == [hung], 3 * BOUND)
    assert redis_client.lrange(queue.key, 0, -1) == [hung.encode()]


def test_a_worker_ended_by_its_watchdog_still_flushes_its_output(redis_url, redis_client):
    """The watchdog's exit skips the interpreter's teardown (a hung device call would never let it finish), not
    the flush of what the process wrote: crashworker's first line to stdout (a pipe, so block-buffered) is there
    after the exit (common/processes.py exit_now)."""
    buffered = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}  # as a worker runs by default
    proc = subprocess.Popen([sys.executable, "-m", "tests.crashworker", redis_url, MODEL, "--lease", str(LEASE),
                             "--watchdog", "1"], cwd=ROOT, env=buffered, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL)
    try:
        wait_for_workers(redis_client, 1)
        Producer(redis_url).submit(["hang"], MODEL)
        assert proc.wait(30) == 70
        assert proc.stdout.read().decode().startswith("crashworker embedfleet-"), "the output was lost"
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)
        proc.stdout.close()
