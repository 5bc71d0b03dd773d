"""No import driven by Redis data: a job's hash may name callbacks and webhooks (anyone with producer rights can
write it), and the worker's rq maintenance handles abandoned and stuck jobs without importing, calling or
contacting any of them (worker/serving/rqjob.py); `python -m embedfleet.worker` imports nothing from its working
directory (worker/safepath.py)."""

from __future__ import annotations

import http.server
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from rq.intermediate_queue import IntermediateQueue
from rq.job import Job, JobStatus

from embedfleet.common.protocol.keys import result_key
from embedfleet.common.request import EmbedRequest
from embedfleet.common.result import Result
from embedfleet.common.serializer import MsgpackSerializer
from tests import harness
from tests.harness import burst
from tests.nullworker import NULL
from tests.rqjobs import enqueue, rq_queue
from embedfleet.worker.engine.engine import Engine
from embedfleet.worker.engine.models.nullmodel import NullModel

ROOT = Path(__file__).resolve().parents[2]
CANARY = "embedfleet_canary_module"


@pytest.fixture
def canary(tmp_path, monkeypatch):
    """A module on sys.path (where a worker's working directory would put it) that leaves a marker file when
    imported, and another when its `hook` is called."""
    folder = tmp_path / "importable"
    folder.mkdir()
    marker = tmp_path / "marker"
    (folder / f"{CANARY}.py").write_text(
        "import pathlib\n"
        f"pathlib.Path({str(marker)!r}).write_text('imported')\n"
        "def hook(*args, **kwargs):\n"
        f"    pathlib.Path({str(marker)!r}).write_text('called')\n")
    monkeypatch.syspath_prepend(str(folder))
    yield marker
    sys.modules.pop(CANARY, None)


@pytest.fixture
def webhook_target():
    """An HTTP server that counts every request it gets."""
    hits = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            hits.append(self.path)
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/hook", hits
    server.shutdown()


def hostile_job(conn, url: str, **fields) -> str:
    """A job whose hash names a callback of every kind and a webhook for each outcome."""
    request = EmbedRequest(model=NULL, inputs=["x"])
    job = enqueue(conn, request)
    conn.hset(job.key, mapping={
        "success_callback_name": f"{CANARY}.hook", "failure_callback_name": f"{CANARY}.hook",
        "stopped_callback_name": f"{CANARY}.hook",
        "webhooks": json.dumps([{"url": url, "job_status": status, "timeout": 2} for status in ("failed", "finished")]),
        **fields})
    return request.id


def test_maintenance_imports_and_calls_nothing_a_job_names(redis_client, canary, webhook_target):
    url, hits = webhook_target
    engine = Engine(NullModel("null:4", served_name=NULL), max_batch_tokens=1 << 20, max_batch_size=4096)
    queue = rq_queue(redis_client, NULL)
    retried = hostile_job(redis_client, url, retries_left=2)  # abandoned with retries left: requeued
    failed = hostile_job(redis_client, url, retries_left=0)  # abandoned, none left: failed
    harness.worker(engine, redis_client, max_jobs=64).take_round(None)  # taken, then its worker "dies"
    for member in redis_client.zrange(queue.started_job_registry.key, 0, -1):
        redis_client.zadd(queue.started_job_registry.key, {member: 1})  # past its score: abandoned
    stuck = hostile_job(redis_client, url, retries_left=0)  # dequeued into the intermediate list, never started
    redis_client.lrem(queue.key, 0, stuck)
    intermediate = IntermediateQueue(queue.key, redis_client)
    redis_client.rpush(intermediate.key, stuck)
    redis_client.set(intermediate.get_first_seen_key(stuck), time.time() - 120)

    rescuer = harness.worker(engine, redis_client)
    rescuer.run_maintenance_tasks()

    assert not canary.exists() and CANARY not in sys.modules  # nothing imported, nothing called
    assert hits == []  # no webhook sent
    status = {job_id: Job.fetch(job_id, connection=redis_client, serializer=MsgpackSerializer).get_status()
              for job_id in (retried, failed, stuck)}
    assert status == {retried: JobStatus.QUEUED, failed: JobStatus.FAILED, stuck: JobStatus.FAILED}
    assert retried in queue.job_ids and set(queue.failed_job_registry.get_job_ids()) == {failed, stuck}
    for job_id in (failed, stuck):  # the producer is told, as for any abandoned job
        assert Result.decode(redis_client.get(result_key(job_id))).error_code == "internal_error"
    assert redis_client.llen(intermediate.key) == 0 and queue.started_job_registry.get_job_ids() == []

    burst(engine, redis_client)  # the requeued one is then served as any other
    assert Result.decode(redis_client.get(result_key(retried))).ok
    assert not canary.exists()


def test_python_m_worker_imports_nothing_from_its_working_directory(tmp_path):
    """A `common` package in the directory `python -m embedfleet.worker` runs in would shadow embedfleet's own."""
    marker = tmp_path / "marker"
    (tmp_path / "common").mkdir()
    (tmp_path / "common" / "__init__.py").write_text(f"open({str(marker)!r}, 'w').write('imported')\n")
    done = subprocess.run([sys.executable, "-m", "embedfleet.worker", "--help"], cwd=tmp_path, capture_output=True,
                          text=True, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=120)
    assert not marker.exists(), done.stderr
    assert done.returncode == 0 and "--max-jobs" in done.stdout, done.stderr
