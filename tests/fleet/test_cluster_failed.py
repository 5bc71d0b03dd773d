"""`embedfleet failed` on a real Redis Cluster (issue 39): failed jobs carry their model's hash tag, which rq's own
Job refuses; through TaggedJob the command lists, shows, requeues and purges them as on a plain Redis."""

from __future__ import annotations

import time

from embedfleet.common.names import slot_tag, tag_of
from embedfleet.common.protocol import keys, rqkeys
from embedfleet.common.redisclient import connect
from embedfleet import Producer
from embedfleet.producer.cli import failed
from tests.harness import serve
from tests.nullworker import NULL, null_engine


def _failed_jobs(cluster_url: str, count: int) -> list[str]:
    """`count` bulk requests whose job data is garbage, failed by a worker (decode_error) into the failed registry."""
    connection = connect(cluster_url)
    try:
        with serve(null_engine(), connection):  # the model is known: bulk work waits for a worker
            pass
        with Producer(cluster_url) as producer:
            ids = [producer.submit([f"bad {i}"], NULL, priority="bulk") for i in range(count)]
        for request_id in ids:
            connection.hset(rqkeys.rq_job_key(request_id), "data", b"not a job")
        registry = rqkeys.rq_failed_key(keys.queue_name(NULL, "bulk", slot_tag(NULL)))
        with serve(null_engine(), connection, rq_records="full"):
            deadline = time.monotonic() + 60
            while connection.zcard(registry) < count:
                assert time.monotonic() < deadline, "the bad jobs were not failed"
                time.sleep(0.05)
        return ids
    finally:
        connection.close()


def test_failed_lists_shows_requeues_and_purges_on_a_cluster(cluster_url, capsys):
    requeued, purged = _failed_jobs(cluster_url, 2)
    assert tag_of(requeued) == slot_tag(NULL)
    assert failed.run(["list", "--redis-url", cluster_url]) == 0
    listed = capsys.readouterr().out
    assert requeued in listed and purged in listed and "2 failed request(s)" in listed
    assert f"{NULL}@bulk" in listed  # the model's name, without the tag
    assert failed.run(["show", requeued, "--redis-url", cluster_url]) == 0
    shown = capsys.readouterr().out
    assert requeued in shown and "undecodable job data" in shown  # its data is garbage: said so
    assert failed.run(["requeue", requeued, "--redis-url", cluster_url]) == 0
    capsys.readouterr()
    connection = connect(cluster_url)
    try:
        queue = rqkeys.rq_queue_key(keys.queue_name(NULL, "bulk", slot_tag(NULL)))
        assert connection.lrange(queue, 0, -1) == [requeued.encode()]
        assert not connection.exists(keys.result_key(requeued))  # its error answer gone: a waiter gets the new one
        assert failed.run(["list", "--model", NULL, "--redis-url", cluster_url]) == 0  # its tagged queue
        capsys.readouterr()
        assert failed.run(["purge", "--redis-url", cluster_url]) == 0
        assert "purged 1 failed request(s)" in capsys.readouterr().out
        assert not connection.exists(rqkeys.rq_job_key(purged))
        assert failed.run(["list", "--redis-url", cluster_url]) == 0
        assert "no failed requests" in capsys.readouterr().out
    finally:
        connection.close()
