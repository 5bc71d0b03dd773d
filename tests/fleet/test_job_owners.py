"""Async jobs belong to the API key that created them (issue #19): real uvicorn gateways, real HTTP
clients, the real BatchWorker on its null model, a real redis-server.

Another key's job must answer exactly as an id with no job: the same status and body (but for the id it
names) on GET, GET ?wait=, DELETE and the events stream.
"""

from __future__ import annotations

import json
import uuid

import httpx
import pytest

from embedfleet.common.protocol import keys
from embedfleet.producer.gateway.core.owners import fingerprint, may_see
from tests.gatewayserver import Server, settings
from tests.nullworker import NULL, null_worker
from tests.webhooks import read_events

KEYS = {"sk-alice-0a1b": {"name": "alice"}, "sk-bob-2c3d": {"name": "bob"}}


def client(server: Server, key: str | None = None) -> httpx.Client:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.Client(base_url=server.url, headers=headers, timeout=60)


def post_job(http: httpx.Client, text: str) -> str:
    response = http.post("/v1/jobs", json={"model": NULL, "input": text})
    assert response.status_code == 202, response.text
    return response.json()["id"]


def answer_of(response: httpx.Response, job_id: str) -> tuple[int, str]:
    """The status and body, with the id they name replaced: what tells one id's answer from another's."""
    return response.status_code, response.text.replace(job_id, "<id>")


def events(http: httpx.Client, ids: list[str]) -> dict[str, str]:
    """Each job event of a GET /v1/jobs/events stream, by id, with its id replaced."""
    with http.stream("GET", "/v1/jobs/events", params={"ids": ",".join(ids), "timeout": 30}) as response:
        assert response.status_code == 200
        found = read_events(response)
    assert [name for name, _ in found] == ["job"] * len(ids) + ["done"]
    return {data["id"]: json.dumps(data).replace(data["id"], "<id>") for name, data in found if name == "job"}


@pytest.fixture
def keyed(redis_url):
    server = Server(settings(redis_url, api_keys=json.dumps(KEYS)))
    yield server
    server.stop()


def test_another_keys_job_answers_as_no_job_on_every_route(redis_url, redis_client, keyed):
    unknown = uuid.uuid4().hex  # the shape of a job id, naming no job
    with null_worker(redis_url) as worker, client(keyed, "sk-alice-0a1b") as alice, \
            client(keyed, "sk-bob-2c3d") as bob:
        queued = post_job(alice, "queued while bob looks")
        nothing = answer_of(bob.get(f"/v1/jobs/{unknown}"), unknown)
        assert nothing[0] == 404 and '"code":"not_found"' in nothing[1]
        assert answer_of(bob.get(f"/v1/jobs/{queued}"), queued) == nothing
        # a long-poll on a job that does not exist ends at once; were it waited for, it would answer 202
        assert answer_of(bob.get(f"/v1/jobs/{queued}", params={"wait": 30}), queued) == nothing
        assert answer_of(bob.delete(f"/v1/jobs/{queued}"), queued) == answer_of(bob.delete(f"/v1/jobs/{unknown}"),
                                                                                 unknown)
        assert alice.get(f"/v1/jobs/{queued}").json()["status"] == "queued"  # bob's DELETE did nothing
        assert alice.delete(f"/v1/jobs/{queued}").status_code == 200

        done, bobs = post_job(alice, "alice's"), post_job(bob, "bob's")
        worker.serve()
        assert alice.get(f"/v1/jobs/{done}", params={"wait": 30}).status_code == 200
        assert answer_of(bob.get(f"/v1/jobs/{done}", params={"wait": 30}), done) == nothing
        seen_by_bob = events(bob, [done, unknown, bobs])
        seen_by_alice = events(alice, [done])
        stored = json.loads(redis_client.get(keys.job_options_key(done)))
    assert seen_by_bob[done] == seen_by_bob[unknown] and json.loads(seen_by_bob[done])["status"] == "not_found"
    assert json.loads(seen_by_bob[bobs])["status"] == "finished"
    assert json.loads(seen_by_alice[done])["status"] == "finished"
    # the owner is a fingerprint of the key, never the key
    assert stored["owner"] == fingerprint("sk-alice-0a1b") != fingerprint("sk-bob-2c3d")
    assert "sk-alice" not in redis_client.get(keys.job_options_key(done)).decode()


def test_a_job_whose_options_expired_is_nobodys_with_keys_and_everyones_without(redis_url, redis_client,
                                                                                  keyed):
    open_gateway = Server(settings(redis_url))
    try:
        with null_worker(redis_url) as worker, client(keyed, "sk-alice-0a1b") as alice, \
                client(open_gateway) as anyone:
            job = post_job(alice, "options lost")
            worker.serve()
            assert alice.get(f"/v1/jobs/{job}", params={"wait": 30}).status_code == 200
            assert anyone.get(f"/v1/jobs/{job}").status_code == 200  # without keys: unchanged
            redis_client.delete(keys.job_options_key(job))  # as when they expire: no owner to match
            lost = alice.get(f"/v1/jobs/{job}")
            lost_events = events(alice, [job])
            still_open = anyone.get(f"/v1/jobs/{job}")
    finally:
        open_gateway.stop()
    assert lost.status_code == 404 and lost.json()["error"]["code"] == "not_found"
    assert json.loads(lost_events[job])["status"] == "not_found"
    assert still_open.status_code == 200 and still_open.json()["status"] == "finished"


@pytest.mark.parametrize("options, owner, keyed, seen", [
    (None, None, False, True),  # no keys: every job is everyone's
    ({"owner": "f1"}, None, False, True),
    ({"owner": "f1"}, "f1", True, True),
    ({"owner": "f1"}, "f2", True, False),
    ({"encoding_format": "float"}, "f1", True, False),  # created without a key: nobody's
    (None, "f1", True, False),  # options expired: nobody's
    ({"owner": None}, "f1", True, False),
    ({"owner": ["f1"]}, "f1", True, False),
    ({"owner": "f1"}, None, True, False),
])
def test_who_may_see_a_job(options, owner, keyed, seen):
    assert may_see(options, owner, keyed) is seen
