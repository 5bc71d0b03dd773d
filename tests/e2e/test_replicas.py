"""`embedfleet worker --replicas N`: N engine processes on one device serve the same queue, each request answered
once; a replica killed with SIGKILL is started again by the supervisor (worker/serving/supervise.py) and the jobs
it held come back by their leases. Real worker processes (the null model), a real Redis; bounded in time."""

from __future__ import annotations

import os
import signal

import numpy as np
import pytest
import redis
from rich.console import Console
from rq.job import JobStatus

from embedfleet.common.codec import packb
from embedfleet import Producer
from embedfleet.common.protocol import keys
from embedfleet.producer.cli.statusview import _workers
from embedfleet.producer.client.core import parse_worker_info
from tests.commands import clean_env, wait_for
from tests.rqjobs import rq_queue
from tests.supervisors import MODEL, engines, supervisor
from tests.upprocess import Up, alive
from embedfleet.worker.serving.gpus import child_argv, default_replicas

def claims_of(conn, pid: int) -> set[bytes]:
    """The started-registry members whose execution belongs to the engine process `pid`."""
    wip = f"rq:wip:{keys.queue_name(MODEL)}"
    return {m for m in conn.zrange(wip, 0, -1)
            if f"-{pid}-" in (conn.hget(b"rq:execution:" + m, "worker_name") or b"").decode()}


def test_replicas_share_the_queue_and_a_killed_one_is_restarted_with_its_jobs_answered(
        redis_url, redis_client, tmp_path):
    # rq's full records: who holds a claim (its execution), and each served job's status and worker, read below
    with supervisor(redis_url, tmp_path, "--replicas", "2", "--rq-records", "full") as (parent, log, _):
        wait_for(lambda: len(engines(redis_client)) == 2 or parent.poll() is not None, 90)
        assert parent.poll() is None, log.read_text()[-3000:]
        first = engines(redis_client)
        assert sorted(f["replica"] for f in first.values()) == ["1/2", "2/2"]
        pids = {f["pid"] for f in first.values()}
        assert len(pids) == 2 and parent.pid not in pids

        # They share the queue: a first load, both running, is answered by both (each served job names its worker).
        producer = Producer(redis_url)
        shared = producer.submit_many([[f"shared {i}"] for i in range(400)], MODEL)
        assert all(producer.wait(i, timeout=60).ok for i in shared)
        answered_by = {(redis_client.hget(f"rq:job:{i}", "worker_name") or b"").decode() for i in shared}
        assert len(answered_by) == 2, answered_by

        victim, survivor = sorted(pids)
        os.kill(survivor, signal.SIGSTOP)  # held still for a moment, so that the queue outlasts the hunt below
        texts = [[f"request {i} text {j}" for j in range(2)] for i in range(3000)]
        ids = producer.submit_many(texts, MODEL)
        held = set()
        while not held:  # freeze it where it holds a round (the null model's rounds are short), then kill it
            assert redis_client.llen(f"rq:queue:{keys.queue_name(MODEL)}"), "the queue drained before a kill"
            os.kill(victim, signal.SIGSTOP)
            held = claims_of(redis_client, victim)
            if not held:
                os.kill(victim, signal.SIGCONT)
        os.kill(victim, signal.SIGKILL)
        os.kill(survivor, signal.SIGCONT)
        # Restarted: two engines again, the victim's replica label under a new pid.
        wait_for(lambda: len(engines(redis_client)) == 2 and victim not in {f["pid"] for f in
                                                                             engines(redis_client).values()}, 90)
        results = [producer.wait(i, timeout=60) for i in ids]
        assert parent.poll() is None
        after = engines(redis_client)
        assert sorted(f["replica"] for f in after.values()) == ["1/2", "2/2"]
        parent.send_signal(signal.SIGTERM)  # forwarded: both drain and stop, then the parent, with 0
        assert parent.wait(60) == 0, log.read_text()[-3000:]
    assert "killed by SIGKILL; starting it again" in log.read_text()
    for request_texts, result in zip(texts, results):
        assert result is not None and result.embeddings.shape == (len(request_texts), 4)
        assert np.isfinite(result.embeddings).all()
    queue = rq_queue(redis_client, keys.queue_name(MODEL).split(".", 1)[1])
    assert {queue.fetch_job(i).get_status() for i in ids} == {JobStatus.FINISHED}
    assert redis_client.zcard(queue.started_job_registry.key) == 0
    # Each request answered by an engine (after the kill the survivor may well answer them all: it runs while
    # the victim's replacement starts, and the null model drains the queue within a second).
    assert all(redis_client.hget(f"rq:job:{i}", "worker_name") for i in ids)
    # The victim's claims when it froze: a finish it had sent just before SIGSTOP still runs in Redis (the
    # command was in the socket), so those jobs are answered by the victim and never lapse; every other claim
    # lapsed and was requeued exactly once.
    held_ids = {m.decode().rsplit(":", 1)[0] for m in held}
    by_victim = {i for i in held_ids
                 if f"-{victim}-" in (redis_client.hget(f"rq:job:{i}", "worker_name") or b"").decode()}
    lapsed = held_ids - by_victim
    assert lapsed, "every claim the victim held was answered by it: nothing was left to recover"
    assert all(redis_client.hget(f"rq:job:{i}", "lapses") is None for i in by_victim)
    assert all(int(redis_client.hget(f"rq:job:{i}", "lapses")) == 1 for i in lapsed)  # requeued once each
    assert redis_client.zcard(keys.model_workers_key(MODEL)) == 0


def test_a_replica_that_keeps_dying_stops_the_others_with_its_code(redis_url, tmp_path):
    """--max-restarts 0: the first death stops the fleet (the worker's own watchdog-exit path, here a missing
    model folder: each engine exits 1 at start)."""
    with supervisor(redis_url, tmp_path, "--replicas", "2", "--max-restarts", "0", "--model",
                    str(tmp_path / "no-such-model")) as (parent, log, _):
        assert parent.wait(60) == 1, log.read_text()[-3000:]
    assert "--max-restarts 0); stopping the others" in log.read_text()


@pytest.mark.parametrize(("gpus", "cores", "expected"), [(0, 16, 1), (1, 16, 4), (1, 2, 1), (2, 16, 2),
                                                           (1, 64, 8), (8, 128, 4)])
def test_default_replicas_from_the_cores_per_gpu(gpus, cores, expected):
    assert default_replicas(gpus, cores) == expected


def test_children_get_their_own_name_and_metrics_port_and_no_supervisor_flags():
    argv = ["--model", "m", "--replicas", "3", "--gpus=0,1", "--name", "w", "--metrics-port=9100", "--packed", "on"]
    assert child_argv(argv) == ["--model", "m", "--packed", "on"]


def test_status_shows_the_replica_and_packing():
    facts = parse_worker_info("w", packb({"model": "m", "device": "cuda", "dtype": "float16", "replica": "2/4",
                                          "forward": "packed"}))
    console = Console(width=200, record=True)
    console.print(_workers({"workers": [{**facts, "last_beat_s": 1.0}]}, wide=True))
    text = console.export_text()
    assert "cuda (replica 2/4)" in text and "float16 packed" in text



def test_up_replicas_waits_for_every_engine_and_stops_them(tmp_path):
    """`embedfleet up --replicas 2`: up only once both engines of its worker advertise; Ctrl-C stops them all."""
    up = Up("--redis-port", "0", "--no-gateway", "--data-dir", str(tmp_path / "data"), "--model", "null:4",
            "--served-model-name", MODEL, "--replicas", "2", env=clean_env(tmp_path / "cache"))
    try:
        up.wait_up()
        conn = redis.Redis.from_url(up.redis_url)
        live = engines(conn)
        conn.close()
        assert sorted(f["replica"] for f in live.values()) == ["1/2", "2/2"], up.output
        assert up.stop(signal.SIGINT) == 130, up.output  # Ctrl-C: the shell's code
    finally:
        up.kill()
    assert not [f["pid"] for f in live.values() if alive(f["pid"])]
