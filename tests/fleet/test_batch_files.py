"""Batch API files that fit Redis: uploads streamed in as parts, output files written as parts, against a real
redis-server that refuses any value over 1 MB (`proto-max-bulk-len 1mb`), a live gateway and a real
BatchWorker (the null model: 1024 dimensions make big output lines cheaply). A batch whose output cannot be
stored fails with a reason in the drive that met it; one past its window expires whatever its state. And the
upload bound (429), the upload's own size limit mid-stream, and the small batch-file fixes (lines split at
b"\\n" only, the route's body limit per line, `truncate_prompt_tokens: 0`)."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
import uuid

import httpx
import openai
import pytest
import redis
import redis.asyncio as aioredis

from embedfleet.common.protocol import batchkeys
from embedfleet.producer.gateway.batches import lines as batchlines
from embedfleet.producer.gateway.batches import objects
from embedfleet.producer.gateway.batches.store import Store, now
from tests import gatewayserver
from tests.nullworker import NULL, null_worker

DIM = 1024
PART = 256 * 1024


@pytest.fixture
def small_redis(configured_redis):
    return configured_redis("proto-max-bulk-len 1mb")


@pytest.fixture
def served_small_redis(small_redis):
    """The 1 MB Redis, a null worker of DIM dimensions serving on it."""
    with null_worker(small_redis.url, dimensions=DIM) as worker:
        worker.serve()
        yield small_redis


def gateway_on(url: str, **fields) -> gatewayserver.Server:
    return gatewayserver.Server(gatewayserver.settings(url, batch_poll_seconds=0.2, batch_lease_seconds=5,
                                                       **fields))


def client_of(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="test", max_retries=0, timeout=60)


def batch_file(bodies: list[dict]) -> bytes:
    return b"".join(json.dumps({"custom_id": f"req-{i}", "method": "POST", "url": "/v1/embeddings",
                                "body": body}).encode() + b"\n" for i, body in enumerate(bodies))


def wait_ended(client: openai.OpenAI, batch_id: str, timeout: float = 120) -> openai.types.Batch:
    deadline = time.monotonic() + timeout
    while True:
        batch = client.batches.retrieve(batch_id)
        if batch.status in objects.ENDED:
            return batch
        assert time.monotonic() < deadline, f"batch still {batch.status}: {batch}"
        time.sleep(0.1)


def big_batch(lines: int = 100) -> bytes:
    """An input over 1 MB (a long text per line) whose output is ~3 MB (4 inputs x 1024 floats per line)."""
    return batch_file([{"model": NULL, "input": [f"text {i} " + "x" * 3000] * 4} for i in range(lines)])


def stored_values(connection: redis.Redis, key: str) -> list[int]:
    return [connection.hstrlen(key, field) for field in connection.hkeys(key)]


def test_big_files_are_stored_in_parts_and_read_back_whole(served_small_redis):
    content = big_batch()
    assert len(content) > 1024 * 1024  # one SET of it would be refused by this Redis
    server = gateway_on(served_small_redis.url, file_part_bytes=PART)
    connection = redis.Redis.from_url(served_small_redis.url)
    try:
        client = client_of(server)
        uploaded = client.files.create(file=("big.jsonl", content), purpose="batch")
        assert uploaded.bytes == len(content)
        assert client.files.content(uploaded.id).content == content  # streamed back from its parts
        assert max(stored_values(connection, batchkeys.file_key(uploaded.id))) <= PART
        batch = client.batches.create(input_file_id=uploaded.id, endpoint="/v1/embeddings", completion_window="24h")
        done = wait_ended(client, batch.id)
        assert done.status == "completed", done
        assert done.request_counts.completed == 100 and done.error_file_id is None
        output = client.files.content(done.output_file_id).content
        assert len(output) > 3 * PART and client.files.retrieve(done.output_file_id).bytes == len(output)
        values = stored_values(connection, batchkeys.file_key(done.output_file_id))
        assert len(values) > 3 and max(values) <= PART
        lines = [json.loads(line) for line in output.split(b"\n") if line]
        assert [line["custom_id"] for line in lines] == [f"req-{i}" for i in range(100)]
        for line in lines:
            data = line["response"]["body"]["data"]
            assert len(data) == 4 and all(len(row["embedding"]) == DIM for row in data)
        assert not connection.keys("embedfleet:file:*:upload")  # no staging key left behind
    finally:
        server.stop()
        connection.close()


def test_an_output_redis_refuses_fails_the_batch_with_a_reason_in_one_drive(served_small_redis, caplog):
    """Parts larger than this Redis takes (a misconfigured --file-part-bytes): the first drive that writes the
    output meets the refusal, sees that Redis still answers, and fails the batch; it is never retried."""
    content = batch_file([{"model": NULL, "input": ["short"] * 4} for _ in range(100)])
    server = gateway_on(served_small_redis.url, file_part_bytes=4 * 1024 * 1024)
    connection = redis.Redis.from_url(served_small_redis.url)
    try:
        client = client_of(server)
        with caplog.at_level(logging.INFO, logger="embedfleet.producer.gateway.batches.runner"):
            uploaded = client.files.create(file=("out.jsonl", content), purpose="batch")
            batch = client.batches.create(input_file_id=uploaded.id, endpoint="/v1/embeddings",
                                          completion_window="24h")
            done = wait_ended(client, batch.id)
        assert done.status == "failed" and done.failed_at and done.output_file_id is None, done
        assert [e.code for e in done.errors.data] == ["output_not_stored"]
        message = done.errors.data[0].message  # Redis's own refusal quoted (a reset: it drops the connection)
        assert message.startswith("the batch's output files could not be stored in Redis (")
        assert "--file-part-bytes" in message
        assert done.request_counts.total == 100
        messages = [r.getMessage() for r in caplog.records]
        assert sum("cannot be stored" in m for m in messages) == 1
        assert not any("taken up again" in m or "lease" in m for m in messages)
        assert not connection.keys("embedfleet:file:*:upload") and not connection.exists(
            batchkeys.batch_lines_key(batch.id))
    finally:
        server.stop()
        connection.close()


def test_an_answer_redis_refuses_fails_the_batch_with_a_reason(served_small_redis):
    """One line's answer (150 inputs x 1024 floats as JSON: ~1.2 MB) is over what this Redis takes in one
    value: collecting it is refused twice while Redis answers, and the batch fails saying so."""
    content = batch_file([{"model": NULL, "input": "a"}, {"model": NULL, "input": ["b"] * 150}])
    server = gateway_on(served_small_redis.url, file_part_bytes=PART)
    try:
        client = client_of(server)
        uploaded = client.files.create(file=("huge.jsonl", content), purpose="batch")
        batch = client.batches.create(input_file_id=uploaded.id, endpoint="/v1/embeddings", completion_window="24h")
        done = wait_ended(client, batch.id)
        assert done.status == "failed" and [e.code for e in done.errors.data] == ["output_not_stored"], done
        assert done.errors.data[0].message.startswith("the batch's answers could not be stored in Redis (")
    finally:
        server.stop()


def test_past_its_window_a_batch_expires_from_any_state(served_small_redis):
    """A batch left `finalizing` (every line answered) or `validating` by a replica that died, found past
    its completion window: it expires (the answers it has are kept in its files), never stays as it was."""
    server = gateway_on(served_small_redis.url, file_part_bytes=PART)
    client = client_of(server)
    uploaded = client.files.create(file=("two.jsonl", batch_file([{"model": NULL, "input": "a"}] * 2)),
                                   purpose="batch")
    finalizing, validating = f"batch_{uuid.uuid4().hex}", f"batch_{uuid.uuid4().hex}"
    ok_line = b'{"custom_id":"req-0","answered":true}'

    async def left_by_a_dead_replica():
        connection = aioredis.Redis.from_url(served_small_redis.url)
        store = Store(connection)
        for batch_id in (finalizing, validating):
            meta = {"id": batch_id, "endpoint": "/v1/embeddings", "input_file_id": uploaded.id,
                    "completion_window": "24h", "created_at": now() - 100, "expires_at": now() - 1,
                    "metadata": None, "output_ttl": None}
            assert await store.claim(batch_id, "dead-replica", 30)
            assert await store.create_batch(meta)
        await store.transition(finalizing, ("validating",), "in_progress", token="dead-replica", total=2)
        await store.collect(finalizing, "dead-replica", [(0, True, 1, ok_line), (1, True, 1, ok_line)])
        await store.transition(finalizing, ("in_progress",), "finalizing", token="dead-replica")
        for batch_id in (finalizing, validating):
            await connection.delete(batchkeys.batch_lease_key(batch_id))
        await connection.aclose()

    try:
        asyncio.run(left_by_a_dead_replica())
        done = wait_ended(client, finalizing)
        assert done.status == "expired" and done.expired_at
        assert client.files.content(done.output_file_id).content == ok_line + b"\n" + ok_line + b"\n"
        done = wait_ended(client, validating)
        assert done.status == "expired" and done.expired_at and done.output_file_id is None
    finally:
        server.stop()


def test_uploads_past_the_bound_get_429_and_one_too_large_leaves_nothing(served_small_redis):
    server = gateway_on(served_small_redis.url, max_concurrent_uploads=1, max_file_bytes=200_000)
    connection = redis.Redis.from_url(served_small_redis.url)
    release = threading.Event()
    boundary = "b0undary"

    def held_body():
        """A multipart upload that stops after its first bytes until `release` is set."""
        yield (f"--{boundary}\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\nbatch\r\n"
               f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.jsonl\"\r\n"
               "Content-Type: application/octet-stream\r\n\r\n").encode()
        release.wait(60)
        yield batch_file([{"model": NULL, "input": "a"}])
        yield f"\r\n--{boundary}--\r\n".encode()

    headers = {"content-type": f"multipart/form-data; boundary={boundary}"}
    answers = []
    first = threading.Thread(target=lambda: answers.append(
        httpx.post(server.url + "/v1/files", content=held_body(), headers=headers, timeout=60)))
    try:
        first.start()
        deadline = time.monotonic() + 30
        while getattr(server.app.state, "uploads_active", 0) < 1:  # the first upload is being read
            assert time.monotonic() < deadline and first.is_alive()
            time.sleep(0.01)
        client = client_of(server)
        with pytest.raises(openai.RateLimitError) as refused:
            client.files.create(file=("b.jsonl", batch_file([{"model": NULL, "input": "b"}])), purpose="batch")
        assert refused.value.response.headers["retry-after"] == "1"
        assert "--max-concurrent-uploads" in refused.value.message
        release.set()
        first.join(60)
        assert answers[0].status_code == 200, answers[0].text
        assert client.files.content(answers[0].json()["id"]).content == batch_file([{"model": NULL, "input": "a"}])

        def too_large():  # no Content-Length: only the bytes read can tell
            yield held_body().__next__()
            for _ in range(40):
                yield b"y" * 10_000

        answer = httpx.post(server.url + "/v1/files", content=too_large(), headers=headers, timeout=60)
        assert answer.status_code == 413, answer.text
        assert not connection.keys("embedfleet:file:*:upload")
        assert client.files.create(file=("c.jsonl", b"{}\n"), purpose="batch").bytes == 3  # the slot is free
    finally:
        release.set()
        server.stop()
        connection.close()


# -- the small ones: lines, body limit, truncate_prompt_tokens 0 --------------------------------------------

def test_lines_split_at_newline_only_and_keep_their_numbers():
    """U+2028, U+0085 and U+2029 are legal raw inside a JSON string (str.splitlines would break there)."""
    good = "\n".join(json.dumps({"custom_id": f"r{i}", "method": "POST", "url": "/v1/embeddings",
                                 "body": {"input": f"a{sep}b"}}, ensure_ascii=False)
                     for i, sep in enumerate(["\u2028", "\x85", "\u2029", "\x1c"]))
    found, errors = batchlines.parse((good + "\n\nnot json\n").encode())
    assert [line.body.input for line in found] == ["a\u2028b", "a\x85b", "a\u2029b", "a\x1cb"]
    assert [(e.code, e.line) for e in errors] == [("invalid_json_line", 6)]  # line 5 is blank, still counted
    reader = batchlines.Reader()  # the same file fed in pieces that cut lines (and a character) anywhere
    data = good.encode()
    for start in range(0, len(data), 7):
        reader.feed(data[start:start + 7])
    assert [line.custom_id for line in reader.finish()[0]] == ["r0", "r1", "r2", "r3"]


def test_a_line_over_the_routes_body_limit_fails_alone_with_413():
    small, big = {"input": "short"}, {"input": "word " * 400}
    found, errors = batchlines.parse(batch_file([small, big, small]), max_body_bytes=1000)
    assert not errors
    assert [line.error.code if line.error else None for line in found] == [None, "payload_too_large", None]
    assert "limit is 1000 bytes" in found[1].error.message
    spaced = json.dumps({"custom_id": "s", "method": "POST", "url": "/v1/embeddings",
                         "body": {"input": "short"}}, indent=600).replace("\n", " ").encode()
    assert len(spaced) > 1000 and batchlines.parse(spaced, max_body_bytes=1000)[0][0].error is None  # as JSON


def test_truncate_prompt_tokens_0_and_a_too_large_line_answer_as_the_route(served_small_redis):
    server = gateway_on(served_small_redis.url, max_body_bytes=2000)
    try:
        client = client_of(server)
        zero = {"model": NULL, "input": ["a", "b"], "truncate_prompt_tokens": 0}
        big = {"model": NULL, "input": "word " * 500}
        uploaded = client.files.create(file=("z.jsonl", batch_file([zero, big])), purpose="batch")
        batch = client.batches.create(input_file_id=uploaded.id, endpoint="/v1/embeddings", completion_window="24h")
        done = wait_ended(client, batch.id)
        assert done.status == "completed" and done.request_counts.completed == 1 and done.request_counts.failed == 1
        line = json.loads(client.files.content(done.output_file_id).content)
        direct = httpx.post(server.url + "/v1/embeddings", json=zero, timeout=30)
        assert line["response"]["status_code"] == direct.status_code == 200
        assert line["response"]["body"]["data"] == direct.json()["data"] == []
        assert line["response"]["body"]["usage"] == direct.json()["usage"]
        error = json.loads(client.files.content(done.error_file_id).content)
        direct = httpx.post(server.url + "/v1/embeddings", json=big, timeout=30)
        assert error["response"]["status_code"] == direct.status_code == 413
        assert error["response"]["body"]["error"]["code"] == direct.json()["error"]["code"]
    finally:
        server.stop()
