"""The pipelined worker: no job lost or answered twice under a mix of sizes, errors and cancels; registries
that agree; a bounded prefetch with a deep queue; `rq suspend`; the start-up probe; the null model."""

from __future__ import annotations

import subprocess
import sys
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rq import Worker
from rq.job import JobStatus
from rq.suspension import resume, suspend

from embedfleet.common.protocol.keys import notify_key, result_key
from embedfleet.common.protocol.records import RQ_RECORDS
from embedfleet.common.request import EmbedRequest
from embedfleet.common.result import Result
from tests import harness
from tests.harness import burst, serve
from tests.commands import wait_for
from tests.heldpasses import GatedEngine
from tests.rqjobs import enqueue, rq_queue
from tests.tinymodels import sample_texts
from embedfleet.worker.engine.engine import Engine
from embedfleet.worker.engine.models.loader import load_model
from embedfleet.worker.engine.models.nullmodel import NullModel
from embedfleet.worker.engine.probe import choose, probe_budget


@pytest.fixture(scope="module")
def tiny(bert_cls):
    return Engine(load_model(bert_cls, served_name="tiny"), max_batch_tokens=256, max_batch_size=8)


JOB = st.tuples(st.sampled_from(["ok", "ok", "ok", "invalid", "garbage", "cancelled", "other_model"]),
                st.integers(1, 5))


@settings(max_examples=8, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(jobs=st.lists(JOB, min_size=1, max_size=40), max_jobs=st.integers(1, 7), records=st.sampled_from(RQ_RECORDS))
def test_no_job_is_lost_or_answered_twice(tiny, redis_client, jobs, max_jobs, records):
    redis_client.flushall()
    texts = sample_texts(5, seed=len(jobs))
    expected: dict[str, str] = {}
    for kind, size in jobs:
        request = EmbedRequest(model="other" if kind == "other_model" else "tiny", inputs=texts[:size],
                               params={"dimensions": 8} if kind == "invalid" else {},
                               reply_to="embedfleet:replies:mix")
        # every job on tiny's queue, whatever model its request names
        job = enqueue(redis_client, request, *([b"garbage"] if kind == "garbage" else []), queue="tiny")
        if kind == "cancelled":
            job.set_status(JobStatus.CANCELED)
        expected[request.id] = kind

    worker = harness.worker(tiny, redis_client, max_jobs=max_jobs, rq_records=records)
    burst(worker)

    queue = rq_queue(redis_client, "tiny")
    finished = set(queue.finished_job_registry.get_job_ids())
    if records == "lean":  # no finished registry: a served job's record is its answer, its hash is gone
        assert not finished
        finished = {i for i in expected
                    if redis_client.exists(result_key(i)) and not redis_client.exists(f"rq:job:{i}")}
    failed = set(queue.failed_job_registry.get_job_ids())
    canceled = set(queue.canceled_job_registry.get_job_ids())
    assert not finished & failed and not (finished | failed) & canceled
    assert finished | failed | canceled == set(expected)
    assert queue.started_job_registry.get_job_ids() == [] and len(queue) == 0
    replies = [fields[b"id"].decode() for _, fields in redis_client.xrange("embedfleet:replies:mix")]
    answered_on_stream = {i for i, kind in expected.items() if kind not in ("garbage", "other_model")}
    for request_id, kind in expected.items():  # answered once, on one path: the stream, or else the list
        assert redis_client.llen(notify_key(request_id)) == (request_id not in answered_on_stream), kind
        answer = Result.decode(redis_client.get(result_key(request_id)))
        code = {"ok": None, "invalid": "invalid_request", "garbage": "decode_error", "cancelled": "cancelled",
                "other_model": "invalid_request"}[kind]
        assert answer.error_code == code, (kind, answer.error_message)
        assert request_id in {"ok": finished, "invalid": finished, "garbage": failed, "cancelled": canceled,
                              "other_model": failed}[kind]
    assert sorted(replies) == sorted(answered_on_stream)  # each once; no reply_to is trusted from bad data
    seen = Worker.find_by_key(worker.key, redis_client)  # rq keeps a stopped worker's hash for 60 s
    assert seen.successful_job_count == (len(finished) if records == "full" else 0)
    assert seen.failed_job_count == len(failed)


@pytest.mark.parametrize("records", RQ_RECORDS)
def test_a_deep_queue_costs_the_worker_only_its_prefetch_bound(tiny, redis_client, records):
    requests = [EmbedRequest(model="tiny", inputs=[text]) for text in sample_texts(300, seed=3)]
    for request in requests:
        enqueue(redis_client, request)
    gated = GatedEngine(tiny)
    queue = rq_queue(redis_client, "tiny")
    # its exit: stop() and the join
    with serve(gated, redis_client, max_jobs=8, stop_seconds=20, rq_records=records) as worker:
        try:
            assert gated.entered.wait(10)
            wait_for(lambda: worker.held_count() == 16)  # one round on the device, the next one prepared
            time.sleep(0.5)  # ... and no more, however long the device takes
            assert worker.held_count() == 16 and len(queue.started_job_registry.get_job_ids()) == 16
            assert len(queue) == 300 - 16
            info = rq_info(redis_client)  # `rq info` reads the same truth
            assert f"queue {queue.name} {300 - 16}, 16 executing, 0 finished, 0 failed" in info, info
            assert f"worker {worker.name} (" in info and ") busy " in info, info
        finally:
            gated.release.set()
    assert queue.started_job_registry.get_job_ids() == []  # a stop finishes what it took ...
    served = sum(bool(redis_client.exists(result_key(r.id))) for r in requests)
    assert served >= 16 and len(queue) == 300 - served  # ... and leaves the rest queued
    shown = served if records == "full" else 0  # lean keeps no finished registry: `rq info` counts none
    assert f"queue {queue.name} {300 - served}, 0 executing, {shown} finished, 0 failed" in rq_info(redis_client)


def rq_info(conn) -> str:
    """`rq info --raw` as an operator runs it."""
    kwargs = conn.connection_pool.connection_kwargs
    done = subprocess.run([sys.executable, "-m", "rq.cli", "info", "--raw", "--url",
                           f"redis://{kwargs['host']}:{kwargs['port']}/0", "--serializer",
                           "embedfleet.common.serializer.MsgpackSerializer"], capture_output=True, text=True,
                           timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_rq_suspend_pauses_the_worker_and_resume_restarts_it(tiny, redis_client):
    suspend(redis_client)
    request = EmbedRequest(model="tiny", inputs=["paused"])
    enqueue(redis_client, request)
    with serve(tiny, redis_client, stop_seconds=10):
        try:
            wait_for(lambda: [w.get_state() for w in Worker.all(connection=redis_client)] == ["suspended"])
            assert not redis_client.exists(result_key(request.id)) and len(rq_queue(redis_client, "tiny")) == 1
            resume(redis_client)
            wait_for(lambda: redis_client.exists(result_key(request.id)))
        finally:
            resume(redis_client)
    assert Result.decode(redis_client.get(result_key(request.id))).ok


def test_the_probe_picks_a_budget_within_its_bounds_and_flags_win(bert_cls):
    model = load_model(bert_cls, served_name="tiny")
    probed = probe_budget(model, seconds=1.0, limit_tokens=2048, limit_rows=32)
    assert probed.source == "probe"
    assert model.caps.max_model_len <= probed.max_batch_tokens <= 2048 and 1 <= probed.max_batch_size <= 32
    assert probed.texts_per_s and all(rate > 0 for rate in probed.texts_per_s.values())
    assert probe_budget(model, max_tokens=1000, max_rows=7) == probe_budget(model, max_tokens=1000, max_rows=7)
    fixed = probe_budget(model, max_tokens=1000, max_rows=7)
    assert (fixed.max_batch_tokens, fixed.max_batch_size, fixed.source) == (1000, 7, "flags")
    half = probe_budget(model, seconds=0.5, max_rows=3, limit_tokens=1024)
    assert half.max_batch_size == 3 and half.source == "probe+flags"


def test_choose_follows_the_measured_curves():
    # A CPU-like device: texts/s peaks at a few rows, later falls.
    cpu = {16: {1: 100, 2: 180, 4: 260, 8: 300, 16: 280, 32: 250},
           256: {1: 20, 2: 30, 4: 33, 8: 28, 16: 20}}
    budget, cap = choose(cpu)
    assert cap >= 8 and budget // 256 in (4, 5, 6, 7)
    # A GPU-like device: more rows are always faster.
    gpu = {16: {r: 1000 * r for r in (1, 2, 4, 8, 16, 32, 64, 128, 256)},
           256: {r: 300 * r for r in (1, 2, 4, 8, 16, 32, 64)}}
    budget, cap = choose(gpu)
    assert cap == 256 and budget >= 64 * 256
    assert choose(gpu, max_tokens=4096) == (4096, 256)  # a fixed budget stays, the cap is still chosen
    assert choose(cpu, max_rows=2)[1] == 2


def test_the_null_model_answers_unit_vectors_through_the_whole_path(redis_client):
    engine = Engine(NullModel("null:16", "null"), max_batch_tokens=1 << 20, max_batch_size=4096)
    requests = [EmbedRequest(model="null", inputs=["a"] * n, params=params)
                for n, params in ((1, {}), (3, {"dimensions": 8}), (2, {"embed_dtype": "float16"}))]
    for request in requests:
        enqueue(redis_client, request)
    burst(engine, redis_client)
    for request in requests:
        result = Result.decode(redis_client.get(result_key(request.id)))
        width = request.params.dimensions or 16
        assert result.embeddings.shape == (len(request.inputs), width)
        np.testing.assert_allclose(np.linalg.norm(result.embeddings.astype(np.float32), axis=1), 1, rtol=1e-3)
        assert result.usage.prompt_tokens == len(request.inputs)
    with pytest.raises(ValueError, match="null:<dimensions>"):
        NullModel("null:abc")
