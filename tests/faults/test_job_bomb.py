"""Job data is inflated with a cap (worker/serving/jobdata.py): a zlib bomb taken with good jobs by the real
BatchWorker fails alone, with a short reason and a small error blob, and costs the worker bounded memory
(issue #19: 65 KB of zlib, 64 MiB of zeros, took a worker from 247 to 1,523 MB and left a 256 MB blob)."""

from __future__ import annotations

import gc
import zlib

from rq.job import Job

from embedfleet.common.codec import packb
from embedfleet.common.protocol.jobdata import JOB_FUNC, MAX_JOB_DATA
from embedfleet.common.protocol.keys import result_key
from embedfleet.common.request import EmbedRequest
from embedfleet.common.result import Result
from embedfleet.common.serializer import MsgpackSerializer
from tests import harness
from tests.harness import burst
from tests.nullworker import NULL
from tests.rqjobs import enqueue, rq_queue, texts
from embedfleet.worker.engine.engine import Engine
from embedfleet.worker.engine.models.nullmodel import NullModel

SMALL = 4096  # bytes an error blob, or rq's failure record, may take


def status_mb(field: str) -> float:
    """A memory figure of this process from /proc/self/status (VmRSS: resident now; VmHWM: its peak), in MB."""
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith(f"{field}:")) / 1024


def memory_growth(run) -> tuple[float, float | None]:
    """MB by which `run()` grew this process's resident memory: (after it, at its peak). The peak is None where
    the kernel does not let a process reset its own (Linux 4.0+: 5 > /proc/self/clear_refs)."""
    gc.collect()
    before = status_mb("VmRSS")
    try:
        with open("/proc/self/clear_refs", "w") as clear:
            clear.write("5")
        peak_reset = True
    except OSError:
        peak_reset = False
    run()
    gc.collect()
    return status_mb("VmRSS") - before, status_mb("VmHWM") - before if peak_reset else None


def bombs() -> dict[str, tuple[bytes, str]]:
    """label -> (a job's `data`, what its failure must say)."""
    return {
        "64 MiB of zeros": (zlib.compress(bytes(64 << 20), 9), f"inflates to more than {MAX_JOB_DATA} bytes"),
        "a request past the cap": (zlib.compress(packb([JOB_FUNC, None, [bytes(MAX_JOB_DATA)], {}]), 9),
                                   "inflates to more than"),
        # under the cap, each failure quotes a few characters of its data
        "4 MiB of zeros": (zlib.compress(bytes(4 << 20), 9), "is not msgpack rq job data: ExtraData"),
        "a 4 MiB function name": (zlib.compress(packb(["x" * (4 << 20), None, [b""], {}]), 9),
                                  "job function is 'xxxxx"),
        "a 4 MiB request of zeros": (zlib.compress(packb([JOB_FUNC, None, [bytes(4 << 20)], {}]), 9),
                                     "malformed embed request"),
    }


def good_requests(conn, count: int) -> list[EmbedRequest]:
    requests = [EmbedRequest(model=NULL, inputs=[text]) for text in texts(count)]
    for request in requests:
        enqueue(conn, request)
    return requests


def test_a_zlib_bomb_among_good_jobs_fails_alone_small_and_in_bounded_memory(redis_client):
    engine = Engine(NullModel("null:4", served_name=NULL), max_batch_tokens=1 << 20, max_batch_size=4096)
    burst(engine, redis_client)  # a first round: what any worker holds once it runs
    hostile = {}
    good = good_requests(redis_client, 10)
    for label, (data, says) in bombs().items():
        request = EmbedRequest(model=NULL, inputs=["?"])
        job = enqueue(redis_client, request)
        redis_client.hset(job.key, "data", data)
        hostile[request.id] = (label, says)
    good += good_requests(redis_client, 10)

    worker = harness.worker(engine, redis_client, max_jobs=64)
    grown, peak = memory_growth(lambda: burst(worker))

    assert worker.finishing.batches == 1  # the bombs were taken with the good jobs
    for request in good:
        assert Result.decode(redis_client.get(result_key(request.id))).ok
    assert set(rq_queue(redis_client, NULL).failed_job_registry.get_job_ids()) == set(hostile)
    for job_id, (label, says) in hostile.items():
        blob = redis_client.get(result_key(job_id))
        answer = Result.decode(blob)
        assert answer.error_code == "decode_error" and says in answer.error_message, (label, answer.error_message)
        assert len(blob) < SMALL, (label, len(blob))
        assert len(redis_client.hget(Job.key_for(job_id), "exc_info")) < SMALL, label
        job = Job.fetch(job_id, connection=redis_client, serializer=MsgpackSerializer)
        assert job.get_status() == "failed"
    assert grown < 50 and (peak is None or peak < 50), f"{len(hostile)} bombs grew the worker by {grown:.0f} MB " \
                                                       f"(at the peak: {peak} MB)"


def test_a_stranded_bomb_is_recovered_by_maintenance_in_bounded_memory(redis_client):
    """rq's maintenance reads an abandoned job through the worker's SafeJob, which inflates with the same cap."""
    engine = Engine(NullModel("null:4", served_name=NULL), max_batch_tokens=1 << 20, max_batch_size=4096)
    request = EmbedRequest(model=NULL, inputs=["?"])
    job = enqueue(redis_client, request)
    redis_client.hset(job.key, mapping={"data": bombs()["64 MiB of zeros"][0], "retries_left": 0})
    harness.worker(engine, redis_client).take_round(None)  # started, then its worker "dies"
    queue = rq_queue(redis_client, NULL)
    for member in redis_client.zrange(queue.started_job_registry.key, 0, -1):
        redis_client.zadd(queue.started_job_registry.key, {member: 1})

    grown, peak = memory_growth(harness.worker(engine, redis_client).run_maintenance_tasks)

    assert queue.failed_job_registry.get_job_ids() == [request.id]
    assert Result.decode(redis_client.get(result_key(request.id))).error_code == "internal_error"
    assert grown < 50 and (peak is None or peak < 50), f"maintenance over one bomb grew the worker by " \
                                                       f"{grown:.0f} MB (at the peak: {peak} MB)"
