"""Rounds cut by work, and a bulk round yielding to interactive work between its forward passes (issue #20):
real Redis, the real BatchWorker and Producer, a tiny real model whose passes the test can hold. Every job is
answered exactly once; the ones a yielding round had not finished go back to their queue unrun and are
served later; the worker's learned shape shows in `embedfleet status --json`."""

from __future__ import annotations

import json
import logging
import threading
import time

import pytest
import redis

from embedfleet import Producer
from embedfleet.common.protocol import keys, rqkeys
from tests.commands import clean_env, embedfleet
from tests.harness import burst, idle_worker, serve
from tests.heldpasses import Recorded
from embedfleet.worker.engine.engine import Engine
from embedfleet.worker.engine.models.loader import load_model
from embedfleet.worker.engine.shaper import Shape, Shaper

MODEL = "yield"


@pytest.fixture
def tiny(bert_mean):
    return load_model(bert_mean, served_name=MODEL)


def words(i: int, n: int = 6) -> str:
    vocabulary = "red green blue fast slow cat dog river hill cloud paper stone wind lake".split()
    return " ".join(vocabulary[(i * 7 + j) % len(vocabulary)] for j in range(n)) + f" {i}"


def test_a_bulk_round_pauses_between_passes_for_interactive_work_and_every_job_is_answered_once(
        tiny, redis_url, redis_client):
    first, second = threading.Event(), threading.Event()
    model = Recorded(tiny, {1: first, 3: second})
    engine = Engine(model, max_batch_tokens=64, max_batch_size=4)  # 4 rows a pass: 8 passes a 32-text request
    # --rq-records full: the served jobs' `deliveries` is how this test sees that none ran twice
    worker = idle_worker(engine, redis_client, max_jobs=64, rq_records="full")
    with Producer(redis_url) as producer:
        bulk = producer.submit_many([[words(32 * r + t) for t in range(32)] for r in range(3)], MODEL,
                                    priority="bulk")
        with serve(worker, burst=True, stop_seconds=60):  # its exit: the burst's thread ended
            try:
                assert model.waiting[1].wait(60)  # the first bulk round's second pass is on the device
                interactive = producer.submit(["an interactive question"], MODEL)
                first.set()
                assert model.waiting[3].wait(60)  # two passes later: by now the take stage was told to take it
                question = tiny.tokenizer("an interactive question")["input_ids"]
                deadline = time.monotonic() + 60
                while not (any(question in batch for batch in model.passes)  # it ran already, or it waits
                           or any(not ready.lower for ready in worker.handoff.waiting())):
                    assert time.monotonic() < deadline, "the interactive request was never taken and prepared"
                    time.sleep(0.005)
                second.set()
                answer = producer.wait(interactive, timeout=60)
                results = [producer.wait(request_id, timeout=60) for request_id in bulk]
            finally:
                first.set()
                second.set()
    assert answer.ok and all(result.ok and result.shape == (32, 32) for result in results)
    # The interactive request ran between two passes of the bulk round on the device, which then went on
    # where it had paused: its rows come both before and after the interactive pass.
    position = next(i for i, batch in enumerate(model.passes) if question in batch)
    paused_round = {tuple(ids) for ids in tiny.tokenizer([words(t) for t in range(32)])["input_ids"]}
    own = [i for i, batch in enumerate(model.passes) if paused_round & {tuple(ids) for ids in batch}]
    assert own[0] < position < own[-1] and position + 1 in own, (own, position)  # it went on right after
    for request_id in [interactive, *bulk]:  # answered once, on every path a waiter listens to
        assert redis_client.lrange(keys.notify_key(request_id), 0, -1) == [b"1"]
    assert all(redis_client.hget(rqkeys.rq_job_key(r), "deliveries") == b"1" for r in bulk)  # none run twice
    assert redis_client.zcard(rqkeys.rq_wip_key(keys.queue_name(MODEL, "bulk"))) == 0
    assert redis_client.get(keys.queued_tokens_key(keys.queue_name(MODEL, "bulk"))) is None


def test_the_bulk_share_round_keeps_its_turn_and_interactive_work_still_runs_between_passes(
        tiny, redis_url, redis_client, caplog):
    """The share's round (the bulk round taken while interactive work was queued, so that bulk is never
    starved) is prepared while another bulk round is on the device: it is set aside, not sent back to its
    queue; the interactive round runs between two passes of the round on the device, the share's round next."""
    caplog.set_level(logging.DEBUG, logger="embedfleet.worker")
    gate = threading.Event()
    model = Recorded(tiny, {1: gate})
    engine = Engine(model, max_batch_tokens=64, max_batch_size=4)
    worker = idle_worker(engine, redis_client, max_jobs=1, bulk_share=2,  # round 2 of 2: bulk first
                         rq_records="full")  # the served jobs' `deliveries`: none ran twice
    levels, may_take = worker.levels, threading.Event()
    real_take = levels.take

    def take(*args, **kwargs):  # the real take; the share's round (the second) only once the test says so
        if levels.rounds == 1:
            assert may_take.wait(60), "the test never let the second round be taken"
        return real_take(*args, **kwargs)

    levels.take = take
    texts = [[words(32 * r + t, n=6 + 6 * r) for t in range(32)] for r in range(2)]  # told apart by length
    lengths = [{len(ids) for ids in tiny.tokenizer(request)["input_ids"]} for request in texts]
    assert not lengths[0] & lengths[1]
    with Producer(redis_url) as producer:
        first, second = producer.submit_many(texts, MODEL, priority="bulk")
        with serve(worker, burst=True, stop_seconds=60):  # its exit: the burst's thread ended
            try:
                assert model.waiting[1].wait(60)  # the first bulk round's second pass is on the device
                interactive = producer.submit(["an interactive question"], MODEL)
                may_take.set()  # the share's round: bulk first, though interactive work is queued
                deadline = time.monotonic() + 60
                while not any(ready.lower and not ready.preemptible for ready in worker.handoff.waiting()):
                    assert time.monotonic() < deadline, "the share's round was never prepared"
                    time.sleep(0.005)
                gate.set()
                results = [producer.wait(request_id, timeout=60) for request_id in (interactive, first, second)]
            finally:
                may_take.set()
                gate.set()
    assert all(result.ok for result in results)
    question = tiny.tokenizer("an interactive question")["input_ids"]
    position = next(i for i, batch in enumerate(model.passes) if question in batch)

    def passes_of(r: int) -> list[int]:
        return [i for i, batch in enumerate(model.passes) if lengths[r] & {len(ids) for ids in batch}]

    paused, share = passes_of(0), passes_of(1)
    assert paused[0] < position < paused[-1] < share[0], (paused, position, share)
    assert "interactive work arrived" not in caplog.text  # the share's round was set aside, not sent back
    for request_id in (interactive, first, second):
        assert redis_client.lrange(keys.notify_key(request_id), 0, -1) == [b"1"]
        assert redis_client.hget(rqkeys.rq_job_key(request_id), "deliveries") == b"1"


def test_a_round_holds_a_few_passes_of_work_not_a_fixed_number_of_requests(tiny, redis_url, redis_client):
    engine = Engine(tiny, max_batch_tokens=128, max_batch_size=64)
    worker = idle_worker(engine, redis_client, max_jobs=64)
    with Producer(redis_url) as producer:
        ids = producer.submit_many([[words(16 * r + t) for t in range(16)] for r in range(40)], MODEL)
        round_ = worker.take_round(None)
        taken = round_.size
        worker.finishing.release(round_)
        worker.levels.give_back(round_.runnable)
        # 16 passes of 128 tokens (2,048 estimated tokens) hold about 13 of these 16-text requests, not 40
        assert 1 <= taken < len(ids)
        burst(engine, redis_client, max_jobs=64)  # a worker of its own
        assert all(producer.wait(request_id, timeout=60).ok for request_id in ids)


def test_the_learned_shape_shows_in_status(tiny, redis_url, redis_client, tmp_path):
    shaper = Shaper(Shape(256, 4), min_tokens=64, max_tokens=4096, max_rows=64, source="probe")
    worker = idle_worker(Engine(tiny, shaper=shaper), redis_client, max_jobs=64, heartbeat_interval=0.2)
    with Producer(redis_url) as producer:
        ids = producer.submit_many([[words(8 * r + t) for t in range(8)] for r in range(20)], MODEL)
        with serve(worker):
            assert all(producer.wait(request_id, timeout=60).ok for request_id in ids)
            env = clean_env(tmp_path / "cache", EMBEDFLEET_REDIS_URL=redis_url)
            deadline = time.monotonic() + 30
            while True:  # the next beat publishes what the passes taught it
                done = embedfleet("status", "--json", env=env)
                assert done.returncode == 0, done.stderr
                [seen] = json.loads(done.stdout)["workers"]
                if "pass_tokens_per_s" in seen or time.monotonic() > deadline:
                    break
                time.sleep(0.2)
    assert (seen["max_batch_tokens"], seen["max_batch_size"]) == (shaper.current.tokens, shaper.current.rows)
    assert seen["pass_tokens_per_s"] > 0 and "learned" in seen["budget_source"]
    redis.Redis.from_url(redis_url).close()
