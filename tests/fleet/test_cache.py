"""The fleet's vector cache and in-round dedup, against a real redis-server and real (tiny and bundled) models."""

from __future__ import annotations

import json

import numpy as np
import pytest
import redis

from embedfleet.common.params import EMBED_DTYPES, PACKED_DTYPES
from embedfleet.common.protocol.keys import cache_key, result_key, worker_info_key
from embedfleet.common.redisserver import RedisServer
from embedfleet.common.errors import StartupError
from embedfleet.common.request import EmbedRequest
from embedfleet.common.result import Result
from embedfleet.producer.client.core import parse_worker_info
from tests.cachedengine import Cached
from tests.harness import burst
from tests.rqjobs import enqueue
from tests.tinymodels import engine_for, sample_texts
from embedfleet.worker.serving.cache import VectorCache, check_placement
from embedfleet.worker.engine.engine import Engine
from embedfleet.worker.engine.identity import folder_digest, model_identity
from embedfleet.worker.serving.steps import Steps


def cached_engine(folder: str, connection, name: str = "m") -> Cached:
    """A fresh Engine (own counters) over the folder's loaded model, with a cache on `connection`."""
    model = engine_for(folder).model
    identity = model_identity(name, folder_digest(folder), "float32", "cpu")
    return Cached(Engine(model), VectorCache(connection, identity, model.caps.embedding_size))


def run(engine: Engine | Steps, *requests: EmbedRequest) -> list[Result]:
    results = engine.run(list(requests))
    for result in results:
        result.raise_for_error()
    return results


def request(inputs, cache: bool = True, **params) -> EmbedRequest:
    return EmbedRequest(model="m", inputs=list(inputs), params=params, cache=cache)


def test_worker_repeat_runs_no_forward_pass_and_is_byte_identical(minilm_path, minilm_engine, redis_client):
    """The real worker on all-MiniLM-L6-v2: the second time the same texts come, the model does not run."""
    identity = model_identity("minilm", folder_digest(minilm_path), "float32", "cpu")
    engine = Cached(Engine(minilm_engine.model), VectorCache(redis_client, identity, 384))
    texts = sample_texts(12, seed=3)
    first = EmbedRequest(model="minilm", inputs=texts)
    enqueue(redis_client, first)
    assert burst(engine.worker(redis_client))
    passes, rows = engine.forward_passes, engine.forward_rows
    assert rows == len(set(texts)) and engine.cache.misses == len(texts) and engine.cache.hits == 0

    again = [EmbedRequest(model="minilm", inputs=texts), EmbedRequest(model="minilm", inputs=texts[::-1])]
    for req in again:
        enqueue(redis_client, req)
    worker = engine.worker(redis_client)
    assert burst(worker)

    assert (engine.forward_passes, engine.forward_rows) == (passes, rows)  # no forward pass at all
    assert engine.cache.hits == 2 * len(texts)
    stored = Result.decode(redis_client.get(result_key(first.id)))
    repeat = Result.decode(redis_client.get(result_key(again[0].id)))
    reversed_ = Result.decode(redis_client.get(result_key(again[1].id)))
    assert repeat.ok and repeat.data == stored.data and repeat.usage == stored.usage
    assert np.array_equal(reversed_.embeddings, stored.embeddings[::-1])
    # the advert carries the counters `embedfleet status` shows
    worker.advertiser.advertise()
    info = parse_worker_info(worker.name, redis_client.get(worker_info_key(worker.name)))
    assert (info["cache_hits"], info["cache_misses"]) == (2 * len(texts), len(texts))


@pytest.mark.parametrize("embed_dtype", EMBED_DTYPES)
def test_hits_are_byte_identical_in_every_dtype_and_dimension(matryoshka_model, redis_client, embed_dtype):
    engine = cached_engine(matryoshka_model, redis_client)
    texts = sample_texts(6, seed=5)
    run(engine, request(texts))  # fills the cache (float32, full size)
    for dimensions in (None, 8, 16):
        rows = engine.forward_rows
        hit, fresh = run(engine, request(texts, embed_dtype=embed_dtype, dimensions=dimensions),
                         request(texts, cache=False, embed_dtype=embed_dtype, dimensions=dimensions))
        assert engine.forward_rows - rows == len(texts)  # the fresh request only
        assert hit.shape == fresh.shape and hit.embed_dtype == embed_dtype
        assert hit.data == fresh.data
        width = (dimensions or 32) // (8 if embed_dtype in PACKED_DTYPES else 1)
        assert hit.shape == (len(texts), width)


@pytest.mark.parametrize("change", [
    {"prompt_name": "passage"}, {"prompt": "search: "}, {"truncate_prompt_tokens": 6},
    {"add_special_tokens": False}])
def test_a_change_of_what_the_model_sees_misses(matryoshka_model, redis_client, change):
    engine = cached_engine(matryoshka_model, redis_client)
    texts = ["the quick brown fox jumps over the lazy dog", "river mountain coffee tea bread music"]
    run(engine, request(texts))
    rows = engine.forward_rows
    changed, = run(engine, request(texts, **change))
    assert engine.forward_rows - rows == len(texts)
    fresh, = run(engine, request(texts, cache=False, **change))
    assert changed.data == fresh.data


def test_another_model_misses(bert_mean, bert_cls, redis_client):
    """Same served name, other files: another identity, so nothing is shared."""
    texts = sample_texts(4, seed=7)
    first = cached_engine(bert_mean, redis_client, name="same-name")
    second = cached_engine(bert_cls, redis_client, name="same-name")
    assert first.cache.identity != second.cache.identity
    run(first, request(texts))
    run(second, request(texts))
    assert second.forward_rows == len(texts) and second.cache.hits == 0
    run(second, request(texts))
    assert second.forward_rows == len(texts) and second.cache.hits == len(texts)


def test_cache_false_bypasses_reads_and_writes(bert_mean, redis_client):
    engine = cached_engine(bert_mean, redis_client)
    texts = sample_texts(5, seed=9)
    run(engine, request(texts, cache=False))
    assert not redis_client.keys("embedfleet:cache:*")  # nothing written
    run(engine, request(texts))
    assert len(redis_client.keys("embedfleet:cache:*")) == len(set(texts))
    rows = engine.forward_rows
    run(engine, request(texts, cache=False))
    assert engine.forward_rows - rows == len(texts)  # computed again although cached
    assert (engine.cache.hits, engine.cache.misses) == (0, len(texts))  # bypassed inputs count as neither


def test_a_corrupt_entry_is_a_miss_and_is_rewritten(bert_mean, redis_client):
    engine = cached_engine(bert_mean, redis_client)
    texts = ["river mountain", "coffee tea"]
    reference, = run(engine, request(texts))
    prep = engine.model.tokenizer(texts)["input_ids"]
    bad = engine.cache.key(prep[0], 0)
    good = engine.cache.key(prep[1], 0)
    assert redis_client.exists(bad, good) == 2
    redis_client.set(bad, b"short")
    redis_client.set(good, np.full(32, np.nan, "<f4").tobytes())
    engine = cached_engine(bert_mean, redis_client)  # another worker: nothing of this in its memory
    again, = run(engine, request(texts))
    assert engine.forward_rows == 2 and engine.cache.invalid == 2
    assert again.data == reference.data
    assert len(redis_client.get(bad)) == 4 * 32


def test_duplicates_in_a_round_run_once_and_fill_every_row(bert_mean, redis_client):
    engine = Engine(engine_for(bert_mean).model)  # no cache: in-round dedup alone
    distinct = sample_texts(5, seed=11)
    many = [distinct[i % 5] for i in range(60)]
    results = run(engine, request(many), request(distinct[::-1]), request(many[:7], dimensions=None))
    assert engine.forward_rows == 5
    alone = {text: run(engine, request([text]))[0].embeddings[0] for text in distinct}
    for req, result in zip((many, distinct[::-1], many[:7]), results):
        assert result.shape == (len(req), 32) and result.usage.prompt_tokens > 0
        assert np.allclose(result.embeddings, np.stack([alone[t] for t in req]), atol=1e-5)


def test_a_duplicate_of_a_failing_row_fails_with_it_and_others_go_on(bert_mean, redis_client, monkeypatch):
    engine = Engine(engine_for(bert_mean).model)
    poison = "poisoned text"
    real_embed = engine.model.embed

    def embed(token_lists, prompt_lengths=None):
        if any(ids == engine.model.tokenizer(poison)["input_ids"] for ids in token_lists):
            raise RuntimeError("boom")
        return real_embed(token_lists, prompt_lengths)

    monkeypatch.setattr(engine.model, "embed", embed)
    results = engine.run([request([poison, "fine"]), request(["fine", poison]), request(["fine"])])
    assert [r.ok for r in results] == [False, False, True]
    assert results[1].error_code == "internal_error"


def test_a_cache_on_an_allkeys_redis_is_refused(tmp_path, redis_client):
    with RedisServer(tmp_path / "r") as server:
        queue = redis.Redis.from_url(server.url)
        queue.config_set("maxmemory-policy", "allkeys-lru")
        with pytest.raises(StartupError, match="allkeys-lru: when full it evicts any key, queued jobs"):
            check_placement(queue, None)
        with pytest.raises(StartupError, match="allkeys-lru"):  # another URL that reaches the same server
            check_placement(queue, redis.Redis.from_url(server.url))
        queue.config_set("maxmemory-policy", "volatile-lru")
        assert "results have one too" in check_placement(queue, None)
        queue.config_set("maxmemory-policy", "noeviction")
        assert check_placement(queue, None) == ""
        assert "noeviction" in check_placement(queue, redis_client)  # a separate cache that never evicts
        redis_client.config_set("maxmemory-policy", "allkeys-lru")
        try:
            assert check_placement(queue, redis_client) == ""  # an LRU Redis of its own: the right place
        finally:
            redis_client.config_set("maxmemory-policy", "noeviction")
        queue.close()


def test_writes_pause_when_the_redis_is_nearly_full(bert_mean, redis_client):
    engine = cached_engine(bert_mean, redis_client)
    used = int(redis_client.info("memory")["used_memory"])
    redis_client.config_set("maxmemory", str(int(used / 0.9)))  # 90% of it is in use: past the 80% bound
    try:
        run(engine, request(sample_texts(3, seed=13)))
        assert not redis_client.keys("embedfleet:cache:*")
    finally:
        redis_client.config_set("maxmemory", "0")


def test_a_dead_cache_costs_misses_not_requests(bert_mean, redis_client, tmp_path):
    with RedisServer(tmp_path / "gone") as server:
        gone = redis.Redis.from_url(server.url, socket_timeout=2)
    engine = Cached(Engine(engine_for(bert_mean).model),
                    VectorCache(gone, "x" * 32, engine_for(bert_mean).model.caps.embedding_size))
    result, = run(engine, request(["still served"]))
    assert result.ok and engine.forward_rows == 1 and engine.cache.misses == 1


def test_the_cache_key_names_the_model_and_the_input():
    assert cache_key("a" * 32, "b" * 32) == f"embedfleet:cache:{'a' * 32}:{'b' * 32}"
    cache = VectorCache(None, "a" * 32, 4)
    assert cache.key([1, 2, 3], 0) != cache.key([1, 2, 3], 1) != cache.key([1, 2], 0)
    assert cache.key([1, 2, 3], 0) == cache.key((1, 2, 3), 0)


def test_end_to_end_cache_flag_over_http_python_and_status(bert_mean, redis_url, redis_client, tmp_path):
    """A real `python -m embedfleet.worker` process (cache on by default), a real gateway and the Python producer:
    `cache: false` travels on every path, and `embedfleet status` shows the worker's counters."""
    import subprocess
    import sys
    import time

    import httpx

    from embedfleet import Producer
    from tests.commands import ROOT, advertised, clean_env, embedfleet, wait_for
    from tests.gatewayserver import Server, settings

    env = clean_env(tmp_path / "xdg")
    worker = subprocess.Popen([sys.executable, "-m", "embedfleet.worker", "--redis-url", redis_url, "--model",
                               bert_mean, "--served-model-name", "tiny", "--poll-timeout", "1", "--probe-seconds", "1"],
                              env={**env, "PYTHONPATH": str(ROOT)})
    gateway = Server(settings(redis_url))
    try:
        with Producer(redis_url) as producer, httpx.Client(base_url=gateway.url, timeout=60) as http:
            advertised(producer, "tiny", worker)
            texts = ["coffee tea bread", "river mountain"]
            first = producer.wait(producer.submit(texts, "tiny"), 60)
            # the worker writes a round's new vectors to the cache after it has published their answers
            wait_for(lambda: len(redis_client.keys("embedfleet:cache:*")) == 2, 30, "the two cache entries")
            bypass = producer.wait(producer.submit(["never cached"], "tiny", cache=False), 60)
            body = {"model": "tiny", "input": ["also never cached"], "cache": False}
            assert http.post("/v1/embeddings", json=body).status_code == 200
            assert http.post("/pooling", json=body).status_code == 200
            job = http.post("/v1/jobs", json=body)
            assert job.status_code == 202
            assert http.get(f"/v1/jobs/{job.json()['id']}", params={"wait": 30}).status_code == 200
            assert len(redis_client.keys("embedfleet:cache:*")) == 2 and bypass.ok
            again = http.post("/v1/embeddings", json={"model": "tiny", "input": texts, "encoding_format": "base64"})
            assert again.status_code == 200
            assert producer.wait(producer.submit(texts, "tiny"), 60).data == first.data
            bad = http.post("/v1/embeddings", json={"model": "tiny", "input": "x", "cache": "sometimes"})
            assert bad.status_code == 400 and "cache" in bad.text
            deadline = time.monotonic() + 30  # the advert refreshes every HEARTBEAT_INTERVAL
            while True:
                out = json.loads(embedfleet("status", "--json", "--redis-url", redis_url, env=env).stdout)
                if [(w.get("cache_hits"), w.get("cache_misses")) for w in out["workers"]] == [(4, 2)]:
                    break
                assert time.monotonic() < deadline, out
                time.sleep(1)
            assert [model["cache_hit_rate"] for model in out["models"]] == [round(4 / 6, 4)]
            assert "67%" in embedfleet("status", "--wide", "--redis-url", redis_url, env=env).stdout  # cache hits
            metrics = http.get("/metrics").text
            assert 'embedfleet_cache_inputs{model="tiny",outcome="hit"} 4.0' in metrics
            assert 'embedfleet_cache_inputs{model="tiny",outcome="miss"} 2.0' in metrics
    finally:
        gateway.stop()
        worker.terminate()
        worker.wait(30)


def test_the_worker_refuses_to_start_with_its_cache_on_an_allkeys_queue_redis(bert_mean, tmp_path):
    import subprocess
    import sys

    from tests.commands import ROOT, assert_one_line_error, clean_env

    with RedisServer(tmp_path / "lru") as server:
        redis.Redis.from_url(server.url).config_set("maxmemory-policy", "allkeys-lru")
        command = [sys.executable, "-m", "embedfleet.worker", "--redis-url", server.url, "--model", bert_mean,
                   "--burst"]
        env = {**clean_env(tmp_path / "xdg"), "PYTHONPATH": str(ROOT)}
        done = subprocess.run(command, capture_output=True, text=True, timeout=120, env=env)
        assert_one_line_error(done, 1, "maxmemory-policy is allkeys-lru", "queued jobs and results included",
                              "--cache-url", "--no-cache")
        done = subprocess.run([*command, "--no-cache", "--probe-seconds", "1"], capture_output=True, text=True,
                              timeout=120, env=env)
        assert done.returncode == 0, done.stderr  # without a cache it serves (an empty queue: burst ends)


def test_the_worker_dedups_a_request_full_of_duplicates(bert_mean, redis_client):
    engine = cached_engine(bert_mean, redis_client)
    distinct = sample_texts(4, seed=17)
    request_ = EmbedRequest(model=engine.caps.name, inputs=[distinct[i % 4] for i in range(40)], cache=False)
    enqueue(redis_client, request_)
    assert burst(engine.worker(redis_client))
    result = Result.decode(redis_client.get(result_key(request_.id)))
    assert engine.forward_rows == 4 and result.ok and result.shape == (40, 32)
    assert all((result.embeddings[i] == result.embeddings[i % 4]).all() for i in range(40))
