"""The gateway's async jobs on a real Redis Cluster (issue 39): POST /v1/jobs answered through GET /v1/jobs/{id}
(an id with the model's hash tag in the URL), and a webhook delivered by the sweeps (on a cluster the shared
webhook stream lies in another slot than the job, so nothing wakes it: producer/gateway/jobs/webhooks.py). The
Batch API on a cluster: test_cluster_batches.py."""

from __future__ import annotations

import time

import httpx

from embedfleet.common.names import slot_tag, tag_of
from embedfleet.common.redisclient import connect
from tests.webhooks import SECRET, Receiver
from tests.gatewayserver import Server, settings
from tests.harness import serve
from tests.nullworker import NULL, null_engine


def _answer(server: Server, job: str, timeout: float = 30) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        answer = httpx.get(f"{server.url}/v1/jobs/{job}", timeout=30).json()
        if answer.get("status") not in ("queued", "started", "in_progress"):
            return answer
        assert time.monotonic() < deadline, f"job {job} unanswered after {timeout} s: {answer}"
        time.sleep(0.05)


def test_async_jobs_and_their_webhooks_on_a_cluster(cluster_url):
    receiver = Receiver()
    connection = connect(cluster_url)
    server = Server(settings(cluster_url, webhook_secret=SECRET, webhook_sweep_seconds=0.2,
                             webhook_allow_http=True, webhook_allow_hosts="127.0.0.1"))
    try:
        with serve(null_engine(), connection, max_jobs=64):
            posted = [httpx.post(f"{server.url}/v1/jobs", json={"model": NULL, "input": ["a", "b"], **extra},
                                 timeout=30) for extra in ({}, {"webhook": receiver.url})]
            assert [p.status_code for p in posted] == [202, 202], [p.text for p in posted]
            plain, hooked = (p.json()["id"] for p in posted)
            answers = [_answer(server, job) for job in (plain, hooked)]
            (delivered,) = receiver.wait_for(1)
    finally:
        server.stop()
        connection.close()
        receiver.close()
    assert tag_of(plain) == tag_of(hooked) == slot_tag(NULL)
    assert [len(a["data"]) for a in answers] == [2, 2], answers
    assert delivered["headers"]["X-Embedfleet-Job"] == hooked
