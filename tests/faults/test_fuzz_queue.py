"""Fuzz (hypothesis, bounded): whatever lands on a model's queue, and whatever fields a producer passes, the
worker stays up, the good requests beside them are served, and each bad message ends with an error result
or a clear submit-time error; nothing stays started."""

from __future__ import annotations

import zlib

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from embedfleet.common.codec import packb
from embedfleet.common.errors import EmbedfleetError
from embedfleet.common.protocol.jobdata import JOB_FUNC
from embedfleet.common.protocol.keys import result_key
from embedfleet.common.request import EmbedRequest
from embedfleet.common.result import Result
from embedfleet import Producer
from tests import harness
from tests.harness import burst
from tests.rqjobs import enqueue, rq_queue
from embedfleet.worker.engine.engine import Engine
from embedfleet.worker.engine.models.nullmodel import NullModel

MODEL = "fuzz"
FUZZ = settings(max_examples=25, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                        HealthCheck.too_slow])

scalars = st.one_of(st.none(), st.booleans(), st.integers(-2**63, 2**64 - 1), st.floats(allow_nan=True),
                    st.text(max_size=20), st.binary(max_size=20))
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
    st.text(max_size=8), inner, max_size=4), max_leaves=30)
deep = st.integers(1, 100_000).map(lambda depth: b"\x91" * depth + b"\x90")  # msgpack [[[...[]...]]]
request_maps = st.fixed_dictionaries({}, optional={
    "id": st.text(max_size=70), "model": st.sampled_from([MODEL, "other", ""]) | st.text(max_size=5),
    "inputs": st.lists(st.text(max_size=30) | st.lists(st.integers(-5, 2**40), max_size=5), max_size=5) | values,
    "params": st.dictionaries(st.sampled_from(["dimensions", "embed_dtype", "normalize", "endianness",
                                               "truncate_prompt_tokens", "bogus"]), values, max_size=3) | values,
    "reply_to": st.text(max_size=30) | values})
# What a hostile writer may leave as a job's `data`; None: the job hash has no data (failed with that reason);
# "gone": no job hash (dropped).
payloads = st.one_of(
    st.binary(max_size=200),
    values.map(lambda v: zlib.compress(packb(v))),
    deep.map(zlib.compress),
    deep.map(lambda v: zlib.compress(packb([JOB_FUNC, None, [v], {}]))),
    request_maps.map(lambda m: zlib.compress(packb([JOB_FUNC, None, [packb(m)], {}]))),
    st.binary(max_size=100).map(lambda b: zlib.compress(packb([JOB_FUNC, None, [b], {}]))),
    st.just(None), st.just("gone"))


def null_engine() -> Engine:
    return Engine(NullModel("null:4", MODEL, max_inputs=64), max_batch_tokens=1 << 16, max_batch_size=512)


@FUZZ
@given(bad=st.lists(payloads, min_size=1, max_size=6), seed=st.integers(0, 2**32 - 1))
def test_raw_queue_payloads_fail_alone_and_the_worker_stays_up(redis_client, bad, seed):
    queue = rq_queue(redis_client, MODEL)
    good = [EmbedRequest(model=MODEL, inputs=[f"good {seed} {i}"]) for i in range(3)]
    enqueue(redis_client, good[0])
    hostile = []
    for data in bad:
        request = EmbedRequest(model=MODEL, inputs=["placeholder"])
        job = enqueue(redis_client, request)
        if data == "gone":
            redis_client.delete(job.key)
        elif data is None:
            redis_client.hdel(job.key, "data")
        else:
            redis_client.hset(job.key, "data", data)
        hostile.append((request.id, data))
    for request in good[1:]:
        enqueue(redis_client, request)

    burst(null_engine(), redis_client, max_jobs=64)  # returns: no stage died

    for request in good:
        result = Result.decode(redis_client.get(result_key(request.id)))
        assert result.ok and result.embeddings.shape == (1, 4)
    for job_id, data in hostile:
        raw = redis_client.get(result_key(job_id))
        if data == "gone":  # nothing to answer: no job, no request; dropped, never started
            continue
        answer = Result.decode(raw)  # an answer each: an error, or (a well-formed request) its vectors
        assert answer.ok or (answer.error_code and answer.error_message), answer
    assert len(queue) == 0 and redis_client.zcard(queue.started_job_registry.key) == 0


fields = st.fixed_dictionaries({}, optional={
    "dimensions": st.none() | st.integers(-3, 10) | st.text(max_size=3),
    "embed_dtype": st.sampled_from(["float32", "float16", "bfloat16", "int8", "binary", "ubinary", "x"]),
    "endianness": st.sampled_from(["native", "big", "little", "middle"]),
    "truncate_prompt_tokens": st.none() | st.integers(-3, 5),
    "normalize": st.booleans() | st.just("yes"),
    "use_activation": st.booleans() | st.none()})
inputs = st.one_of(
    st.text(max_size=50), st.lists(st.text(max_size=30), max_size=4),
    st.lists(st.lists(st.integers(-3, 2**33), max_size=4), max_size=3),
    st.just("\x00nul\x00"), st.just("\ud800 lone surrogate"), st.just([]), st.just(["x"] * 100_000),
    st.just("long " * 50_000), values)


@FUZZ
@given(inputs=inputs, fields=fields)
def test_request_fields_end_in_a_result_or_a_clear_submit_time_error(redis_url, redis_client, inputs, fields):
    worker = harness.idle_worker(null_engine(), redis_client, max_jobs=64)  # serves once the request is queued
    with Producer(redis_url) as producer:
        try:
            request_id = producer.submit(inputs, MODEL, **fields)
        except EmbedfleetError as exc:  # refused before enqueue: a code and a message that says what
            assert exc.code and exc.message and "Traceback" not in exc.message
            return
        burst(worker)
        result = producer.get(request_id)
    assert result is not None
    if result.ok:
        assert result.embeddings.shape[0] == len(inputs if isinstance(inputs, list) else [inputs])
        assert np.isfinite(result.embeddings.astype(np.float32)).all()
    else:
        assert result.error_code and result.error_message
