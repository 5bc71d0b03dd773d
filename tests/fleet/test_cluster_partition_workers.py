"""A model's partitions on one Redis Cluster (`#p0`, `#p1`: a hash tag each for its queues) share its adverts, so
each partition lists every worker of the model: `status`, the gateway's /metrics and /health (what autoscalers
read) count each worker once all the same (producer/client/reads.py's worker_names)."""

from __future__ import annotations

import contextlib
import json
import urllib.request

from embedfleet import Producer
from embedfleet.common.protocol import keys
from embedfleet.common.redisclient import connect
from tests import gatewayserver
from tests.commands import clean_env, embedfleet
from tests.harness import serve
from tests.nullworker import NULL, null_engine


def test_workers_of_partitions_on_one_cluster_are_counted_once(cluster_url, tmp_path):
    urls = [f"{cluster_url}#p0", f"{cluster_url}#p1"]
    shards = f"{NULL}={urls[0]},{urls[1]}"
    connections = [connect(url) for url in urls]
    try:
        with contextlib.ExitStack() as stack:
            for connection in connections:  # a worker per partition: 2 in all
                stack.enter_context(serve(null_engine(), connection))
            assert connections[0].zcard(keys.model_workers_key(NULL)) == 2  # one list, read through both partitions

            env = clean_env(tmp_path, EMBEDFLEET_REDIS_URL=cluster_url, EMBEDFLEET_REDIS_SHARDS=shards)
            done = embedfleet("status", "--json", env=env)
            assert done.returncode == 0, done.stderr
            fleet = json.loads(done.stdout)
            (row,) = fleet["models"]
            assert row["name"] == NULL and row["partitions"] == 2 and row["live_workers"] == 2, row
            assert len(fleet["workers"]) == 2 and fleet["unreachable"] == []

            with Producer(cluster_url, shards={NULL: urls}) as producer:
                assert producer.live_workers(NULL) == 2 and len(producer.workers(NULL)) == 2

            gateway = stack.enter_context(_gateway(cluster_url, shards))
            with urllib.request.urlopen(f"{gateway.url}/metrics", timeout=30) as answer:
                metrics = answer.read().decode()
            assert f'embedfleet_live_workers{{model="{NULL}"}} 2.0' in metrics, metrics
            with urllib.request.urlopen(f"{gateway.url}/health", timeout=30) as answer:
                assert json.loads(answer.read())["models"] == {NULL: 2}
    finally:
        for connection in connections:
            connection.close()


@contextlib.contextmanager
def _gateway(url: str, shards: str):
    server = gatewayserver.Server(gatewayserver.settings(url, redis_shards=shards))
    try:
        yield server
    finally:
        server.stop()
