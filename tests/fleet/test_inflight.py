"""In-flight dedup across the fleet: two real BatchWorkers on one real redis-server, a real tiny model."""

from __future__ import annotations

import threading
import time

import pytest
import redis

from embedfleet.common.protocol.keys import inflight_key, queue_name, result_key
from embedfleet.common.request import EmbedRequest
from embedfleet.common.result import Result
from tests import harness
from tests.harness import burst, serve
from tests.rqjobs import enqueue
from tests.roundtrips import CountingConnection
from tests.tinymodels import sample_texts
from embedfleet.worker.serving.cache import VectorCache
from embedfleet.worker.engine.engine import Engine
from embedfleet.worker.engine.identity import folder_digest, model_identity
from embedfleet.worker.serving.inflight import request_digest
from embedfleet.worker.engine.models.loader import load_model
from embedfleet.worker.serving.pipeline import BatchWorker

TEXTS = sample_texts(6, seed=21)


class Slowed:
    """The real model, with its first forward pass taking `delay` seconds more (a slow device), or held
    until `gate` is set, so that others arrive while it runs; with `fail_to_one`, its passes fail (a fault)
    down to a one-row pass."""

    def __init__(self, model, delay: float, gate: threading.Event | None = None, fail_to_one: bool = False):
        self._model, self.delay, self.gate = model, delay, gate
        self.fail_to_one = fail_to_one  # every pass fails until a one-row pass has failed (a request failed alone)

    def __getattr__(self, name):
        return getattr(self._model, name)

    def embed(self, token_lists, prompt_lengths=None):
        time.sleep(self.delay)
        self.delay = 0.0
        if self.gate is not None:
            assert self.gate.wait(240), "the test never opened the gate"
        if self.fail_to_one:
            self.fail_to_one = len(token_lists) > 1
            raise RuntimeError("device fault")
        return self._model.embed(token_lists, prompt_lengths)


@pytest.fixture
def twin(bert_mean, redis_client):
    """A worker of the model files (so of the same identity as every other it builds: the vector cache and
    in-flight dedup as the settings make them), with its own loaded copy."""

    def worker(delay: float = 0.0, max_jobs: int = 1, gate=None, fail_to_one: bool = False,
               **options) -> BatchWorker:
        model = Slowed(load_model(bert_mean, served_name="m"), delay, gate, fail_to_one)
        return harness.worker(Engine(model), redis_client, max_jobs=max_jobs, **options)

    return worker


def results(redis_client, requests) -> list[Result]:
    return [Result.decode(redis_client.get(result_key(r.id))) for r in requests]


def test_twenty_identical_requests_are_served_by_the_forward_passes_of_one(twin, redis_client):
    requests = [EmbedRequest(model="m", inputs=TEXTS) for _ in range(20)]
    for request in requests:
        enqueue(redis_client, request)
    device = threading.Event()  # the leader's forward pass runs once every other request is waiting
    first, second = twin(gate=device), twin(gate=device)
    with serve(first, burst=True, stop_seconds=90), serve(second, burst=True, stop_seconds=90):
        deadline = time.monotonic() + 60
        while len(first.inflight.parked) + len(second.inflight.parked) < 19:
            assert time.monotonic() < deadline, "the 19 followers never all waited"
            time.sleep(0.01)
        device.set()

    engines = (first.engine, second.engine)
    assert sum(e.forward_rows for e in engines) == len(TEXTS)  # one request's inputs, once
    assert sum(e.forward_passes for e in engines) == 1
    assert first.inflight.attached + second.inflight.attached == 19
    answers = results(redis_client, requests)
    assert [a.id for a in answers] == [r.id for r in requests]  # each its own id and blob
    assert all(a.ok and a.data == answers[0].data and a.usage == answers[0].usage for a in answers)
    assert not redis_client.keys("embedfleet:inflight:*")  # released once the leader answered


def test_followers_run_on_their_own_when_the_leader_fails(twin, redis_client):
    leader = EmbedRequest(model="m", inputs=TEXTS)
    enqueue(redis_client, leader)
    # every pass of the leader's round fails (the engine retries a failed batch in halves down to a single
    # row, whose failure fails the request; its other rows are then skipped); no Retry on these jobs, so the
    # leader fails for good. Then the device is sound again, for followers this worker took too. Its first
    # pass is held until the followers wait.
    device = threading.Event()
    failing = twin(fail_to_one=True, gate=device)
    healthy = twin()
    with serve(failing, burst=True, stop_seconds=60):
        while not redis_client.exists(inflight_key(request_digest(failing.inflight.identity, leader))):
            time.sleep(0.01)  # the failing worker leads
        followers = [EmbedRequest(model="m", inputs=TEXTS) for _ in range(5)]
        for request in followers:
            enqueue(redis_client, request)
        with serve(healthy, burst=True, stop_seconds=60):
            deadline = time.monotonic() + 60
            while len(failing.inflight.parked) + len(healthy.inflight.parked) < len(followers):
                assert time.monotonic() < deadline, "the followers never all waited"
                time.sleep(0.01)
            device.set()

    assert Result.decode(redis_client.get(result_key(leader.id))).error_code == "internal_error"
    answers = results(redis_client, followers)
    assert all(a.ok and a.shape == (len(TEXTS), 32) for a in answers)
    assert failing.inflight.let_go + healthy.inflight.let_go == len(followers)
    assert failing.inflight.attached + healthy.inflight.attached == 0


def test_a_follower_of_a_dead_leader_runs_once_the_marker_lapses(twin, redis_client):
    """A leader whose worker died leaves its marker until INFLIGHT_TTL: the follower waits that long at
    most, then runs on its own (here the dead worker's marker is written with a 1 s TTL)."""
    worker = twin(max_jobs=8)
    followers = [EmbedRequest(model="m", inputs=TEXTS) for _ in range(3)]  # taken in one round: all wait
    marker = inflight_key(request_digest(worker.inflight.identity, followers[0]))
    redis_client.set(marker, "a" * 32, ex=1)  # the dead leader's id: no result will ever come
    for follower in followers:
        enqueue(redis_client, follower)

    burst(worker)

    assert all(answer.ok for answer in results(redis_client, followers))
    assert worker.inflight.let_go == 3 and worker.engine.forward_rows == len(TEXTS)


def test_cache_false_never_attaches(twin, redis_client):
    worker = twin()
    request = EmbedRequest(model="m", inputs=TEXTS, cache=False)
    redis_client.set(inflight_key(request_digest(worker.inflight.identity, request)), "b" * 32, ex=60)
    enqueue(redis_client, request)
    burst(worker)
    assert results(redis_client, [request])[0].ok and worker.inflight.attached == worker.inflight.let_go == 0


def test_a_stopping_worker_leaves_no_follower_parked(twin, redis_client):
    """stop() finishes every job taken: a parked follower stops waiting and runs in a last round."""
    worker = twin()
    follower = EmbedRequest(model="m", inputs=TEXTS)
    redis_client.set(inflight_key(request_digest(worker.inflight.identity, follower)), "c" * 32, ex=600)
    enqueue(redis_client, follower)
    with serve(worker):  # its exit: stop(), then the thread must end within 30 s
        deadline = time.monotonic() + 30
        while not worker.inflight.parked:
            assert time.monotonic() < deadline, "the follower was never parked"
            time.sleep(0.01)
    answer, = results(redis_client, [follower])
    assert answer.ok and worker.inflight.let_go == 1 and worker.held_count() == 0


def test_the_next_round_takes_what_the_round_on_the_device_computes(twin, redis_client):
    """The next round is prepared (and looked up) while this one is on the device, before its vectors reach
    Redis: the forward stage hands them on from memory."""
    gate = threading.Event()
    worker = twin(gate=gate, max_jobs=1)  # the first pass is held on the device until the test opens it
    first = EmbedRequest(model="m", inputs=TEXTS)
    second = EmbedRequest(model="m", inputs=TEXTS, params={"embed_dtype": "float16"})  # not the same request
    for request in (first, second):
        enqueue(redis_client, request)

    def open_when_the_next_round_waits() -> None:
        """The event, not a guess at how long preparing takes: the second round waits at the device's door
        (the take stage's hand-off to the forward stage is full) while the first is on it."""
        while not (worker.handoff is not None and worker.handoff.full()):
            time.sleep(0.01)
        gate.set()

    opener = threading.Thread(target=open_when_the_next_round_waits, daemon=True)
    opener.start()
    burst(worker)

    assert worker.engine.forward_rows == len(TEXTS) and worker.inflight.attached == 0
    assert (worker.steps.cache.hits, worker.steps.cache.misses) == (len(TEXTS), len(TEXTS))
    one, two = results(redis_client, [first, second])
    assert two.embed_dtype == "float16" and (one.embeddings.astype("float16") == two.embeddings).all()


def test_a_rounds_claims_go_with_its_cache_lookup_in_one_round_trip(twin, bert_mean, redis_url, redis_client):
    """Where the markers and the cache share one Redis client, a round's take is two round trips: the take, then
    its in-flight claims and its cache lookup together (three with the cache on a client of its own)."""
    identity = model_identity("m", folder_digest(bert_mean), "float32", "cpu")
    counting, other = (redis.Redis(connection_pool=redis.ConnectionPool.from_url(
        redis_url, connection_class=CountingConnection)) for _ in range(2))  # every send of either counted
    model = load_model(bert_mean, served_name="m")
    # caches of the test's own: one on the worker's counting client, one on a counting client of its own
    shared = harness.worker(Engine(model), counting, cache=VectorCache(counting, identity, model.caps.embedding_size))
    apart = harness.worker(Engine(model), counting, cache=VectorCache(other, identity, model.caps.embedding_size))
    counting.ping(), other.ping()  # their connections made (a new connection's set-up is not a round trip)
    sends = []
    for worker, text in ((shared, TEXTS[0]), (apart, TEXTS[1]), (shared, TEXTS[2])):
        enqueue(redis_client, EmbedRequest(model="m", inputs=[text]))
        before = CountingConnection.sends
        round_ = worker.take_round(None)
        sends.append(CountingConnection.sends - before)
        assert round_.work.texts == 1 and round_.lookup.keys and worker.inflight.leading  # claimed, looked up
    assert sends == [2, 3, 2]
    counting.close()
    other.close()


def test_a_follower_in_a_round_with_others_parks_and_they_run(twin, redis_client):
    """Claims are answered after the round is tokenised: a round where one request follows a request in flight
    elsewhere is prepared again without it; it parks, the others run, and the cache counts each input once."""
    leader = EmbedRequest(model="m", inputs=TEXTS[:2])
    # The leader's worker serves a queue of its own: its take stage runs ahead of its gated forward pass and
    # would otherwise take the follower itself (a race with `second`'s round, lost now and then under load).
    enqueue(redis_client, leader, queue="m-leader")
    device = threading.Event()
    first, second = twin(gate=device, queue=queue_name("m-leader")), twin(max_jobs=2)
    with serve(first, burst=True, stop_seconds=60):
        marker = inflight_key(request_digest(first.inflight.identity, leader))
        deadline = time.monotonic() + 60
        while redis_client.get(marker) != leader.id.encode():
            assert time.monotonic() < deadline, "the leader never claimed its marker"
            time.sleep(0.01)
        follower, other = EmbedRequest(model="m", inputs=TEXTS[:2]), EmbedRequest(model="m", inputs=TEXTS[2:5])
        enqueue(redis_client, follower)
        enqueue(redis_client, other)
        round_ = second.take_round(None)
        device.set()
    assert [job.id for job in round_.runnable] == [r.id for r in round_.work.requests] == [other.id]
    assert round_.work.texts == 3
    assert [p.request.id for p in second.inflight.parked] == [follower.id]
    assert (second.steps.cache.hits, second.steps.cache.misses) == (0, 3)  # the other's three inputs, once
