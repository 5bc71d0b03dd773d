"""One request that cannot be encoded among many good ones, concurrent: it fails alone, with a 400 /
`invalid_request`, and every good one is answered (issue #19: a `chunk_spans` end of 2**64 used to raise
msgpack's OverflowError inside the coalesced enqueue round and fail every caller of that round)."""

from __future__ import annotations

import asyncio

import httpx
import pytest
import redis.asyncio as aioredis

from embedfleet.common.errors import ValidationError
from embedfleet.common.params import PoolingParams
from embedfleet.common.request import EmbedRequest
from embedfleet import AsyncProducer
from embedfleet.producer.client.asubmit import Submitter
from tests.gatewayserver import Server, settings
from tests.nullworker import NULL, null_worker

GOOD = 80
BAD_SPANS = [[0, 2**64]]  # one past what msgpack packs


@pytest.fixture
def worker(redis_url):
    with null_worker(redis_url) as serving:
        serving.serve()
        yield serving


def test_gateway_answers_80_good_requests_and_refuses_the_one_bad(redis_url, worker):
    server = Server(settings(redis_url))

    async def main():
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
            good = [client.post("/v1/embeddings", json={"model": NULL, "input": f"text {i}"}) for i in range(GOOD)]
            bad = client.post("/v1/embeddings", json={"model": NULL, "input": "a text", "chunk_spans": BAD_SPANS})
            return await asyncio.gather(*good[:GOOD // 2], bad, *good[GOOD // 2:])

    try:
        answers = asyncio.run(main())
    finally:
        server.stop()
    refused = answers.pop(GOOD // 2)
    assert [a.status_code for a in answers] == [200] * GOOD, [a.text for a in answers if a.status_code != 200][:3]
    assert all(len(a.json()["data"]) == 1 for a in answers)
    assert refused.status_code == 400, refused.text
    error = refused.json()["error"]
    assert (error["code"], error["param"]) == ("invalid_request", "chunk_spans")
    assert "18446744073709551616" in error["message"] and "<= 2147483647" in error["message"]


def test_async_producer_answers_80_good_submits_and_refuses_the_one_bad(redis_url, worker):
    async def main():
        async with AsyncProducer(redis_url) as producer:
            async def good(i):
                return await producer.wait(await producer.submit([f"text {i}"], NULL), 60)

            bad = producer.submit(["a text"], NULL, chunk_spans=BAD_SPANS)
            return await asyncio.gather(*map(good, range(GOOD // 2)), bad, *map(good, range(GOOD // 2, GOOD)),
                                        return_exceptions=True)

    outcomes = asyncio.run(main())
    refused = outcomes.pop(GOOD // 2)
    assert all(not isinstance(o, BaseException) and o.ok for o in outcomes), \
        [o for o in outcomes if isinstance(o, BaseException)][:3]
    assert isinstance(refused, ValidationError), repr(refused)
    assert (refused.code, refused.param) == ("invalid_request", "chunk_spans")


def test_the_submitter_fails_only_the_caller_whose_request_cannot_be_encoded(redis_url, worker):
    """The coalesced enqueue on its own, past every validation: a request built without it (model_construct)
    holds a value msgpack cannot carry, and is submitted together with 80 good ones."""
    unencodable = EmbedRequest.model_construct(model=NULL, inputs=["a text"],
                                               params=PoolingParams.model_construct(chunk_spans=((0, 2**64),)))
    good = [EmbedRequest(model=NULL, inputs=[f"text {i}"]) for i in range(GOOD)]

    async def main():
        connection = aioredis.Redis.from_url(redis_url)
        submitter = Submitter(connection, max_queue_depth=None)
        try:
            calls = [submitter.submit(NULL, [r]) for r in good[:GOOD // 2]] + [submitter.submit(NULL, [unencodable])] \
                + [submitter.submit(NULL, [r]) for r in good[GOOD // 2:]]
            outcomes = await asyncio.gather(*calls, return_exceptions=True)
            async with AsyncProducer(redis_url) as producer:
                results = await asyncio.gather(*(producer.wait(r.id, 60) for r in good))
            return outcomes, results
        finally:
            await submitter.close()
            await connection.aclose()

    outcomes, results = asyncio.run(main())
    refused = outcomes.pop(GOOD // 2)
    assert outcomes == [None] * GOOD
    assert isinstance(refused, ValidationError) and "cannot be encoded" in refused.message, repr(refused)
    assert all(result.ok for result in results)
