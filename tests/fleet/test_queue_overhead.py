"""Redis commands per job: BatchWorker's batched bookkeeping against rq's SimpleWorker on the same server."""

from __future__ import annotations

import redis
from rq import Queue
from rq.utils import now

from embedfleet.common.request import EmbedRequest
from embedfleet.common.serializer import MsgpackSerializer
from tests import harness
from tests.roundtrips import CountingConnection
from tests.rqjobs import enqueue, texts
from embedfleet.worker.serving.rqpubsub import PromptSimpleWorker


def noop(payload: bytes) -> None:
    """The baseline job: rq's bookkeeping only."""


def command_count(conn) -> int:
    """Commands the server has executed (INFO commandstats counts those run inside Lua scripts too)."""
    return sum(stats["calls"] for name, stats in conn.info("commandstats").items())


def cost(conn, run) -> tuple[int, int]:
    """(commands, round trips) the server saw during `run()`."""
    before, sends = command_count(conn), CountingConnection.sends
    run()
    return command_count(conn) - before - 1, CountingConnection.sends - sends - 1  # less the second INFO


def burst(worker) -> None:
    worker.last_cleaned_at = now()  # maintenance runs on a timer, not per job: keep it out of the figure
    worker.work(burst=True)


def per_job(conn, make_worker, fill, jobs: int) -> tuple[float, float]:
    """Cost of a burst over `jobs` jobs less that of a burst over none (start-up and exit)."""
    burst(make_worker())  # warm-up: first-use costs (server version probe, new connections)
    fixed = cost(conn, lambda: burst(make_worker()))
    fill(jobs)
    full = cost(conn, lambda: burst(make_worker()))
    return (full[0] - fixed[0]) / jobs, (full[1] - fixed[1]) / jobs


def test_commands_per_job_are_a_fraction_of_simpleworkers(engine, redis_url):
    redis_client = redis.Redis.from_url(redis_url, connection_class=CountingConnection)
    name = engine.caps.name

    def fill_requests(count):
        for text in texts(count):
            enqueue(redis_client, EmbedRequest(model=name, inputs=[text]))

    # --no-cache: what is measured is the queue path's bookkeeping against rq's; the vector cache's lookups and
    # writes (and its in-flight claims) are another cost, of the inputs, not of the jobs
    batch = per_job(redis_client, lambda: harness.worker(engine, redis_client, max_jobs=64, cache=False),
                    fill_requests, 64)

    noop_queue = Queue("noop", connection=redis_client, serializer=MsgpackSerializer)

    def fill_noops(count):
        for _ in range(count):
            noop_queue.enqueue(noop, b"x", result_ttl=600)

    simple = per_job(redis_client, lambda: PromptSimpleWorker([noop_queue], connection=redis_client,
                                                                serializer=MsgpackSerializer), fill_noops, 64)
    print(f"\nper job, 64 jobs: BatchWorker (one batch, result writes included) {batch[0]:.1f} commands, "
          f"{batch[1]:.2f} round trips; rq SimpleWorker (no-op jobs) {simple[0]:.1f} commands, "
          f"{simple[1]:.1f} round trips; ratios {simple[0] / batch[0]:.1f}x and {simple[1] / batch[1]:.0f}x")
    assert batch[0] < 10 and batch[0] < simple[0] / 5  # 17.5 before issue 38's cuts, 7.2 after
    assert batch[1] * 64 <= 8  # a handful of round trips for the whole batch
