"""OpenAI's Batch API driven as a client does (files, batches, polling, outputs), a gateway as its own process
(`python -m embedfleet.producer.gateway`), and the lease scenario every Store must pass (a plain Redis, a
cluster)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import uuid

import httpx
import openai
import pytest

from embedfleet.producer.gateway.batches.store import LeaseLost, Store, now
from tests.commands import ROOT


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


def raw_lines(client: openai.OpenAI, file_id: str | None) -> list[bytes]:
    return client.files.content(file_id).content.splitlines() if file_id else []


def output_lines(client: openai.OpenAI, file_id: str | None) -> list[dict]:
    return [json.loads(line) for line in raw_lines(client, file_id)]


class GatewayProcess:
    """`python -m embedfleet.producer.gateway` as users run it, on a fixed port, its output in a log file."""

    def __init__(self, redis_url: str, port: int, log_path, env: dict):
        self.log_path = log_path
        with open(log_path, "ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "embedfleet.producer.gateway", "--redis-url", redis_url, "--port", str(port),
                 "--batch-lease-seconds", "2", "--batch-poll-seconds", "0.2", "--log-level", "info"],
                cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        self.url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            assert self.process.poll() is None, log_path.read_text()
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, log_path.read_text()
            time.sleep(0.1)

    def kill(self):
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(10)

    def stop(self):
        if self.process.poll() is None:
            self.process.terminate()
            self.process.wait(30)


async def lapsed_lease(store: Store) -> None:
    """A lapsed lease's replica writes nothing, each line counts once (also on a cluster: test_cluster_batches)."""
    connection, batch_id = store.connection, f"batch_{uuid.uuid4().hex}"
    file_id = f"file-{uuid.uuid4().hex[:24]}"
    await store.commit_file({"id": file_id, "created_at": now()}, store.file_writer(file_id, 1024), 60)
    meta = {"id": batch_id, "created_at": now(), "expires_at": now() + 60, "input_file_id": file_id}
    assert await store.claim(batch_id, "replica-a", 30)  # before it is listed: no runner may take it
    assert await store.create_batch(meta)
    assert not await store.claim(batch_id, "replica-b", 30)  # one driver at a time
    assert await store.collect(batch_id, "replica-a", [(0, True, 3, b"{}"), (1, False, 0, b"{}")]) == 2
    await connection.delete(store.lease_key(batch_id))  # replica a's lease lapsed ...
    assert await store.claim(batch_id, "replica-b", 30)  # ... and b took the batch over
    with pytest.raises(LeaseLost):
        await store.collect(batch_id, "replica-a", [(2, True, 1, b"{}")])
    with pytest.raises(LeaseLost):
        await store.transition(batch_id, ("validating",), "in_progress", token="replica-a")
    assert not await store.renew(batch_id, "replica-a", 30)
    # b collects line 1 again (it cannot know a did) and line 2: only line 2 is new
    assert await store.collect(batch_id, "replica-b", [(1, False, 0, b"{}"), (2, True, 4, b"{}")]) == 1
    batch = await store.batch(batch_id)
    assert (batch["completed"], batch["failed"], batch["input_tokens"]) == ("2", "1", "7")
    assert await store.transition(batch_id, ("validating",), "in_progress", token="replica-b") is None
    assert await store.transition(batch_id, ("validating",), "failed", token="replica-b") == "in_progress"
    await store.release(batch_id, "replica-a")  # not a's to give back: b keeps it
    assert await connection.get(store.lease_key(batch_id)) == b"replica-b"
    await store.transition(batch_id, ("in_progress",), "failed", token="replica-b", end=True)
    assert batch_id not in await store.active() and not await connection.exists(store.lease_key(batch_id))
