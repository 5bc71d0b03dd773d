"""Head-of-line (issue 36, item 4): a request of 2,048 inputs (the gateway's most) is one round of many forward
passes; a one-text request sent behind it runs between two of them and is answered first, and the big one
goes on where it paused (nothing run twice). A real worker process on all-MiniLM-L6-v2, and in process a tiny
real model whose passes the test holds; a real Redis; the order of events is asserted, not a wall-clock figure."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

from embedfleet import Producer
from embedfleet.common.protocol import keys, rqkeys
from tests.commands import ROOT
from tests.harness import serve
from tests.heldpasses import Recorded
from tests.tinymodels import sample_texts
from embedfleet.worker.engine.engine import Engine
from embedfleet.worker.engine.models.loader import load_model
from embedfleet.worker.serving.yielding import CUT_IN_PASSES

MODEL = "minilm"


def wait_for(check, timeout: float, what: str, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert proc.poll() is None, f"the worker exited with {proc.returncode} waiting for {what}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def test_a_one_text_request_behind_a_2048_input_one_is_answered_first(redis_url, redis_client, minilm_path):
    # a pinned shape of 64 rows: the big request is 32 passes (its own round), whatever the probe would pick
    proc = subprocess.Popen([sys.executable, "-m", "embedfleet.worker", "--redis-url", redis_url, "--model",
                             minilm_path, "--served-model-name", MODEL, "--poll-timeout", "1", "--max-batch-size", "64",
                             "--max-batch-tokens", "4096",
                             "--rq-records", "full"],  # served jobs keep their records: deliveries, ended_at below
                            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        with Producer(redis_url) as producer:
            wait_for(lambda: MODEL in producer.models(), 120, "the worker's advert", proc)
            assert producer.wait(producer.submit(["warm up"], MODEL), timeout=60).ok
            texts = [f"sentence {i} of the big request, about {('rivers', 'hills', 'clouds')[i % 3]}"
                     for i in range(2048)]
            big = producer.submit(texts, MODEL)
            job = rqkeys.rq_job_key(big)
            wait_for(lambda: redis_client.hget(job, "status") == b"started", 60, "the big request's round", proc)
            small = producer.submit(["a small question"], MODEL)
            assert producer.wait(small, timeout=120).shape == (1, 384)
            big_answered_first = producer.get(big) is not None
            assert producer.wait(big, timeout=120).shape == (2048, 384)
        assert not big_answered_first, "the one-text request waited for the whole 2,048-input round"
        assert redis_client.hget(job, "deliveries") == b"1"  # paused and resumed, not given back and run again
        ended = [redis_client.hget(rqkeys.rq_job_key(i), "ended_at") for i in (small, big)]
        assert ended[0] < ended[1], ended
    finally:
        proc.kill()
        proc.wait(10)


def test_work_behind_a_long_round_cuts_in_between_its_passes_and_never_starves_it(bert_mean, redis_url,
                                                                                  redis_client):
    """In process, on a tiny real model whose passes the test can hold: small requests queued behind a round of
    16 passes are taken at once, as short rounds, and run between its passes; between two of the long round's
    passes run at most CUT_IN_PASSES passes of other work; each request is answered once, none run twice."""
    gate = threading.Event()
    tiny = load_model(bert_mean, served_name=MODEL)
    model = Recorded(tiny, {1: gate})
    engine = Engine(model, max_batch_tokens=64, max_batch_size=4)  # 64 texts: 16 passes or more
    with serve(engine, redis_client, max_jobs=64,
               rq_records="full") as worker, Producer(redis_url) as producer:  # served jobs keep their records
        try:
            assert producer.wait(producer.submit(["warm up"], MODEL), timeout=60).ok  # the device's time per text
            long_texts = sample_texts(64, seed=36, max_words=12)
            big = producer.submit(long_texts, MODEL)
            assert model.waiting[1].wait(60)  # the long round's second pass is on the device
            small = producer.submit_many([[f"small question {k}"] for k in range(4)], MODEL)  # one pass
            deadline = time.monotonic() + 60
            while not worker.handoff.waiting():  # a short round taken and prepared behind it
                assert time.monotonic() < deadline, "the work behind the long round was never taken"
                time.sleep(0.005)
            gate.set()
            small += producer.submit_many([[f"more questions {k}"] for k in range(8)], MODEL)  # while it runs
            answers = [producer.wait(request_id, timeout=60) for request_id in [*small, big]]
        finally:
            gate.set()
    assert all(answer.ok for answer in answers)
    own = {tuple(ids) for ids in tiny.tokenizer(long_texts)["input_ids"]}
    assert len(own) > 48  # distinct inputs (identical ones run once): many passes
    passes = [i for i, batch in enumerate(model.passes) if own & {tuple(ids) for ids in batch}]
    assert passes[-1] - passes[0] + 1 > len(passes), "nothing ran between the long round's passes"
    gaps = [b - a - 1 for a, b in zip(passes, passes[1:])]
    assert max(gaps) <= CUT_IN_PASSES, (passes, gaps)
    for request_id in [*small, big]:
        assert redis_client.lrange(keys.notify_key(request_id), 0, -1) == [b"1"]
        assert redis_client.hget(rqkeys.rq_job_key(request_id), "deliveries") == b"1"
