"""Results pushed to the client (issue #9): webhooks on POST /v1/jobs and GET /v1/jobs/events (SSE).

Real uvicorn gateways, the real BatchWorker on its null model, a real redis-server, and a real HTTP
receiver on loopback that the test starts. Loopback is no place a webhook may go by default: the gateways
here are let through to it as an operator would, with --webhook-allow-hosts and --webhook-allow-http.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import threading
import time

import httpx

from embedfleet.common.protocol import keys
from tests.gatewayserver import Server, settings
from tests.nullworker import NULL, null_worker
from tests.webhooks import SECRET, read_events

def gateway(redis_url: str, **fields) -> Server:
    """A gateway that signs webhooks and may deliver them to the loopback receiver."""
    fields = {"webhook_allow_http": True, "webhook_allow_hosts": "127.0.0.1", **fields}
    return Server(settings(redis_url, webhook_secret=SECRET, webhook_sweep_seconds=0.2, **fields))


def post_job(server: Server, **body) -> str:
    response = httpx.post(f"{server.url}/v1/jobs", json={"model": NULL, **body}, timeout=30)
    assert response.status_code == 202, response.text
    return response.json()["id"]


def test_webhook_is_signed_retried_on_a_500_and_delivered(redis_url, redis_client, receiver):
    receiver.statuses = [500]
    server = gateway(redis_url)
    try:
        with null_worker(redis_url) as worker:
            worker.serve()
            job = post_job(server, input=["first", "second"], webhook=receiver.url)
            first, second = receiver.wait_for(2)
            answer = httpx.get(f"{server.url}/v1/jobs/{job}", timeout=30).json()
            time.sleep(1.0)  # the sweeps that follow deliver nothing more
    finally:
        server.stop()
    assert [first["status"], second["status"]] == [500, 200] and len(receiver.requests) == 2
    assert [first["headers"]["X-Embedfleet-Attempt"], second["headers"]["X-Embedfleet-Attempt"]] == ["1", "2"]
    assert first["body"] == second["body"] and first["headers"]["X-Embedfleet-Job"] == job
    expected = "sha256=" + hmac.new(SECRET.encode(), second["body"], hashlib.sha256).hexdigest()
    assert hmac.compare_digest(second["headers"]["X-Embedfleet-Signature-256"], expected)
    forged = "sha256=" + hmac.new(b"another secret", second["body"], hashlib.sha256).hexdigest()
    assert second["headers"]["X-Embedfleet-Signature-256"] != forged
    delivered = json.loads(second["body"])
    assert delivered["id"] == job and delivered["status"] == "finished"
    assert delivered["data"] == answer["data"] and len(delivered["data"]) == 2
    assert redis_client.zcard(keys.WEBHOOKS_KEY) == 0  # off the delivery list


def test_any_replica_delivers_a_webhook_when_the_accepting_one_is_gone(redis_url, redis_client, receiver):
    with null_worker(redis_url) as worker:
        accepting = gateway(redis_url)
        try:
            job = post_job(accepting, input="accepted by a replica that then stops", webhook=receiver.url)
        finally:
            accepting.stop()
        worker.serve()  # the result lands while no replica runs: nobody reads the stream entry
        deadline = time.monotonic() + 30
        while not redis_client.exists(keys.result_key(job)):
            assert time.monotonic() < deadline, "the worker did not answer"
            time.sleep(0.05)
        time.sleep(0.3)
        assert receiver.requests == []
        other = gateway(redis_url)
        try:
            [delivery] = receiver.wait_for(1)
        finally:
            other.stop()
    assert json.loads(delivery["body"])["id"] == job and delivery["status"] == 200
    assert redis_client.zcard(keys.WEBHOOKS_KEY) == 0


def test_a_webhook_needs_a_secret_and_an_http_url(redis_url, receiver):
    unsigned = Server(settings(redis_url))
    signed = gateway(redis_url)
    try:
        with null_worker(redis_url):
            refused = httpx.post(f"{unsigned.url}/v1/jobs", json={"model": NULL, "input": "x",
                                                                   "webhook": receiver.url}, timeout=30)
            bad_url = httpx.post(f"{signed.url}/v1/jobs", json={"model": NULL, "input": "x",
                                                                "webhook": "file:///etc/passwd"}, timeout=30)
    finally:
        unsigned.stop()
        signed.stop()
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "webhook"
    assert "--webhook-secret" in refused.json()["error"]["message"]
    assert bad_url.status_code == 400 and "webhook" in bad_url.json()["error"]["message"]


def test_events_stream_each_job_once_from_any_replica(redis_url):
    accepting, streaming = gateway(redis_url), gateway(redis_url)
    try:
        with null_worker(redis_url) as worker:
            jobs = [post_job(accepting, input=[f"text {i}"] * (i + 1)) for i in range(3)]
            ids = [*jobs, jobs[0], "no-such-job"]  # a repeated id counts once
            events: list = []
            with httpx.Client(timeout=60) as client, client.stream(
                    "GET", f"{streaming.url}/v1/jobs/events", params={"ids": ",".join(ids)}) as response:
                assert response.status_code == 200
                assert response.headers["content-type"].startswith("text/event-stream")
                reader = threading.Thread(target=lambda: events.extend(read_events(response)), daemon=True)
                reader.start()
                time.sleep(0.5)  # the stream is open and the jobs are still queued
                worker.serve()
                reader.join(30)
            bad = httpx.get(f"{streaming.url}/v1/jobs/events", params={"ids": "a,../b"}, timeout=30)
    finally:
        accepting.stop()
        streaming.stop()
    assert [name for name, _ in events] == ["job"] * 4 + ["done"]
    by_id = {data["id"]: data for name, data in events if name == "job"}
    assert sorted(by_id) == sorted([*jobs, "no-such-job"])
    assert by_id["no-such-job"]["status"] == "not_found" and by_id["no-such-job"]["error"]["code"] == "not_found"
    for i, job in enumerate(jobs):
        assert by_id[job]["status"] == "finished" and len(by_id[job]["data"]) == i + 1
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "ids"
