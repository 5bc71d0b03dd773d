"""OpenAI's Batch API on the fleet, through the real `openai` client: files and batches end to end against a
live uvicorn gateway and BatchWorker threads on a tiny random BERT, a real redis-server; bad lines, invalid
files, cancel, expiry, ownership; and a 2,000-line batch whose gateway (a real `python -m producer.gateway`
process) is SIGKILLed mid-batch and restarted: every line answered once, byte for byte the route's answer."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time

import httpx
import openai
import pytest
import redis
from rq.suspension import resume, suspend

from common.errors import DuplicateRequestError, ValidationError
from common.protocol import keys
from common.redisserver import RedisServer, free_port
from producer import Producer
from tests import gatewayserver
from tests.commands import ROOT, clean_env
from tests.tinymodels import sample_texts
from worker.engine.engine import Engine
from worker.engine.identity import folder_digest, model_identity
from worker.engine.model import load_model
from worker.serving.cache import VectorCache
from worker.serving.pipeline import BatchWorker

MODEL = "tiny"
BULK_QUEUE = keys.queue_name(MODEL, "bulk")


class Fleet:
    """Tiny-BERT BatchWorker threads on one Redis, with the fleet's vector cache on as `embedfleet worker` has
    it by default: a text is computed once, and answered from the cache after, whichever route asks. (Without
    it the same text in another forward pass, padded with other texts, may differ in float32's last bits, on
    either route: that is the model's arithmetic, not the answer's encoding, which is what is compared.)"""

    def __init__(self, folder: str, connection: redis.Redis, count: int = 1):
        model = load_model(folder, served_name=MODEL)
        identity = model_identity(MODEL, folder_digest(folder), "float32", "cpu")
        cache = VectorCache(connection, identity, model.caps.embedding_size)
        self.workers = [BatchWorker(Engine(model), connection, cache=cache, poll_timeout=1) for _ in range(count)]
        self.threads = [threading.Thread(target=w.work, daemon=True) for w in self.workers]
        for worker, thread in zip(self.workers, self.threads):
            thread.start()
            worker.advertiser.advertise()

    def stop(self):
        for worker in self.workers:
            worker.stop()
        for thread in self.threads:
            thread.join(30)


@pytest.fixture(scope="module")
def shared(redis_server, bert_mean):
    """One worker and one gateway for the module's tests (not flushed between them: each test's files and
    batches have ids of their own)."""
    connection = redis.Redis.from_url(redis_server.url)
    connection.flushall()
    fleet = Fleet(bert_mean, connection)
    server = gatewayserver.Server(gatewayserver.settings(redis_server.url, max_file_bytes=100_000,
                                                         batch_in_flight=8, batch_poll_seconds=0.2))
    yield server, connection
    server.stop()
    fleet.stop()
    resume(connection)
    connection.close()


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


def batch_file(bodies: list[dict], prefix: str = "req") -> bytes:
    return b"".join(json.dumps({"custom_id": f"{prefix}-{i}", "method": "POST", "url": "/v1/embeddings",
                                "body": body}).encode() + b"\n" for i, body in enumerate(bodies))


def run_batch(client: openai.OpenAI, content: bytes, **create) -> openai.types.Batch:
    uploaded = client.files.create(file=("batch.jsonl", content), purpose="batch")
    batch = client.batches.create(input_file_id=uploaded.id, endpoint="/v1/embeddings", completion_window="24h",
                                  **create)
    assert batch.status == "validating" and batch.input_file_id == uploaded.id
    return batch


def wait_status(client: openai.OpenAI, batch_id: str, statuses: tuple[str, ...], timeout: float = 60,
                until=None) -> openai.types.Batch:
    """Poll the batch (as a client does) until it reaches one of `statuses` (or `until(batch)` holds)."""
    deadline = time.monotonic() + timeout
    while True:
        batch = client.batches.retrieve(batch_id)
        if batch.status in statuses or (until is not None and until(batch)):
            return batch
        assert time.monotonic() < deadline, f"batch still {batch.status}: {batch}"
        time.sleep(0.1)


def output_lines(client: openai.OpenAI, file_id: str | None) -> list[dict]:
    if file_id is None:
        return []
    return [json.loads(line) for line in client.files.content(file_id).content.splitlines()]


def same_answer(http: httpx.Client, line: dict, body: dict) -> None:
    """The line's body is the bytes POST /v1/embeddings answers for `body`, but for the request id and the
    time (`id`, `created`), which are the batch line's own."""
    answer = http.post("/v1/embeddings", json=body)
    response = line["response"]
    assert response["status_code"] == answer.status_code
    direct = answer.json()
    if "id" in direct:
        direct.update(id=response["body"]["id"], created=response["body"]["created"])
        assert response["request_id"] == direct["id"]
    # the route's own rendering of each (JSONResponse / AsciiJSONResponse) compared byte for byte
    render = answer.headers.get("content-type", "").startswith("application/json")
    assert render and json.dumps(response["body"], ensure_ascii=answer.status_code != 200,
                                 separators=(",", ":")).encode() == json.dumps(
        direct, ensure_ascii=answer.status_code != 200, separators=(",", ":")).encode()


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
    assert connection.hget(keys.rq_job_key(first), "deliveries") == b"1"


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
    assert 3590 <= connection.ttl(keys.file_key(uploaded.id)) <= 3600
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
    lines = output_lines(client, done.output_file_id)
    assert [line["custom_id"] for line in lines] == [f"req-{i}" for i in range(8)]
    for line, body in zip(lines, bodies):
        assert line["error"] is None and line["id"].startswith("batch_req_")
        same_answer(http, line, body)
    output = client.files.retrieve(done.output_file_id)
    assert output.purpose == "batch_output" and output.bytes == len(client.files.content(output.id).content)
    assert batch.id in [b.id for b in client.batches.list(limit=100)]
    # the work keys went with the end; the lines ran at bulk priority
    assert not connection.exists(keys.batch_lines_key(batch.id), keys.batch_input_key(batch.id))
    assert connection.zscore(keys.rq_finished_key(BULK_QUEUE), keys.batch_line_request_id(batch.id, 0))
    assert client.files.delete(uploaded.id).deleted
    with pytest.raises(openai.NotFoundError):
        client.files.retrieve(uploaded.id)
    assert client.batches.retrieve(batch.id).status == "completed"  # the batch kept its own copy
