"""OpenAI's Batch API on a real Redis Cluster of three masters (tests/rediscluster.py, issue 39), through the real
`openai` client against a gateway whose --redis-url is the cluster: a JSONL file uploaded, a batch created and
run, its output file downloaded with the vectors one plain Redis gives; a cancel cancels what is queued. A
file's and a batch's keys each lie in one slot of their own (batchkeys.own_tag), a line's request id carries its
model's hash tag (its queue's slot)."""

from __future__ import annotations

import asyncio

import numpy as np
import openai
import pytest

from embedfleet.common.names import slot_tag, tag_of
from embedfleet.common.protocol import batchkeys, keys, rqkeys
from embedfleet.common.redisclient import connect, connect_async
from embedfleet.common.redisserver import free_port
from embedfleet.producer.gateway.batches.store import Store, now
from tests import gatewayserver
from tests.commands import clean_env
from tests.batchapi import GatewayProcess, batch_file, lapsed_lease, output_lines, run_batch, wait_status
from tests.clusterchecks import TEXTS, cosines, keys_by_master
from tests.harness import Fleet, serve
from tests.tinymodels import sample_texts
from embedfleet.worker.engine.engine import Engine
from embedfleet.worker.engine.models.loader import load_model

MODEL = "minilm"
TINY = "tiny"


@pytest.fixture(scope="module")
def expected(minilm_engine, redis_server) -> np.ndarray:
    """The vectors of TEXTS through one plain Redis (the session's, flushed)."""
    with Fleet(redis_server.url, flush=True) as plain:
        plain.serve(minilm_engine)
        return plain.producer.embed(TEXTS, MODEL)


@pytest.fixture
def cluster_client(cluster_url):
    """A gateway on the cluster URL (batches looked for every 0.2 s) and an `openai` client of it."""
    gateway = gatewayserver.Server(gatewayserver.settings(cluster_url, batch_in_flight=8, batch_poll_seconds=0.2))
    try:
        with openai.OpenAI(base_url=gateway.url + "/v1", api_key="unused", max_retries=0) as client:
            yield client
    finally:
        gateway.stop()


def test_a_batch_on_a_cluster_gives_one_plain_redis_vectors(minilm_engine, expected, cluster_url, redis_cluster,
                                                             cluster_client):
    connection = connect(cluster_url)
    try:
        with serve(minilm_engine, connection):
            batch = run_batch(cluster_client, batch_file([{"model": MODEL, "input": text} for text in TEXTS]))
            done = wait_status(cluster_client, batch.id, ("completed", "failed", "expired", "cancelled"), timeout=120)
            out = output_lines(cluster_client, done.output_file_id)
    finally:
        connection.close()
    assert done.status == "completed" and done.request_counts.completed == len(TEXTS), done
    assert done.error_file_id is None
    got = np.array([line["response"]["body"]["data"][0]["embedding"]
                    for line in sorted(out, key=lambda line: int(line["custom_id"].split("-")[1]))])
    assert got.shape == expected.shape and cosines(got, expected).min() >= 0.99999
    tag = slot_tag(MODEL)
    assert all(tag_of(line["response"]["request_id"]) == tag for line in out), out[0]
    assert all(not tag_of(line["id"]) and line["id"].startswith("batch_req_") for line in out)
    # the batch's and the output file's keys each lie on one master, in their own slot
    found = keys_by_master(redis_cluster)
    for own in (batchkeys.own_tag(i, True) for i in (batch.id, done.output_file_id, batch.input_file_id)):
        holders = [port for port, names in found.items() if any(own.encode() in name for name in names)]
        assert len(holders) == 1, f"the keys of {own} lie on {holders}"
    assert cluster_client.files.retrieve(done.output_file_id).bytes > 0
    assert batch.id in [b.id for b in cluster_client.batches.list(limit=100)]
    cluster_client.files.delete(batch.input_file_id)
    assert batch.input_file_id not in [f.id for f in cluster_client.files.list()]


def test_a_cancel_on_a_cluster_cancels_what_is_queued(minilm_engine, cluster_url, cluster_client):
    bodies = [{"model": MODEL, "input": f"line {i} of a batch cancelled on a cluster"} for i in range(400)]
    connection = connect(cluster_url)
    try:
        with serve(minilm_engine, connection):
            batch = run_batch(cluster_client, batch_file(bodies))
            wait_status(cluster_client, batch.id, ("completed",), timeout=120,
                        until=lambda b: b.request_counts.completed >= 5)
        # the worker stopped: what is queued now stays queued until the cancel
        cancelling = cluster_client.batches.cancel(batch.id)
        assert cancelling.status in ("cancelling", "cancelled")
        done = wait_status(cluster_client, batch.id, ("cancelled",))
        out, errors = output_lines(cluster_client, done.output_file_id), output_lines(cluster_client,
                                                                                      done.error_file_id)
        queues = connection.llen(rqkeys.rq_queue_key(keys.queue_name(MODEL, "bulk", slot_tag(MODEL))))
    finally:
        connection.close()
    counts = done.request_counts
    assert counts.total == 400 and counts.completed >= 5 and counts.failed >= 1
    assert counts.completed + counts.failed == 400
    assert len(out) == counts.completed and len(errors) == counts.failed
    assert all(line["response"]["status_code"] == 200 for line in out)
    assert {line["error"]["code"] for line in errors} == {"batch_cancelled"}
    assert queues == 0  # the queued lines were cancelled (their tagged ids found in the model's slot)


def test_a_lapsed_lease_writes_nothing_on_a_cluster(cluster_url, redis_cluster):
    """The lease fences a replica that lost it, and an ended batch leaves the active index, with each object's
    keys in its own slot (the scripts and transactions there would fail CROSSSLOT otherwise); a batch made from a
    file that is gone is refused and leaves no input copy."""
    async def scenario():
        connection = connect_async(cluster_url)
        store = Store(connection, clustered=True)
        try:
            await lapsed_lease(store)
            meta = {"id": "batch_gone_input", "created_at": now(), "expires_at": now() + 60,
                    "input_file_id": "file-gone"}
            assert not await store.create_batch(meta)
            assert not await connection.exists(store.input_key("batch_gone_input"), store.batch_key("batch_gone_input"))
        finally:
            await connection.aclose()

    asyncio.run(scenario())


def test_a_gateway_killed_mid_batch_on_a_cluster_loses_nothing_and_runs_nothing_twice(tmp_path, bert_mean,
                                                                                        cluster_url):
    """test_batch_api's kill test on the cluster: the gateway process is killed mid-batch, a new one takes the
    batch over (lease, then the same tagged line ids: its submits of lines already queued are refused as
    duplicates) and every line runs exactly once."""
    tag = slot_tag(TINY)
    connection = connect(cluster_url)
    port, env, log = free_port(), clean_env(tmp_path / "cache"), tmp_path / "gateway.log"
    bodies = [{"model": TINY, "input": text} for text in sample_texts(600, seed=11)]
    gateway = None
    try:
        with serve(Engine(load_model(bert_mean, served_name=TINY)), connection, rq_records="full"):
            gateway = GatewayProcess(cluster_url, port, log, env)
            with openai.OpenAI(base_url=gateway.url + "/v1", api_key="unused", max_retries=3) as client:
                batch = run_batch(client, batch_file(bodies))
                wait_status(client, batch.id, ("completed",), until=lambda b: b.request_counts.completed >= 50)
                gateway.kill()
                held = connection.hgetall(batchkeys.batch_key(batch.id, True))
                assert held[b"status"] == b"in_progress", held
                collected = int(held[b"completed"]) + int(held[b"failed"])
                submitted = sum(connection.exists(rqkeys.rq_job_key(tag + batchkeys.batch_line_request_id(batch.id, i)))
                                for i in range(600))
                assert submitted > collected, (submitted, collected)  # lines in flight died with the gateway
                gateway = GatewayProcess(cluster_url, port, log, env)
                done = wait_status(client, batch.id, ("completed", "failed", "expired"), timeout=120)
                out = output_lines(client, done.output_file_id)
        assert done.status == "completed", done
        assert done.request_counts.model_dump() == {"total": 600, "completed": 600, "failed": 0}
        assert "of 600 lines to run" in log.read_text()  # the restarted gateway took the batch over
        assert [line["custom_id"] for line in out] == [f"req-{i}" for i in range(600)]
        ids = [tag + batchkeys.batch_line_request_id(batch.id, i) for i in range(600)]
        assert [line["response"]["request_id"] for line in out] == ids
        finished = rqkeys.rq_finished_key(keys.queue_name(TINY, "bulk", tag))
        assert {m.decode() for m in connection.zrange(finished, 0, -1)} >= set(ids)
        assert {connection.hget(rqkeys.rq_job_key(i), "deliveries") for i in ids} == {b"1"}  # each ran once
    finally:
        if gateway is not None:
            gateway.stop()
        connection.close()
