"""Every Redis key the fleet writes is one that common/protocol/keys.py describes: a full scenario (enqueue
from the sync and the async client, a gateway job's options, serve with the vector cache and in-flight dedup,
cancel, a long request spread and joined, a dead worker's jobs recovered) runs against a redis-server of its
own with keyspace notifications on, and each key written is matched against the patterns of keys.py's
docstring."""

from __future__ import annotations

import asyncio

import pytest
import redis

from embedfleet.common.protocol import answering, claims, keys
from embedfleet.common.redisserver import RedisServer
from embedfleet import AsyncProducer, Producer
from tests.harness import idle_worker, serve
from tests.keyspace import KeyRecorder, documented_patterns

MAX_LEN = 32


@pytest.fixture(scope="module")
def long_folder(tmp_path_factory):
    from tests.tinymodels import save_tiny_bert, wrap_sentence_transformers

    return wrap_sentence_transformers(save_tiny_bert(str(tmp_path_factory.mktemp("keyspace"))), "mean",
                                      normalize=True, max_seq_length=MAX_LEN)


def test_every_key_written_in_a_full_scenario_is_described_in_keys_py(long_folder):
    from tests.tinymodels import WORDS
    from embedfleet.worker.engine.engine import Engine
    from embedfleet.worker.engine.models.loader import load_model

    with RedisServer() as server:
        recorder = KeyRecorder(server.url)
        conn = redis.Redis.from_url(server.url)
        model = load_model(long_folder, served_name="m", max_embed_len=8 * MAX_LEN)
        # the vector cache and in-flight dedup as the settings make them (on); requests queue up before it serves
        worker = idle_worker(Engine(model), conn, max_jobs=64, lease_seconds=1.0, chunks_per_job=2)
        long_text = " ".join(WORDS[i % len(WORDS)] for i in range(7 * MAX_LEN))
        with Producer(server.url) as producer:
            cancelled = producer.submit(["never served"], "m")
            assert producer.cancel(cancelled)
            # a worker that dies holding a round: its claims lapse and the live worker requeues them
            dead = claims.RqSchema(conn, keys.queue_name("m"), "dead-worker", result_ttl=60, lease=0.2)
            lost = producer.submit_many([["lost one"], ["lost two"]], "m")
            assert {t.id for t in dead.take(8, None)[1]} == set(lost)
            ids = producer.submit_many([["same text"], ["same text"], [long_text]], "m")
            bulk = producer.submit(["later"], "m", priority="bulk")

            async def async_side():
                async with AsyncProducer(server.url) as aproducer:
                    request_id = await aproducer.submit(["from asyncio"], "m")
                    await answering.save_job_options(aproducer.redis, request_id, "{}")
                    return await aproducer.wait(request_id, timeout=60)

            with serve(worker):
                assert asyncio.run(async_side()).ok
                for request_id in [*ids, *lost, bulk]:
                    assert producer.wait(request_id, timeout=60).ok
                assert worker.upkeep.recovered == 2
        conn.close()
        written = recorder.stop()

    patterns = documented_patterns()
    assert len(patterns) > 20, "the docstring's layout was not read"
    undocumented = sorted(key for key in written if key != "sentinel" and not any(p.fullmatch(key) for p in patterns))
    assert not undocumented, f"keys written but not described in common/protocol/keys.py: {undocumented}"
    for expected in ("embedfleet:chunks:", "embedfleet:inflight:", "embedfleet:cache:", "rq:canceled:",
                     "embedfleet:job:", "embedfleet:replies:"):
        assert any(key.startswith(expected) for key in written), f"the scenario wrote no {expected} key"
