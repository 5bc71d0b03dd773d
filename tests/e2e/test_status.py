"""`embedfleet status` against a real worker: its queues per priority, their ages, the worker's live facts
and the last hour's failures, as --json and as tables."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest
from rq import Queue
from rq.suspension import resume, suspend

from embedfleet.common.policy import FAILURE_TTL
from embedfleet.common.protocol.jobdata import JOB_FUNC
from embedfleet.common.protocol.keys import model_workers_key, queue_name, worker_info_key
from embedfleet.common.serializer import MsgpackSerializer
from embedfleet import Producer
from tests.commands import ROOT, clean_env, embedfleet
from tests.hashed import MODEL


@pytest.fixture
def env(tmp_path, redis_url) -> dict:
    return clean_env(tmp_path / "cache", EMBEDFLEET_REDIS_URL=redis_url)


def status_json(env) -> dict:
    done = embedfleet("status", "--json", env=env)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def rows(table: str, shown: str, edge: str = "│") -> list[list[str]]:
    """The cells of each line of the rich table titled `table` in `shown` (edge ┃: its header's)."""
    lines = shown.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip() == table) + 1
    found = []
    for line in lines[start:]:
        if line.startswith("└"):
            return found
        if line.startswith(edge):
            found.append([cell.strip() for cell in line.rstrip()[1:-1].split(edge)])
    raise AssertionError(f"table {table!r} does not end: {shown}")


def column(table: list[list[str]], index: int) -> str:
    """A column's text over its lines: a cell folded onto several lines, joined."""
    return "".join(cells[index] for cells in table)


def test_status_json_reports_queues_ages_workers_and_failures(hashed_worker, redis_url, redis_client, env):
    worker = hashed_worker(heartbeat_interval=0.3)
    suspend(redis_client)  # the worker takes nothing: the queues hold what the test put there
    with Producer(redis_url) as producer:
        interactive = producer.submit_many([["a", "b"], ["c"], ["d"]], MODEL)
        producer.submit_many([["e"], ["e"]], MODEL, priority="bulk")  # the model's bulk queue
        bad = Queue(queue_name(MODEL), connection=redis_client, serializer=MsgpackSerializer)
        bad.enqueue_many([Queue.prepare_data(JOB_FUNC, args=[b"\xc1 not a request"], job_id="garbled",
                                             failure_ttl=FAILURE_TTL)])
        time.sleep(1.2)

        held = status_json(env)

        [model] = held["models"]
        assert model["name"] == MODEL and model["served"] and model["dim"] == 8 and model["live_workers"] == 1
        queues = {q["priority"]: q for q in model["queues"]}
        assert queues["interactive"]["depth"] == 4 and queues["bulk"]["depth"] == 2
        assert [queues[p]["queue"] for p in ("interactive", "bulk")] == [queue_name(MODEL), f"{queue_name(MODEL)}@bulk"]
        assert 1.0 <= queues["interactive"]["oldest_age_s"] < 30 and 1.0 <= queues["bulk"]["oldest_age_s"] < 30
        # the producers' estimate (common.scheduling): 2 per one-character text; the garbled job counts none
        assert queues["interactive"]["queued_tokens"] == 4 * 2 and queues["bulk"]["queued_tokens"] == 2 * 2
        [seen] = held["workers"]
        assert seen["name"] == worker.name and seen["model"] == MODEL and seen["device"] == "cpu"
        assert seen["max_batch_tokens"] == 64 and seen["state"] == "idle" and seen["last_beat_s"] < 5
        assert seen["texts_per_s"] == 0 and seen["texts_history"] == [0] * 60

        resume(redis_client)
        for request_id in interactive:
            producer.wait(request_id, 30)
        deadline = time.monotonic() + 10
        while (after := status_json(env))["workers"][0]["texts_done"] < 6:  # the 2 bulk ones too
            assert time.monotonic() < deadline, after
            time.sleep(0.2)

    [model] = after["models"]
    queues = {q["priority"]: q for q in model["queues"]}
    assert queues["interactive"]["depth"] == 0 and queues["interactive"]["oldest_age_s"] is None
    assert queues["bulk"]["depth"] == 0 and queues["bulk"]["queued_tokens"] == 0
    assert model["failures_last_hour"] == {"decode_error": 1}
    [seen] = after["workers"]
    assert seen["texts_per_s"] > 0 and sum(seen["texts_history"]) == 6 and seen["rounds"] >= 1
    assert model["texts_per_s"] == seen["texts_per_s"] and model["cache_hit_rate"] is None


def test_status_tables_and_a_forged_advert(hashed_worker, redis_client, env):
    worker = hashed_worker()
    redis_client.zadd(model_workers_key(MODEL), {"forged": time.time()})
    redis_client.set(worker_info_key("forged"), b"\xc1 not msgpack")
    done = embedfleet("status", "--wide", env=env)  # the batch budget is --wide's
    assert done.returncode == 0, done.stderr
    for word in ("models and queues", "interactive", "bulk", "workers", worker.name, "64 tok / 64 rows", "idle"):
        assert word in done.stdout, done.stdout
    assert "forged" not in done.stdout  # an advert that does not decode is left out, never a crash
    assert [w["name"] for w in status_json(env)["workers"]] == [worker.name]


# a Kubernetes pod's worker: its name holds the pod's
LONG_NAME = "embedfleet-embedding-workers-of-a-statefulset-with-a-long-name-0-1-0123abcd"


def test_status_fits_80_columns_and_folds_a_long_worker_name_whole(hashed_worker, env):
    hashed_worker(name=LONG_NAME)
    without_columns = {k: v for k, v in env.items() if k != "COLUMNS"}  # a pipe and no COLUMNS: 80 too
    for shown_env in ({**env, "COLUMNS": "80"}, without_columns):
        done = embedfleet("status", env=shown_env)
        assert done.returncode == 0, done.stderr
        assert max(map(len, done.stdout.splitlines())) <= 80 and "…" not in done.stdout, done.stdout
    assert rows("models and queues", done.stdout) == [[MODEL, "interactive", "0", "0", "-", "-"],
                                                      ["", "bulk", "0", "0", "-", ""]], done.stdout
    workers = rows("workers", done.stdout)
    assert len(workers) > 1 and column(workers, 0) == LONG_NAME, done.stdout  # folded, not cut
    assert [column(workers, i) for i in (1, 2, 3, 4)] == [MODEL, "cpu", "idle", "0.0"], done.stdout
    assert "64 tok / 64 rows" not in done.stdout and socket.gethostname() not in done.stdout  # --wide's


def test_status_wide_has_every_column_of_the_full_table_on_one_line_per_row(hashed_worker, env):
    worker = hashed_worker()
    done = embedfleet("status", env={**env, "EMBEDFLEET_WIDE": "1", "COLUMNS": "80"})  # COLUMNS limits no row
    assert done.returncode == 0, done.stderr
    assert rows("models and queues", done.stdout, "┃") == [[
        "model", "workers", "dim / max len / pooling", "priority", "queued", "in progress", "oldest", "queued tokens",
        "texts/s", "cache hits", "failed (1 h)"]]
    [model] = status_json(env)["models"]
    shape = f"{model['dim']} / {model['max_model_len']} / {model['pooling']}"
    assert rows("models and queues", done.stdout) == [[MODEL, "1", shape, "interactive", "0", "0", "-", "0", "0.0", "-",
                                                       "-"], ["", "", "", "bulk", "0", "0", "-", "0", "", "", ""]]
    assert rows("workers", done.stdout, "┃") == [[
        "worker", "model", "host", "device", "dtype", "batch budget", "state", "on device", "texts/s (1 min)",
        "last beat"]]
    [row] = rows("workers", done.stdout)
    assert row[:-1] == [worker.name, MODEL, socket.gethostname(), "cpu", "float32", "64 tok / 64 rows", "idle", "-",
                        "0.0"] and row[-1].endswith(" s ago"), done.stdout


def test_status_with_no_fleet(env):
    done = embedfleet("status", env=env)
    assert done.returncode == 0 and "no model is served" in done.stdout, done.stderr
    assert status_json(env)["models"] == []


def test_watch_redraws_until_ctrl_c(hashed_worker, env):
    hashed_worker()
    watch = subprocess.Popen([sys.executable, "-m", "embedfleet.producer.cli", "status", "--watch", "0.2"], cwd=ROOT,
                             env={**env, "COLUMNS": "80"}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(watch.stdout), daemon=True)
    reader.start()
    # Ctrl-C once three refreshes are out (the event), not after a guess at how fast it starts on this machine.
    while sum("models and queues" in line for line in list(lines)) < 3:
        assert watch.poll() is None, watch.stderr.read()
        time.sleep(0.05)
    watch.send_signal(signal.SIGINT)
    watch.wait()
    reader.join()
    out, err = "".join(lines), watch.stderr.read()
    assert watch.returncode == 130, err
    assert out.count("models and queues") >= 3 and MODEL in out and "Traceback" not in err  # one per refresh
    assert max(map(len, lines)) <= 81 and "batch budget" not in out, out  # the tables of plain `status` (81: the \n)


def test_a_busy_worker_shows_the_round_on_its_device_within_a_beat(hashed_worker, redis_url, env):
    # 40 texts: 8 s on the "device" (one `embedfleet status` process takes 1-2 s on a busy 2-core machine: several
    # looks fit in the round); adverts every 10 s, heartbeats (leases, live facts) every 0.3 s
    hashed_worker(seconds_per_text=0.2, lease=0.9)
    with Producer(redis_url) as producer:
        request_id = producer.submit([f"text {i}" for i in range(40)], MODEL)
        deadline = time.monotonic() + 30
        while (seen := status_json(env)["workers"][0]).get("current_texts") != 40:
            assert time.monotonic() < deadline, seen
        assert seen["state"] == "busy" and seen["current_requests"] == 1
        producer.wait(request_id, 30)
