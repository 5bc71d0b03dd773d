"""OpenAI's Batch API on the fleet, through the real `openai` client: files and batches end to end against a
live uvicorn gateway and BatchWorker threads on a tiny random BERT, a real redis-server; bad lines, invalid
files, cancel, expiry, ownership; and a 2,000-line batch whose gateway (a real `python -m embedfleet.producer.gateway`
process) is SIGKILLed mid-batch and restarted: every line answered once, byte for byte the route's answer."""

from __future__ import annotations

import asyncio
import json
import uuid

import httpx
import openai
import pytest
import redis
import redis.asyncio as aioredis
from rq.suspension import resume, suspend

from embedfleet.common.errors import DuplicateRequestError, ValidationError
from embedfleet.common.protocol import batchkeys, keys, rqkeys
from embedfleet.common.redisserver import RedisServer, free_port
from embedfleet import AsyncProducer, Producer
from embedfleet.producer.gateway.batches import objects
from embedfleet.producer.gateway.batches.store import Store, now
from tests import gatewayserver
from tests.batchapi import GatewayProcess, batch_file, lapsed_lease, output_lines, raw_lines, run_batch, wait_status
from tests.commands import clean_env
from tests.harness import Fleet
from tests.keyspace import KeyRecorder, documented_patterns
from tests.tinymodels import sample_texts
from embedfleet.worker.engine.engine import Engine
from embedfleet.worker.engine.models.loader import load_model
from embedfleet.worker.serving.pipeline import BatchWorker

MODEL = "tiny"
BULK_QUEUE = keys.queue_name(MODEL, "bulk")


def serve_tiny(fleet: Fleet, folder: str) -> BatchWorker:
    """A tiny-BERT worker serving in `fleet`, with the fleet's vector cache on as `embedfleet worker` has it by
    default: a text is computed once, and answered from the cache after, whichever route asks. (Without it the
    same text in another forward pass, padded with other texts, may differ in float32's last bits, on either
    route: that is the model's arithmetic, not the answer's encoding, which is what is compared.) It keeps rq's
    full records (--rq-records full): the finished registry and each job's `deliveries` are how these tests see
    that every line ran exactly once."""
    return fleet.serve(Engine(load_model(folder, served_name=MODEL)), rq_records="full")


@pytest.fixture(scope="module")
def shared(redis_server, bert_mean):
    """One worker and one gateway for the module's tests (not flushed between them: each test's files and
    batches have ids of their own)."""
    with Fleet(redis_server.url, flush=True) as fleet:
        serve_tiny(fleet, bert_mean)
        server = fleet.gateway(max_file_bytes=300_000, max_body_bytes=50_000, batch_in_flight=8,
                               batch_poll_seconds=0.2)
        yield server, fleet.redis
        resume(fleet.redis)


@pytest.fixture
def gateway(shared):
    server, connection = shared
    resume(connection)
    return server


@pytest.fixture
def client(gateway):
    with openai.OpenAI(base_url=gateway.url + "/v1", api_key="unused", max_retries=0) as c:
        yield c


@pytest.fixture
def http(gateway):
    with httpx.Client(base_url=gateway.url, timeout=30) as c:
        yield c


def assert_same_bytes(raw_line: bytes, answer: httpx.Response) -> None:
    """The output line holds, byte for byte, the body `answer` (POST /v1/embeddings for the same request
    body) holds, but for the answer's own request id and time (`id`, `created`), which are the line's."""
    line, direct = json.loads(raw_line), answer.json()
    response, raw = line["response"], answer.content
    assert response["status_code"] == answer.status_code
    if answer.status_code == 200:
        assert response["body"]["id"] == response["request_id"]
        raw = raw.replace(b'{"id":%s,' % json.dumps(direct["id"]).encode(),
                          b'{"id":%s,' % json.dumps(response["request_id"]).encode(), 1)
        raw = raw.replace(b'"created":%d,' % direct["created"], b'"created":%d,' % response["body"]["created"], 1)
    assert raw_line.endswith(b',"body":' + raw + b'},"error":null}'), (raw_line, raw)


def same_answer(http: httpx.Client, raw_line: bytes, body: dict) -> None:
    assert_same_bytes(raw_line, http.post("/v1/embeddings", json=body))


# -- caller-chosen request ids (what makes a batch line's submit idempotent) ---------------------------------

def test_a_chosen_request_id_runs_once_and_is_refused_again(gateway, shared):
    _, connection = shared
    producer = Producer(gateway.redis_url)
    first = producer.submit(["chosen"], MODEL, request_id="my-own-id-1")
    assert first == "my-own-id-1"
    assert producer.wait(first, 30).embeddings.shape[0] == 1
    with pytest.raises(DuplicateRequestError):
        producer.submit(["chosen again"], MODEL, request_id="my-own-id-1")
    with pytest.raises(ValidationError, match="not valid"):
        producer.submit(["x"], MODEL, request_id="no spaces")
    with pytest.raises(ValidationError, match="repeat"):
        producer.submit_many([["a"], ["b"]], MODEL, request_ids=["same", "same"])
    assert connection.hget(rqkeys.rq_job_key(first), "deliveries") == b"1"

    async def again_async():
        async with AsyncProducer(gateway.redis_url) as aproducer:
            with pytest.raises(DuplicateRequestError):
                await aproducer.submit(["chosen"], MODEL, request_id=first)
            assert await aproducer.submit(["fresh"], MODEL, request_id="my-own-id-2") == "my-own-id-2"
            assert (await aproducer.wait("my-own-id-2", 30)).embeddings.shape[0] == 1

    asyncio.run(again_async())
    assert connection.hget(rqkeys.rq_job_key(first), "deliveries") == b"1"


# -- end to end -----------------------------------------------------------------------------------------------

def test_small_batch_end_to_end(client, http, shared):
    _, connection = shared
    bodies = [{"model": MODEL, "input": text} for text in sample_texts(6, seed=1)]
    bodies += [{"model": MODEL, "input": sample_texts(3, seed=2), "encoding_format": "base64"},
               {"model": MODEL, "input": "no options", "user": "someone"}]
    uploaded = client.files.create(file=("mine.jsonl", batch_file(bodies)), purpose="batch",
                                   extra_body={"expires_after": {"anchor": "created_at", "seconds": 3600}})
    assert uploaded.purpose == "batch" and uploaded.filename == "mine.jsonl"
    assert uploaded.expires_at == uploaded.created_at + 3600
    assert 3590 <= connection.ttl(batchkeys.file_key(uploaded.id)) <= 3600
    assert client.files.retrieve(uploaded.id) == uploaded
    assert uploaded.id in [f.id for f in client.files.list()]
    assert client.files.content(uploaded.id).content == batch_file(bodies)

    batch = client.batches.create(input_file_id=uploaded.id, endpoint="/v1/embeddings", completion_window="24h",
                                  metadata={"run": "e2e"})
    assert batch.metadata == {"run": "e2e"} and batch.expires_at == batch.created_at + 24 * 3600
    done = wait_status(client, batch.id, ("completed", "failed"))
    assert done.status == "completed", done
    assert done.request_counts.model_dump() == {"total": 8, "completed": 8, "failed": 0}
    assert done.error_file_id is None and done.model == MODEL
    assert done.in_progress_at and done.finalizing_at and done.completed_at
    assert done.usage.input_tokens > 0
    raw = raw_lines(client, done.output_file_id)
    lines = [json.loads(line) for line in raw]
    assert [line["custom_id"] for line in lines] == [f"req-{i}" for i in range(8)]
    for line, raw_line, body in zip(lines, raw, bodies):
        assert line["error"] is None and line["id"].startswith("batch_req_")
        same_answer(http, raw_line, body)
    output = client.files.retrieve(done.output_file_id)
    assert output.purpose == "batch_output" and output.bytes == len(client.files.content(output.id).content)
    assert batch.id in [b.id for b in client.batches.list(limit=100)]
    # the work keys went with the end; the lines ran at bulk priority
    assert not connection.exists(batchkeys.batch_lines_key(batch.id), batchkeys.batch_input_key(batch.id))
    assert connection.zscore(rqkeys.rq_finished_key(BULK_QUEUE), batchkeys.batch_line_request_id(batch.id, 0))
    assert client.files.delete(uploaded.id).deleted
    with pytest.raises(openai.NotFoundError):
        client.files.retrieve(uploaded.id)
    assert client.batches.retrieve(batch.id).status == "completed"  # the batch kept its own copy


# -- bad input ------------------------------------------------------------------------------------------------

def test_bad_lines_fail_alone_with_the_routes_answer(client, http):
    good = {"model": MODEL, "input": "a good line"}
    bad = [{"model": MODEL, "input": []}, {"model": MODEL, "input": "x", "dimension": 8},
           {"model": "no-such-model", "input": "x"}, {"model": MODEL, "input": "x", "dimensions": 8}]
    bodies = [good, *bad, {"model": MODEL, "input": "x", "encoding_format": "bytes"}]
    done = wait_status(client, run_batch(client, batch_file(bodies)).id, ("completed", "failed"))
    assert done.status == "completed"
    assert done.request_counts.model_dump() == {"total": 6, "completed": 1, "failed": 5}
    out, errors = output_lines(client, done.output_file_id), output_lines(client, done.error_file_id)
    assert [line["custom_id"] for line in out] == ["req-0"]
    same_answer(http, raw_lines(client, done.output_file_id)[0], good)
    assert [line["custom_id"] for line in errors] == [f"req-{i}" for i in range(1, 6)]
    for line, raw_line, body in zip(errors, raw_lines(client, done.error_file_id), bad):
        assert line["response"]["status_code"] in (400, 404)  # the very status and body the route answers
        same_answer(http, raw_line, body)
    assert "did you mean `dimensions`" in errors[1]["response"]["body"]["error"]["message"]
    bytes_error = errors[4]["response"]["body"]["error"]
    assert errors[4]["response"]["status_code"] == 400 and bytes_error["param"] == "encoding_format"
    assert "not available in a batch" in bytes_error["message"]


def test_a_line_over_the_key_limit_fails_alone_with_the_routes_413(tmp_path, bert_mean):
    """A line whose body holds 200,000 unknown keys (2 MB, under the byte limits here) is refused by its key count,
    as the route refuses that body (core/limits.py), before validation (which took 2.4 s of the event loop for
    it): the other lines run. A Redis of its own: the module's gateway, with its smaller byte limits, may not
    take the batch."""
    with RedisServer(tmp_path / "redis") as server, Fleet(server.url) as fleet:
        serve_tiny(fleet, bert_mean)
        gateway = fleet.gateway(max_file_bytes=4_000_000, max_body_bytes=4_000_000, batch_poll_seconds=0.2)
        wide = {"model": MODEL, "input": "x", **{f"k{i}": 0 for i in range(200_000)}}
        bodies = [{"model": MODEL, "input": "before"}, wide, {"model": MODEL, "input": "after"}]
        with openai.OpenAI(base_url=gateway.url + "/v1", api_key="unused", max_retries=0) as client, \
                httpx.Client(base_url=gateway.url, timeout=60) as http:
            done = wait_status(client, run_batch(client, batch_file(bodies)).id, ("completed", "failed"))
            assert done.status == "completed", done
            assert done.request_counts.model_dump() == {"total": 3, "completed": 2, "failed": 1}
            assert [line["custom_id"] for line in output_lines(client, done.output_file_id)] == ["req-0", "req-2"]
            [error] = output_lines(client, done.error_file_id)
            assert error["custom_id"] == "req-1" and error["response"]["status_code"] == 413
            route = http.post("/v1/embeddings", json=wide)
            assert route.status_code == 413
            assert error["response"]["body"]["error"]["message"] == route.json()["error"]["message"]
            assert "more than 16384 keys" in route.json()["error"]["message"]


def test_a_file_that_is_no_batch_file_fails_the_batch(client):
    content = batch_file([{"model": MODEL, "input": "fine"}]) + b"{not json\n" + \
        batch_file([{"model": MODEL, "input": "again"}]) + \
        b'{"custom_id": "chat", "method": "POST", "url": "/v1/chat/completions", "body": {}}\n'
    done = wait_status(client, run_batch(client, content).id, ("completed", "failed"))
    assert done.status == "failed" and done.failed_at and done.output_file_id is None
    assert [(e.line, e.code) for e in done.errors.data] == [
        (2, "invalid_json_line"), (3, "duplicate_custom_id"), (4, "invalid_url")]
    assert "does not match the batch's endpoint /v1/embeddings" in done.errors.data[2].message


def test_refusals_at_create(client, shared):
    uploaded = client.files.create(file=("ok.jsonl", batch_file([{"model": MODEL, "input": "x"}])), purpose="batch")
    with pytest.raises(openai.BadRequestError, match="runs embedding batches only"):
        client.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h")
    with pytest.raises(openai.BadRequestError, match="only '24h'"):
        client.batches.create(input_file_id=uploaded.id, endpoint="/v1/embeddings", completion_window="1h")
    with pytest.raises(openai.NotFoundError, match="no file with id file-nothing"):
        client.batches.create(input_file_id="file-nothing", endpoint="/v1/embeddings", completion_window="24h")
    with pytest.raises(openai.BadRequestError, match="purpose=batch"):
        client.files.create(file=("x.jsonl", b"{}"), purpose="fine-tune")
    with pytest.raises(openai.BadRequestError, match="expires_after"):
        client.files.create(file=("x.jsonl", b"{}"), purpose="batch",
                            extra_body={"expires_after": {"anchor": "created_at", "seconds": 60}})
    # a file may be larger than a request body (--max-body-bytes is 50,000 here): the files route has its own
    big = batch_file([{"model": MODEL, "input": "x" * 1000}] * 60)
    assert 50_000 < len(big) < 300_000 and client.files.create(file=("big.jsonl", big), purpose="batch").bytes
    with pytest.raises(openai.APIStatusError, match="limit of 300000 bytes") as too_large:
        client.files.create(file=("big.jsonl", b"x" * 300_001), purpose="batch")
    assert too_large.value.status_code == 413
    with pytest.raises(openai.NotFoundError, match="no batch with id batch_nothing"):
        client.batches.retrieve("batch_nothing")


# -- cancel and expiry ----------------------------------------------------------------------------------------

def ran(connection: redis.Redis, request_ids: list[str]) -> list[bool]:
    """Whether each request was computed: in the bulk queue's finished registry."""
    finished = rqkeys.rq_finished_key(BULK_QUEUE)
    return [connection.zscore(finished, i) is not None for i in request_ids]


def test_cancel_keeps_what_finished_and_cancels_what_is_queued(client, shared):
    _, connection = shared
    # enough lines that the batch cannot end between two polls (8 in flight: about a second of work)
    bodies = [{"model": MODEL, "input": text} for text in sample_texts(1000, seed=3)]
    batch = run_batch(client, batch_file(bodies))
    wait_status(client, batch.id, ("completed",), until=lambda b: b.request_counts.completed >= 5)
    suspend(connection)  # no worker takes more: what is queued now stays queued until the cancel
    cancelling = client.batches.cancel(batch.id)
    assert cancelling.status in ("cancelling", "cancelled") and cancelling.cancelling_at
    done = wait_status(client, batch.id, ("cancelled",))
    counts = done.request_counts
    assert counts.total == 1000 and counts.completed >= 5 and counts.failed >= 1
    assert counts.completed + counts.failed == 1000 and done.cancelled_at
    out, errors = output_lines(client, done.output_file_id), output_lines(client, done.error_file_id)
    assert len(out) == counts.completed and len(errors) == counts.failed
    assert all(line["response"]["status_code"] == 200 for line in out)
    assert {line["error"]["code"] for line in errors} == {"batch_cancelled"}
    assert all(line["response"] is None for line in errors)
    assert all(ran(connection, [line["response"]["request_id"] for line in out]))
    cancelled_ids = [batchkeys.batch_line_request_id(batch.id, int(line["custom_id"].split("-")[1])) for line in errors]
    assert not any(ran(connection, cancelled_ids))  # nothing cancelled was computed ...
    assert connection.llen(rqkeys.rq_queue_key(BULK_QUEUE)) == 0  # ... nor left in the queue
    resume(connection)
    assert client.batches.cancel(batch.id).status == "cancelled"  # again: the same answer
    finished = wait_status(client, run_batch(client, batch_file(bodies[:1])).id, ("completed",))
    with pytest.raises(openai.ConflictError, match="is completed"):
        client.batches.cancel(finished.id)


def test_expiry(shared, bert_mean):
    _, connection = shared
    server = gatewayserver.Server(gatewayserver.settings(shared[0].redis_url, batch_completion_seconds=1))
    try:
        with openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0) as client:
            suspend(connection)  # nothing runs: the window closes on queued lines
            batch = run_batch(client, batch_file([{"model": MODEL, "input": f"late {i}"} for i in range(5)]),
                              output_expires_after={"anchor": "created_at", "seconds": 7200})
            assert batch.expires_at == batch.created_at + 1
            assert batchkeys.BATCH_TTL - 10 <= connection.ttl(batchkeys.batch_key(batch.id)) <= batchkeys.BATCH_TTL
            done = wait_status(client, batch.id, ("expired",))
            assert done.expired_at and done.output_file_id is None
            assert done.request_counts.model_dump() == {"total": 5, "completed": 0, "failed": 5}
            errors = output_lines(client, done.error_file_id)
            assert {line["error"]["code"] for line in errors} == {"batch_expired"}
            assert connection.llen(rqkeys.rq_queue_key(BULK_QUEUE)) == 0
            error_file = client.files.retrieve(done.error_file_id)
            assert error_file.expires_at == error_file.created_at + 7200  # output_expires_after
            assert 7190 <= connection.ttl(batchkeys.file_key(error_file.id)) <= 7200
    finally:
        resume(connection)
        server.stop()


def test_files_and_batches_belong_to_their_key(shared):
    server = gatewayserver.Server(gatewayserver.settings(shared[0].redis_url,
                                                         api_keys='{"key-a": {"name": "a"}, "key-b": {"name": "b"}}'))
    try:
        with openai.OpenAI(base_url=server.url + "/v1", api_key="key-a", max_retries=0) as a, \
                openai.OpenAI(base_url=server.url + "/v1", api_key="key-b", max_retries=0) as b:
            uploaded = a.files.create(file=("a.jsonl", batch_file([{"model": MODEL, "input": "a's"}])),
                                      purpose="batch")
            batch = a.batches.create(input_file_id=uploaded.id, endpoint="/v1/embeddings", completion_window="24h")
            with pytest.raises(openai.NotFoundError):
                b.files.retrieve(uploaded.id)
            with pytest.raises(openai.NotFoundError):
                b.files.content(uploaded.id)
            with pytest.raises(openai.NotFoundError):
                b.batches.create(input_file_id=uploaded.id, endpoint="/v1/embeddings", completion_window="24h")
            with pytest.raises(openai.NotFoundError):
                b.batches.retrieve(batch.id)
            with pytest.raises(openai.NotFoundError):
                b.batches.cancel(batch.id)
            assert uploaded.id not in [f.id for f in b.files.list()]
            assert batch.id not in [x.id for x in b.batches.list()]
            done = wait_status(a, batch.id, ("completed",))
            assert a.files.content(done.output_file_id).content
            with pytest.raises(openai.NotFoundError):
                b.files.content(done.output_file_id)
            with pytest.raises(openai.AuthenticationError):
                openai.OpenAI(base_url=server.url + "/v1", api_key="wrong", max_retries=0).batches.list()
    finally:
        server.stop()


def test_listing_pages(client):
    made = [run_batch(client, batch_file([{"model": MODEL, "input": f"page {i}"}])).id for i in range(3)]
    first = client.batches.list(limit=2)
    assert [b.id for b in first.data] == made[::-1][:2] and first.has_more
    rest = client.batches.list(limit=2, after=first.data[-1].id)
    assert rest.data[0].id == made[0]
    assert [b.id for b in client.batches.list(limit=100).data][:3] == made[::-1]
    for batch_id in made:
        wait_status(client, batch_id, ("completed",))


# -- the Must show: a 2,000-line batch survives its gateway's SIGKILL -----------------------------------------

async def one_by_one(url: str, bodies: list[dict]) -> list[httpx.Response]:
    """Each body POSTed to /v1/embeddings on its own (32 at a time)."""
    limit = asyncio.Semaphore(32)
    async with httpx.AsyncClient(base_url=url, timeout=60) as http:
        async def post(body):
            async with limit:
                return await http.post("/v1/embeddings", json=body)
        return await asyncio.gather(*(post(body) for body in bodies))


def test_a_gateway_killed_mid_batch_loses_nothing_and_runs_nothing_twice(tmp_path, bert_mean):
    # A Redis of its own: no other test's gateway may take the batch over; the restarted gateway must.
    with RedisServer(tmp_path / "redis") as server, Fleet(server.url) as fleet:
        connection = fleet.redis
        recorder = KeyRecorder(server.url)  # every key written, matched against keys.py's layout at the end
        serve_tiny(fleet, bert_mean)
        port, env, log = free_port(), clean_env(tmp_path / "cache"), tmp_path / "gateway.log"
        gateway = GatewayProcess(server.url, port, log, env)
        try:
            bodies = [{"model": MODEL, "input": text, **({"encoding_format": "base64"} if i % 10 == 0 else {})}
                      for i, text in enumerate(sample_texts(2000, seed=7))]
            with openai.OpenAI(base_url=gateway.url + "/v1", api_key="unused", max_retries=3) as client:
                batch = run_batch(client, batch_file(bodies))
                wait_status(client, batch.id, ("completed",), until=lambda b: b.request_counts.completed >= 200)
                gateway.kill()
                # the gateway is gone: where the batch stood is read from Redis
                counts = {k: int(v) for k, v in connection.hgetall(batchkeys.batch_key(batch.id)).items()
                          if k in (b"completed", b"failed")}
                status = connection.hget(batchkeys.batch_key(batch.id), "status")
                assert status == b"in_progress" and counts[b"completed"] < 2000, (status, counts)
                pipe = connection.pipeline()
                for i in range(2000):
                    pipe.exists(rqkeys.rq_job_key(batchkeys.batch_line_request_id(batch.id, i)))
                submitted = sum(pipe.execute())
                # lines submitted and not yet collected died with it: the new gateway must neither lose nor
                # resubmit them (its submits with the same ids are refused as duplicates, and it waits)
                assert submitted > counts[b"completed"] + counts[b"failed"], (submitted, counts)
                gateway = GatewayProcess(server.url, port, log, env)
                done = wait_status(client, batch.id, ("completed", "failed", "expired"), timeout=120)
            assert done.status == "completed", done
            assert done.request_counts.model_dump() == {"total": 2000, "completed": 2000, "failed": 0}
            assert "of 2000 lines to run" in log.read_text()  # the restarted gateway took the batch over
            raw = httpx.get(f"{gateway.url}/v1/files/{done.output_file_id}/content", timeout=30).content.splitlines()
            lines = [json.loads(line) for line in raw]
            assert [line["custom_id"] for line in lines] == [f"req-{i}" for i in range(2000)]

            # every line ran exactly once: 2,000 jobs, each finished, each taken by a worker once
            ids = [batchkeys.batch_line_request_id(batch.id, i) for i in range(2000)]
            assert [line["response"]["request_id"] for line in lines] == ids
            finished = {m.decode() for m in connection.zrange(rqkeys.rq_finished_key(BULK_QUEUE), 0, -1)}
            assert finished == set(ids)
            pipe = connection.pipeline()
            for request_id in ids:
                pipe.hget(rqkeys.rq_job_key(request_id), "deliveries")
            assert set(pipe.execute()) == {b"1"}
            assert connection.zcard(rqkeys.rq_failed_key(BULK_QUEUE)) == 0

            written, patterns = recorder.stop() - {"sentinel"}, documented_patterns()
            assert {batchkeys.batch_key(batch.id), batchkeys.batch_lease_key(batch.id),
                    batchkeys.batch_lines_key(batch.id), batchkeys.batch_input_key(batch.id),
                    batchkeys.file_key(done.output_file_id)} <= written
            assert not {k for k in written if not any(p.fullmatch(k) for p in patterns)}

            # byte for byte what /v1/embeddings answers for the same bodies sent one by one
            answers = asyncio.run(one_by_one(gateway.url, bodies))
            for raw_line, answer in zip(raw, answers):
                assert_same_bytes(raw_line, answer)
        finally:
            gateway.stop()


# -- the lease fences a replica that lost it ------------------------------------------------------------------

def test_a_lapsed_lease_writes_nothing_and_each_line_counts_once(redis_server):
    async def scenario():  # the session's Redis, not flushed: the module's gateway keeps its state
        connection = aioredis.Redis.from_url(redis_server.url)
        await lapsed_lease(Store(connection))
        await connection.aclose()

    asyncio.run(scenario())


def test_a_batch_left_finalizing_by_a_dead_replica_is_finished_by_another(client, shared):
    """A replica died after its last answer was collected, while writing the output files: the module's gateway
    takes the batch over once the lease lapses and writes the same files (ids derived from the batch)."""
    server, _ = shared
    batch_id = f"batch_{uuid.uuid4().hex}"
    content = batch_file([{"model": MODEL, "input": "one"}, {"model": MODEL, "input": "two"}])
    uploaded = client.files.create(file=("dead.jsonl", content), purpose="batch")
    ok_line, bad_line = b'{"custom_id":"req-0","answered":true}', b'{"custom_id":"req-1","answered":false}'

    async def die_while_finalizing():
        connection = aioredis.Redis.from_url(server.redis_url)
        store = Store(connection)
        meta = {"id": batch_id, "endpoint": "/v1/embeddings", "input_file_id": uploaded.id,
                "completion_window": "24h", "created_at": now(), "expires_at": now() + 3600, "metadata": None,
                "output_ttl": None}
        assert await store.claim(batch_id, "dead-replica", 30)
        assert await store.create_batch(meta)
        await store.transition(batch_id, ("validating",), "in_progress", token="dead-replica", total=2)
        await store.collect(batch_id, "dead-replica", [(0, True, 1, ok_line), (1, False, 0, bad_line)])
        await store.transition(batch_id, ("in_progress",), "finalizing", token="dead-replica", finalizing_at=now())
        await connection.delete(batchkeys.batch_lease_key(batch_id))  # its lease lapses
        await connection.aclose()

    asyncio.run(die_while_finalizing())
    done = wait_status(client, batch_id, ("completed",))
    assert done.request_counts.model_dump() == {"total": 2, "completed": 1, "failed": 1}
    assert raw_lines(client, done.output_file_id) == [ok_line]
    assert raw_lines(client, done.error_file_id) == [bad_line]
    assert done.output_file_id == objects.output_file_id(batch_id, "output")
