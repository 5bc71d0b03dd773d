"""The fleet's real processes on one redis+cluster:// URL (issue 39): a worker and a gateway started by the
CLI against a real three-master cluster (tests/rediscluster.py), answering /v1/embeddings, and `embedfleet
status` reading the model's tagged queues there."""

from __future__ import annotations

import json

from embedfleet.common.names import slot_tag
from embedfleet.common.protocol import keys
from embedfleet.common.redisserver import free_port
from tests.commands import clean_env, embedfleet
from tests.secureredis import embedfleet_process, post_embeddings, stop, wait_healthy

MODEL = "clustered"


def test_a_worker_gateway_and_status_run_on_a_cluster_url(cluster_url, tmp_path):
    worker = embedfleet_process("worker", "--redis-url", cluster_url, "--model", "null:8", "--served-model-name",
                                MODEL, env=clean_env(tmp_path))
    port = free_port()
    gateway = embedfleet_process("gateway", "--port", str(port), env=clean_env(tmp_path,
                                                                               EMBEDFLEET_REDIS_URL=cluster_url))
    try:
        health = wait_healthy(f"http://127.0.0.1:{port}", [worker, gateway])
        assert health["models"] == {MODEL: 1}
        answer = post_embeddings(f"http://127.0.0.1:{port}", MODEL, "through a cluster")
        assert len(answer["data"][0]["embedding"]) == 8
        status = embedfleet("status", "--redis-url", cluster_url, "--json", env=clean_env(tmp_path))
        assert status.returncode == 0, status.stderr
    finally:
        gateway_log, worker_log = stop(gateway), stop(worker)
    assert "Traceback" not in worker_log + gateway_log, (worker_log + gateway_log)[-3000:]
    (model,) = [m for m in json.loads(status.stdout)["models"] if m["name"] == MODEL]
    assert model["queues"][0]["queue"] == keys.queue_name(MODEL, tag=slot_tag(MODEL))


def test_failed_on_a_cluster_none_of_whose_nodes_answers_says_so_in_one_line(tmp_path):
    """`embedfleet failed` works on a cluster (tests/fleet/test_cluster_failed.py); one that does not answer is
    unreachable, in one line."""
    from tests.commands import assert_one_line_error

    done = embedfleet("failed", "list", "--redis-url", "redis+cluster://127.0.0.1:1", env=clean_env(tmp_path))
    assert_one_line_error(done, 1, "Redis is unreachable")
