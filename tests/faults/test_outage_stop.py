"""A worker asked to stop during a Redis outage stops at once, not after its take stage's backoff (rq's, doubling up
to max_connection_wait_time: 60 s by default), which a stop did not interrupt."""

from __future__ import annotations

import logging
import time

import redis

from tests.harness import serve
from tests.nullworker import null_engine

STOP_SECONDS = 2.0  # well under the 4 s pause the stop lands in


def test_a_worker_asked_to_stop_during_an_outage_stops_at_once(restartable_redis, caplog):
    caplog.set_level(logging.ERROR, logger="embedfleet.worker")
    connection = redis.Redis.from_url(restartable_redis.url)
    try:
        # its exit stops the worker and waits STOP_SECONDS at most
        with serve(null_engine(), connection, stop_seconds=STOP_SECONDS):
            restartable_redis.stop()
            deadline = time.monotonic() + 30
            while not any("Redis unreachable" in r.getMessage() and "retrying in 4 s" in r.getMessage()
                          for r in caplog.records):  # the take stage's third pause (1, 2, 4 s) has begun
                assert time.monotonic() < deadline, "the take stage never backed off for 4 s"
                time.sleep(0.05)
    finally:
        connection.close()
