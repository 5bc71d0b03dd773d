"""Priority levels and deadlines (issue #10): per-level rq queues of one model taken highest first with a
bounded share for bulk, requests past their deadline answered `expired` and never computed, and each
job recovered, returned or cancelled on its own level's queue. Real Redis, real rq, the real BatchWorker
and Producer on the null model (ordering, not vectors, is under test)."""

from __future__ import annotations

import threading
import time
from datetime import datetime, timezone

import pytest
from rq import Queue
from rq.job import Job, JobStatus

from embedfleet.common.errors import ExpiredError, ValidationError
from embedfleet.common.protocol import keys
from embedfleet.common.request import EmbedRequest
from embedfleet.common.scheduling import estimate_tokens, priority_level
from embedfleet.common.serializer import MsgpackSerializer
from embedfleet import Producer
from tests import harness
from tests.harness import burst, serve
from tests.commands import wait_for
from embedfleet.worker.engine.engine import Engine
from embedfleet.worker.engine.models.nullmodel import NullModel
from embedfleet.worker.serving import levels as levels_module
from embedfleet.worker.serving.pipeline import BatchWorker
from embedfleet.common.protocol.records import rq_time

MODEL = "prio"
INTERACTIVE, BULK = keys.queue_name(MODEL), keys.queue_name(MODEL, "bulk")


@pytest.fixture
def engine():
    return Engine(NullModel("null:8", MODEL))


@pytest.fixture
def producer(redis_url):
    with Producer(redis_url) as producer:
        yield producer


def advertised(engine, conn, **options) -> BatchWorker:
    """A registered, advertised worker that has not started serving: requests stay queued. It keeps rq's full
    records: the finished registry and the jobs' `ended_at` are how these tests see the order served."""
    return harness.idle_worker(engine, conn, rq_records="full", **options)


class DeviceTime:
    """The real engine whose forward step also takes `seconds`, as a device's would: the null model alone
    serves a backlog of thousands before a test can submit behind it. Without a forward-pass shape: its rounds
    are cut by request count (max_jobs) alone."""

    shaper = None

    def shape(self):
        return None

    def __init__(self, engine, seconds: float):
        self.engine, self.caps, self.model, self.seconds = engine, engine.caps, engine.model, seconds
        self.prepare, self.finish, self.combine_parts = engine.prepare, engine.finish, engine.combine_parts

    def forward(self, work, between=None, **known):
        time.sleep(self.seconds)
        return self.engine.forward(work, between, **known)


def rq(conn, name: str) -> Queue:
    return Queue(name, connection=conn, serializer=MsgpackSerializer)


def ended_at(conn, ids: list[str]) -> dict[str, str]:
    """rq's ended_at of each job (one iso stamp per finished round, so rounds compare as strings)."""
    with conn.pipeline(transaction=False) as pipe:
        for request_id in ids:
            pipe.hget(Job.key_for(request_id), "ended_at")
        return {i: raw.decode() if raw else "" for i, raw in zip(ids, pipe.execute())}


def test_priority_maps_names_and_vllm_integers_onto_the_levels():
    assert [priority_level(p) for p in (None, "interactive", "bulk", 0, -5, 1, 10)] == \
        ["interactive", "interactive", "bulk", "interactive", "interactive", "bulk", "bulk"]
    for bad in ("urgent", 1.5, True, [1]):
        with pytest.raises(ValidationError, match="`priority` must be one of 'interactive', 'bulk'") as err:
            priority_level(bad)
        assert err.value.param == "priority"


def test_each_level_is_its_own_rq_queue_and_rq_shows_the_jobs(engine, producer, redis_client):
    worker = advertised(engine, redis_client)
    bulk_ids = producer.submit_many([["b1"], ["b2"]], MODEL, priority="bulk")
    vllm_bulk = producer.submit(["b3"], MODEL, priority=3)
    interactive = producer.submit(["i1"], MODEL, priority=-1)
    assert rq(redis_client, BULK).job_ids == [*bulk_ids, vllm_bulk]
    assert rq(redis_client, INTERACTIVE).job_ids == [interactive]
    assert {q.name for q in worker.queues} == {INTERACTIVE, BULK}  # `rq info` lists the worker on both

    suspended, taken = worker.levels.take(10, None)  # highest first, and a round comes from one level
    assert not suspended and [(t.id, t.queue) for t in taken] == [(interactive, INTERACTIVE)]
    suspended, taken = worker.levels.take(10, None)
    assert not suspended and [(t.id, t.queue) for t in taken] == [(i, BULK) for i in [*bulk_ids, vllm_bulk]]
    assert sorted(rq(redis_client, BULK).started_job_registry.get_job_ids()) == sorted([*bulk_ids, vllm_bulk])
    assert rq(redis_client, INTERACTIVE).started_job_registry.get_job_ids() == [interactive]


def test_recover_return_and_cancel_put_a_job_back_on_its_own_queue(engine, producer, redis_client):
    advertised(engine, redis_client)
    first, second, third = producer.submit_many([["a"], ["b"], ["c"]], MODEL, priority="bulk")
    interactive = producer.submit(["i"], MODEL)
    dead = harness.worker(engine, redis_client, lease_seconds=0.2)
    _, taken = dead.levels.take(3, None)  # interactive (a round of its own), then bulk's first two
    _, more = dead.levels.take(2, None)
    assert [t.id for t in taken + more] == [interactive, first, second]
    time.sleep(0.3)  # the lease lapses: a live worker requeues each job on its own level
    assert sorted(r.id for r in advertised(engine, redis_client).levels.recover()) == sorted([interactive, first,
                                                                                             second])
    requeued = rq(redis_client, BULK).job_ids  # at the head (claims of one take lapse together: any order)
    assert sorted(requeued[:2]) == sorted([first, second]) and requeued[2:] == [third]
    assert rq(redis_client, INTERACTIVE).job_ids == [interactive]

    draining = harness.worker(engine, redis_client)
    _, taken = draining.levels.take(3, None)
    _, more = draining.levels.take(2, None)
    assert draining.levels.give_back(taken + more) == 3
    assert rq(redis_client, BULK).job_ids == requeued  # in the order they were taken
    assert rq(redis_client, INTERACTIVE).job_ids == [interactive]

    assert producer.cancel(second) and producer.status(second) == "cancelled"
    assert rq(redis_client, BULK).job_ids == [i for i in requeued if i != second]


def test_a_deep_bulk_backlog_lets_an_interactive_request_through_within_a_few_rounds(engine, producer,
                                                                                         redis_client):
    worker = advertised(DeviceTime(engine, 0.01), redis_client, max_jobs=8)
    bulk = producer.submit_many([[f"bulk {i}"] for i in range(3000)], MODEL, priority="bulk")
    with serve(worker):
        wait_for(lambda: redis_client.zcard(f"rq:finished:{BULK}") >= 16)  # the backlog is being served
        submitted = rq_time(datetime.now(timezone.utc))
        interactive = producer.submit(["now, please"], MODEL)
        assert producer.wait(interactive, 30).ok
    served_at = ended_at(redis_client, [interactive])[interactive]
    bulk_ended = {i: stamp for i, stamp in ended_at(redis_client, bulk).items() if stamp}
    rounds_between = {stamp for stamp in bulk_ended.values() if submitted < stamp < served_at}
    # the rounds it found being finished and on the device (a prepared bulk round yields to it), one more
    # if a take raced its submit; a bulk-first round of the share at most once: never the backlog's hundreds
    assert len(rounds_between) <= 4, sorted(rounds_between)
    assert len(bulk) - sum(stamp < served_at for stamp in bulk_ended.values()) > 2000  # it jumped the queue


def test_bulk_gets_its_bounded_share_while_interactive_traffic_runs(engine, producer, redis_client):
    advertised(engine, redis_client)
    bulk = producer.submit_many([[f"bulk {i}"] for i in range(400)], MODEL, priority="bulk")
    interactive = producer.submit_many([[f"interactive {i}"] for i in range(400)], MODEL)
    assert burst(engine, redis_client, max_jobs=10, bulk_share=4, rq_records="full")
    last_interactive = max(ended_at(redis_client, interactive).values())
    bulk_before = sum(stamp < last_interactive for stamp in ended_at(redis_client, bulk).values())
    # one round in 4 reads bulk first: about 400 / 3 bulk jobs are served while interactive drains, and
    # interactive takes the other three rounds in four
    assert 100 <= bulk_before <= 160, bulk_before
    assert producer.wait(bulk[-1], 10).ok and producer.wait(interactive[-1], 10).ok


def test_an_expired_request_is_never_computed_and_its_waiter_gets_expired(engine, producer, redis_client):
    advertised(engine, redis_client)
    late = producer.submit(["too late"], MODEL, timeout=0.2)
    late_bulk = producer.submit(["too late too"], MODEL, priority="bulk", deadline=time.time() + 0.2)
    on_time = producer.submit(["in time"], MODEL, timeout=60)
    time.sleep(0.3)
    passes = engine.forward_passes
    assert burst(engine, redis_client)
    assert engine.forward_passes - passes == 1  # one pass, for the request still in time
    for request_id, queue in ((late, INTERACTIVE), (late_bulk, BULK)):
        with pytest.raises(ExpiredError, match="still queued .* after its deadline") as err:
            producer.wait(request_id, 5)
        assert err.value.code == "expired"
        job = Job.fetch(request_id, connection=redis_client, serializer=MsgpackSerializer)
        assert job.get_status() == JobStatus.FAILED  # `rq info` counts it failed
        assert request_id in rq(redis_client, queue).failed_job_registry.get_job_ids()
    assert producer.wait(on_time, 5).ok


def test_a_deadline_already_past_or_a_bad_timeout_fails_at_submit(engine, producer, redis_client):
    advertised(engine, redis_client)
    with pytest.raises(ValidationError, match="has already passed") as err:
        producer.submit(["x"], MODEL, deadline=time.time() - 1)
    assert err.value.param == "deadline"
    for bad in (0, -1, float("nan"), "soon"):
        with pytest.raises(ValidationError, match="`timeout` must be a positive number of seconds"):
            producer.submit(["x"], MODEL, timeout=bad)
    assert redis_client.llen(f"rq:queue:{INTERACTIVE}") == 0


def test_queued_tokens_follow_submit_take_cancel_and_requeue(engine, producer, redis_client):
    advertised(engine, redis_client)
    counter = keys.queued_tokens_key(BULK)
    texts = [["a" * 40, "b" * 8], ["c" * 400], ["d"]]
    ids = producer.submit_many(texts, MODEL, priority="bulk")
    estimates = [estimate_tokens(EmbedRequest(model=MODEL, inputs=t)) for t in texts]
    assert estimates == [40 // 4 + 2 + 8 // 4 + 2, 400 // 4 + 2, 0 + 2]
    assert int(redis_client.get(counter)) == sum(estimates)
    assert producer.cancel(ids[2])
    assert int(redis_client.get(counter)) == estimates[0] + estimates[1]
    worker = harness.worker(engine, redis_client, lease_seconds=0.2)
    _, taken = worker.levels.take(1, None)
    assert int(redis_client.get(counter)) == estimates[1]
    assert worker.levels.give_back(taken) == 1
    assert int(redis_client.get(counter)) == estimates[0] + estimates[1]
    worker.levels.take(10, None)
    assert redis_client.get(counter) is None  # the queue is empty: no estimate left (and no drift)


def test_bulk_waits_for_a_model_scaled_to_zero_while_interactive_is_told_no_worker(engine, producer,
                                                                                  redis_client):
    from embedfleet.common.errors import NoWorkerError, UnknownModelError

    gone = advertised(engine, redis_client)
    gone.advertiser.withdraw()  # the model is known, no worker serves it now (scaled to zero)
    with pytest.raises(NoWorkerError, match="has no live worker"):
        producer.submit(["now"], MODEL)
    with pytest.raises(UnknownModelError):
        producer.submit(["typo"], "no-such-model", priority="bulk")
    queued = producer.submit(["later"], MODEL, priority="bulk")
    assert rq(redis_client, BULK).job_ids == [queued]
    assert burst(engine, redis_client)  # the autoscaler started one
    assert producer.wait(queued, 5).embeddings.shape == (1, 8)


def test_an_idle_worker_in_the_shares_round_waits_on_the_interactive_queue(engine, producer, redis_client,
                                                                          monkeypatch):
    """All levels empty: the take waits on the highest level's queue, also in the round that reads bulk first
    (it used to wait on the bulk queue there, and an interactive request sat out the whole wait)."""
    monkeypatch.setattr(levels_module, "LOWER_LEVEL_POLL", 60.0)  # a wait on the wrong queue would last 60 s
    worker = advertised(engine, redis_client, bulk_share=2)  # the second round reads bulk first
    first = producer.submit(["before"], MODEL)
    assert [t.id for t in worker.levels.take(8, None)[1]] == [first]
    assert worker.levels.rounds % 2 == 1  # the next round is the share's
    taken: list = []
    thread = threading.Thread(target=lambda: taken.extend(worker.levels.take(8, 60)[1]), daemon=True)
    thread.start()
    wait_for(lambda: any(c.get("cmd") == "blmove" for c in redis_client.client_list()), 10)
    second = producer.submit(["an interactive question"], MODEL)
    thread.join(30)  # the wait ends with the push (the 60 s bound is never reached)
    assert not thread.is_alive() and [t.id for t in taken] == [second]
