"""Workers in the test's own process, built as `embedfleet worker` builds them (worker/serving/builder.py) from
`settings()`: production's defaults (vector cache, watchdog, long requests spread over the fleet) unless a test
names what it does otherwise. `worker()` builds one, `idle_worker()` builds and advertises one that takes nothing
yet, `serve()` runs one in a thread for the span of a `with`, and `Fleet` holds serving workers, a Producer and
gateways on one Redis (the `fleet` fixture of tests/conftest.py is one on the test's flushed Redis; a module
fixture opens its own). Every worker is stopped, joined within a bound, and checked: a thread that did not end
fails the test, and what `work()` raised is raised again."""

from __future__ import annotations

import contextlib
import sys
import threading
import traceback
from collections.abc import Iterator
from typing import TYPE_CHECKING

import redis
from redis.cluster import RedisCluster

from embedfleet import Producer
from tests.commands import advertised
from embedfleet.worker.serving.builder import build_worker
from embedfleet.worker.serving.config import WorkerSettings, given_settings
from embedfleet.worker.serving.pipeline import BatchWorker

if TYPE_CHECKING:
    from tests import gatewayserver

STOP_SECONDS = 30  # a stopped worker ends within one poll (1 s here) and the rounds it holds
ADVERT_SECONDS = 60  # work() advertises before its first take: only a loaded box makes this take long
POLL_SECONDS = 1  # a test's workers' --poll-timeout unless it says: a stop is noticed within a second


def settings(**values) -> WorkerSettings:
    """A worker's settings as `embedfleet worker --flag value ...` would make them, from `values` (field names)
    and the defaults alone: neither the environment nor a running `up` is read (worker/serving/config.py)."""
    return given_settings(**values)


def worker(engine, connection: redis.Redis, **options) -> BatchWorker:
    """A worker of `engine` on `connection`, built as `embedfleet worker` builds one (worker/serving/builder.py),
    not yet working.

    options: WorkerSettings fields (`max_jobs=8`, `lease_seconds=0.2`, `cache=False`, `chunks_per_job=0`, ...;
        poll_timeout POLL_SECONDS unless given), and build_worker's overrides for what production does not do
        (BatchWorker keyword arguments: a `cache` of the test's own, `watchdog=None`, `metrics`, `info`,
        `heartbeat_interval`, `queue`, ...).
    """
    fields = {name: value for name, value in options.items()
              if name in WorkerSettings.model_fields and (name != "cache" or isinstance(value, bool))}
    overrides = {name: value for name, value in options.items() if name not in fields}
    return build_worker(settings(**{"poll_timeout": POLL_SECONDS, **fields}), engine, connection, **overrides)


def idle_worker(engine, connection: redis.Redis, **options) -> BatchWorker:
    """`worker()`, advertised (producers submit to its model) but taking nothing until it works: for a test that
    queues a whole round first, or needs requests that wait. Its advert lives ADVERTISE_TTL unless it works."""
    built = worker(engine, connection, **options)
    built.advertiser.advertise()
    return built


class ServingThread(threading.Thread):
    """`worker.work(burst)` in a daemon thread; keeps what it returned or raised."""

    def __init__(self, worker: BatchWorker, burst: bool):
        super().__init__(name=f"serve-{worker.name}", daemon=True)
        self.worker, self.burst = worker, burst
        self.served: bool | None = None  # work()'s answer: whether any job was served
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.served = self.worker.work(burst=self.burst)
        except BaseException as exc:  # noqa: BLE001 - kept for the test's thread, which raises it again
            self.error = exc

    def end(self, timeout: float) -> None:
        """Join within `timeout` s; fail if the thread still runs, raise again what work() raised."""
        self.join(timeout)
        assert not self.is_alive(), (f"worker {self.worker.name}: work() did not return within {timeout:g} s; "
                                     f"where this process's threads are:\n{thread_stacks()}")
        if self.error is not None:
            raise self.error


def thread_stacks() -> str:
    """Every thread's name and stack now: what a worker that does not stop waits on."""
    names = {thread.ident: thread.name for thread in threading.enumerate()}
    return "\n".join(f"--- {names.get(ident, ident)}\n" + "".join(traceback.format_stack(frame))
                     for ident, frame in sys._current_frames().items())


@contextlib.contextmanager
def serve(worker: BatchWorker | object, connection: redis.Redis | str | None = None, *, burst: bool = False,
          stop_seconds: float = STOP_SECONDS, **options) -> Iterator[BatchWorker]:
    """Serve in a thread of this process for the span of the `with`; yields the worker once its advert is seen.

    Args:
        worker: a BatchWorker, or an engine to build one on `connection` with `options` (`worker()`'s).
        connection: a Redis client or URL; only with an engine.
        burst: `work(burst=True)`: it ends by itself once the queue is empty (queue the work, advertising by
            hand first if a Producer submits it, before the `with`); else the exit stops it (`stop()`: what
            it took is finished first).
        stop_seconds: how long the exit waits for `work()` to return before it fails the test.
    """
    with _serving(*_worker(worker, connection, options), burst, stop_seconds) as thread:
        yield thread.worker


def burst(worker: BatchWorker | object, connection: redis.Redis | str | None = None, *,
          stop_seconds: float = STOP_SECONDS, **options) -> bool:
    """`work(burst=True)` in a thread until the queue is empty (`serve`'s arguments); returns what work() does:
    whether it served any job. In a thread, never the test's own: in the main thread work() would install the
    worker's SIGINT/SIGTERM handlers in the test process, where they would outlive it."""
    with _serving(*_worker(worker, connection, options), True, stop_seconds) as thread:
        pass
    return thread.served


def one_round(worker: BatchWorker) -> list[str]:
    """Take, run and answer one round of a worker that is not working, by hand, in this thread (the forward pass
    the engine's own: no cache around it); returns the ids it took."""
    batch = worker.take_round(None)
    assert batch is not None
    if batch.work is not None:
        worker.engine.forward(batch.work)
    worker.finish_round(batch)
    return [job.id for job in batch.runnable]


def _worker(given: BatchWorker | object, connection: redis.Redis | str | None,
            options: dict) -> tuple[BatchWorker, bool]:
    """The worker to serve, and whether its Redis client is the harness's own (opened on a URL: closed after)."""
    if isinstance(given, BatchWorker):
        assert connection is None and not options, "a BatchWorker is served as it was built"
        return given, False
    assert connection is not None, "serving an engine needs the Redis to serve it on"
    client = redis.Redis.from_url(connection) if isinstance(connection, str) else connection
    return worker(given, client, **options), isinstance(connection, str)


@contextlib.contextmanager
def _serving(worker: BatchWorker, owned: bool, burst: bool, stop_seconds: float) -> Iterator[ServingThread]:
    thread = ServingThread(worker, burst)
    thread.start()
    ended = False
    try:
        _wait_advertised(thread)
        yield thread
        if not burst:
            worker.stop()
        ended = True
        thread.end(stop_seconds)
    finally:
        if not ended:  # the test failed: stop the worker whatever the mode, and report the test's own error
            worker.stop()
            thread.join(stop_seconds)
        if owned:
            worker.connection.close()


def _wait_advertised(thread: ServingThread) -> None:
    """Until the worker's advert is seen (work() advertises before its first take); a burst may end first."""
    worker = thread.worker
    # On the worker's own client, never closed here: closing it would cut the worker's blocking take.
    producer = Producer(_label(worker.connection), connection=worker.connection)
    try:
        advertised(producer, worker.engine.caps.name, thread, ADVERT_SECONDS, name=worker.name)
    except AssertionError:
        if thread.is_alive():
            raise  # no advert in time
        thread.end(0)  # it ended first: raises what work() raised
        assert thread.burst, f"worker {worker.name}: work() returned before it was stopped"


def _label(connection: redis.Redis) -> str:
    """The URL a Producer names in its errors, for a client it is handed (it opens no connection of its own);
    a Redis Cluster's says so (the Producer lays its keys out by the URL's form), with its partition."""
    if isinstance(connection, RedisCluster):
        node = connection.get_nodes()[0]
        partition = getattr(connection, "partition", "")
        return f"redis+cluster://{node.host}:{node.port}" + (f"#{partition}" if partition else "")
    kwargs = connection.connection_pool.connection_kwargs
    return f"redis://{kwargs.get('host', 'localhost')}:{kwargs.get('port', 6379)}/{kwargs.get('db', 0)}"


class Fleet:
    """Workers serving in threads of this process, a Producer and gateways, on one Redis; all stopped when the
    fleet ends (gateways and workers in the reverse order of their start; each worker joined and checked).

        with Fleet(redis_server.url, flush=True) as fleet:   # or the `fleet` fixture (tests/conftest.py)
            fleet.serve(engine, max_jobs=8)
            fleet.producer.embed(["a text"], engine.caps.name)
            url = fleet.gateway(api_key=KEY).url
    """

    def __init__(self, redis_url: str, *, flush: bool = False):
        self.url = redis_url
        self.redis = redis.Redis.from_url(redis_url)
        if flush:  # a module's fleet on the session's Redis starts from nothing other modules left
            self.redis.flushall()
        self.workers: list[BatchWorker] = []
        self._bursts: set[str] = set()  # names of the workers serving a burst: those end by themselves
        self._stack = contextlib.ExitStack()
        self._producer: Producer | None = None

    def serve(self, worker, *, burst: bool = False, **options) -> BatchWorker:
        """`serve(worker or engine, this fleet's Redis, ...)` until the fleet ends; returns the serving worker."""
        worker = self._stack.enter_context(serve(worker, None if isinstance(worker, BatchWorker) else self.redis,
                                                 burst=burst, **options))
        self.workers.append(worker)
        if burst:
            self._bursts.add(worker.name)
        return worker

    @property
    def producer(self) -> Producer:
        """A Producer on the fleet's Redis, opened at first use."""
        if self._producer is None:
            self._producer = self._stack.enter_context(Producer(self.url))
        return self._producer

    def gateway(self, **fields) -> gatewayserver.Server:
        """A gateway (tests/gatewayserver.py) on the fleet's Redis with these settings, stopped with the fleet."""
        from tests import gatewayserver  # the web stack loads for the tests that start a gateway

        server = gatewayserver.Server(gatewayserver.settings(self.url, **fields))
        self._stack.callback(server.stop)
        return server

    def __enter__(self) -> Fleet:
        return self

    def __exit__(self, *exc) -> None:
        for worker in self.workers:  # all told at once: each ends within its poll, not one poll after another
            if worker.name not in self._bursts:
                worker.stop()
        try:
            self._stack.__exit__(*exc)
        finally:
            self.redis.close()
