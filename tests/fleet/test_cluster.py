"""The whole path on a real Redis Cluster of three masters (tests/rediscluster.py, issue 39): a worker and the
clients (Producer, AsyncProducer, the gateway) on one redis+cluster:// URL answer with the vectors one plain
Redis gives; every key of a model lies
in its hash tag's slot (common/protocol/keys.py), and models with distinct tags spread over the masters."""

from __future__ import annotations

import asyncio
import contextlib
import socket

import numpy as np
import openai
import pytest

from embedfleet.common.names import slot_tag, tag_of
from embedfleet.common.protocol import keys
from embedfleet.common.redisclient import connect
from embedfleet.common.redisurls import cluster_tag
from embedfleet import AsyncProducer, Producer
from tests import gatewayserver
from tests.clusterchecks import TEXTS, cosines, keys_by_master
from tests.crashworker import CrashModel
from tests.harness import Fleet, serve
from tests.hashed import HASHED_INFO, MODEL, hashed_model

@pytest.fixture(scope="module")
def expected(minilm_engine, redis_server) -> np.ndarray:
    """The vectors of TEXTS through one plain Redis (the session's, flushed)."""
    with Fleet(redis_server.url, flush=True) as plain:
        plain.serve(minilm_engine)
        return plain.producer.embed(TEXTS, "minilm")


async def _async_answers(url: str) -> tuple[str, np.ndarray, np.ndarray]:
    async with AsyncProducer(url) as producer:
        request_id = await producer.submit(TEXTS, "minilm")
        waited = (await producer.wait(request_id, timeout=60)).embeddings
        return request_id, waited, await producer.embed(TEXTS, "minilm")


def test_every_client_on_a_cluster_gives_one_plain_redis_vectors(minilm_engine, expected, cluster_url,
                                                                  redis_cluster):
    """The sync Producer (submit + wait, and embed's one-round-trip path), the AsyncProducer, and the gateway
    through the `openai` client, all on one redis+cluster:// URL with one worker on it."""
    connection = connect(cluster_url)
    gateway = None
    try:
        with serve(minilm_engine, connection), Producer(cluster_url) as producer:
            request_id = producer.submit(TEXTS, "minilm")
            answers = {"sync wait": producer.wait(request_id, timeout=60).embeddings,
                       "sync embed": producer.embed(TEXTS, "minilm")}
            async_id, answers["async wait"], answers["async embed"] = asyncio.run(_async_answers(cluster_url))
            gateway = gatewayserver.Server(gatewayserver.settings(cluster_url))
            with openai.OpenAI(base_url=gateway.url + "/v1", api_key="unused", max_retries=0) as client:
                reply = client.embeddings.create(model="minilm", input=TEXTS)
            answers["gateway"] = np.array([row.embedding for row in reply.data])
    finally:
        if gateway is not None:
            gateway.stop()
        connection.close()
    for path, got in answers.items():
        assert got.shape == expected.shape, path
        assert cosines(got, expected).min() >= 0.99999, path
    tag = slot_tag("minilm")
    assert tag_of(request_id) == tag and tag_of(async_id) == tag, "ids on a cluster carry the tag"
    # every key of the model's queues and requests lies on one master, in the tag's slot
    tagged = {port: [k for k in found if tag.encode() in k] for port, found in keys_by_master(redis_cluster).items()}
    holders = [port for port, found in tagged.items() if found]
    assert len(holders) == 1, f"the keys of tag {tag} lie on {len(holders)} masters: {tagged}"
    assert {keys.result_key(request_id).encode(), keys.result_key(async_id).encode(),
            keys.notify_key(request_id).encode()} <= set(tagged[holders[0]])


def _names_on_each_master(cluster_client, count: int) -> list[str]:
    """`count` model names whose hash tags lie on `count` distinct masters."""
    chosen: dict[str, str] = {}
    for index in range(1000):
        name = f"spread{index}"
        node = cluster_client.get_node_from_key(slot_tag(name)).name
        chosen.setdefault(node, name)
        if len(chosen) == count:
            return list(chosen.values())
    raise AssertionError("no names found on every master")


CONCURRENT = 60  # requests in flight per model: more than the async client's connections per node


async def _many(url: str, names: list[str]) -> dict[str, list]:
    """CONCURRENT two-text requests per model at once through one AsyncProducer: (id, shape) per request."""
    async with AsyncProducer(url) as producer:
        async def one(name: str, index: int) -> tuple[str, tuple]:
            request_id = await producer.submit([f"a text {index}", "another"], name)
            return request_id, (await producer.wait(request_id, timeout=60)).embeddings.shape

        found = await asyncio.gather(*(one(name, i) for name in names for i in range(CONCURRENT)))
    return {name: found[k * CONCURRENT:(k + 1) * CONCURRENT] for k, name in enumerate(names)}


def test_models_with_distinct_tags_put_their_traffic_on_distinct_masters(cluster_url, redis_cluster):
    """Three models whose tags lie on three masters, their requests in flight together through one
    AsyncProducer (a link per tag, the command connections shared): each master holds its model's results."""
    from embedfleet.worker.engine.engine import Engine

    connection = connect(cluster_url)
    names = _names_on_each_master(connection, 3)
    info = {**HASHED_INFO, "host": socket.gethostname()}
    try:
        with serve(Engine(CrashModel(names[0])), connection, info=info), \
                serve(Engine(CrashModel(names[1])), connection, info=info), \
                serve(Engine(CrashModel(names[2])), connection, info=info):
            answers = asyncio.run(_many(cluster_url, names))
    finally:
        connection.close()
    assert {shape for found in answers.values() for _, shape in found} == {(2, 8)}
    holders = {port: {k for k in found if k.startswith(keys.RESULT_PREFIX.encode())}
               for port, found in keys_by_master(redis_cluster).items()}
    for name, found in answers.items():
        on = {port for port, keys_ in holders.items() for request_id, _ in found
              if keys.result_key(request_id).encode() in keys_}
        assert len(on) == 1, f"{name}'s results lie on {on}"
    assert all(holders.values()), f"every master holds results of its model: {holders}"


@pytest.mark.parametrize("request_id", ["plain-id", "{x}"])
def test_a_chosen_id_without_its_models_tag_is_refused_on_a_cluster(request_id, cluster_url):
    from embedfleet.common.errors import ValidationError
    from embedfleet.producer.client.core import tagged_ids

    with pytest.raises(ValidationError, match="hash tag"):
        tagged_ids([request_id], slot_tag("minilm"))


def test_queue_depths_and_the_fleet_view_read_a_clusters_tagged_queues(cluster_url):
    """What `status`, autoscaling and the producer read of a queue (its depth, its rows in the fleet view)
    reads the tagged queue on a cluster: requests that wait behind a slow worker are counted."""
    from embedfleet.worker.engine.engine import Engine

    connection = connect(cluster_url)
    engine = Engine(hashed_model(0.2), max_batch_tokens=64, max_batch_size=64)
    try:
        with serve(engine, connection, info={**HASHED_INFO, "host": socket.gethostname()}, max_jobs=1), \
                Producer(cluster_url) as producer:
            ids = [producer.submit([f"text {i}"], MODEL) for i in range(12)]
            depth, stats, view = producer.queue_depth(MODEL), producer.level_stats(MODEL), producer.fleet()
            answers = [producer.wait(request_id, timeout=60) for request_id in ids]
    finally:
        connection.close()
    assert depth > 0 and stats[0].depth > 0
    (model,) = [m for m in view["models"] if m["name"] == MODEL]
    interactive = model["queues"][0]
    assert interactive["queue"] == keys.queue_name(MODEL, tag=slot_tag(MODEL)) and interactive["depth"] > 0
    assert len(answers) == 12


def test_the_vector_cache_and_in_flight_dedup_work_on_a_cluster(minilm_path, minilm_engine, expected, cluster_url,
                                                                caplog):
    """A worker with the fleet's cache on the cluster (its vectors in many slots, read per slot) and in-flight
    dedup (its markers in the requests' slot): the second time the same texts come, no forward pass runs."""
    from tests.cachedengine import Cached
    from embedfleet.worker.engine.engine import Engine
    from embedfleet.worker.engine.identity import folder_digest, model_identity
    from embedfleet.worker.serving.cache import VectorCache, check_placement

    connection = connect(cluster_url)
    identity = model_identity("minilm", folder_digest(minilm_path), "float32", "cpu")
    engine = Cached(Engine(minilm_engine.model), VectorCache(connection, identity, 384))
    try:
        assert check_placement(connection, None) == ""  # the cluster's masters evict nothing
        with serve(engine.worker(connection)), Producer(cluster_url) as producer:
            first = producer.embed(TEXTS, "minilm")
            passes = engine.forward_passes
            again = producer.embed(TEXTS, "minilm")
    finally:
        connection.close()
    assert engine.forward_passes == passes and engine.cache.hits == len(TEXTS)
    assert cosines(first, expected).min() >= 0.99999 and np.array_equal(again, first)
    assert not [r for r in caplog.records if "in-flight dedup skipped" in r.getMessage()]  # its script ran


def _partitions_on_each_master(cluster_client, model: str, count: int) -> list[str]:
    """`count` partition names of `model` whose tags lie on `count` distinct masters."""
    chosen: dict[str, str] = {}
    for index in range(1000):
        chosen.setdefault(cluster_client.get_node_from_key(slot_tag(model, f"p{index}")).name, f"p{index}")
        if len(chosen) == count:
            return list(chosen.values())
    raise AssertionError("no partition names found on every master")


async def _partitioned_async(url: str, partitions: list[str]) -> list[str]:
    """Six requests through an AsyncProducer given the partition map, each answered; their ids."""
    async with AsyncProducer(url, shards={"parted": partitions}) as producer:
        ids = [await producer.submit([f"async text {i}"], "parted") for i in range(6)]
        for request_id in ids:
            assert (await producer.wait(request_id, timeout=60)).embeddings.shape == (1, 8)
    return ids


def test_a_models_partitions_on_one_cluster_put_its_traffic_on_every_master(cluster_url, redis_cluster):
    """One model, three partitions on one cluster (its URL with #<partition>: a tag, so a slot, each) in the
    partition map (common/shards.py): a worker per partition URL, a Producer and an AsyncProducer placing round
    robin; its results lie on all 3 masters, each partition's on one."""
    from embedfleet.worker.engine.engine import Engine

    seed = connect(cluster_url)
    urls = [f"{cluster_url}#{name}" for name in _partitions_on_each_master(seed, "parted", 3)]
    seed.close()
    connections = [connect(url) for url in urls]
    info = {**HASHED_INFO, "host": socket.gethostname()}
    try:
        with contextlib.ExitStack() as stack:
            for connection in connections:
                stack.enter_context(serve(Engine(CrashModel("parted")), connection, info=info))
            with Producer(cluster_url, shards={"parted": urls}) as producer:
                ids = [producer.submit([f"text {i}"], "parted") for i in range(12)]
                assert all(producer.wait(i, timeout=60).embeddings.shape == (1, 8) for i in ids)
            ids += asyncio.run(_partitioned_async(cluster_url, urls))
    finally:
        for connection in connections:
            connection.close()
    holders = {port: {k for k in found if k.startswith(keys.RESULT_PREFIX.encode())}
               for port, found in keys_by_master(redis_cluster).items()}
    tags = {tag_of(i) for i in ids}
    assert tags == {cluster_tag(url, "parted") for url in urls}, "placed on every partition"
    on = {tag: {port for port, found in holders.items() for i in ids
                if tag_of(i) == tag and keys.result_key(i).encode() in found} for tag in tags}
    assert all(len(ports) == 1 for ports in on.values()), on
    assert len({port for ports in on.values() for port in ports}) == 3, f"the partitions' masters: {on}"
