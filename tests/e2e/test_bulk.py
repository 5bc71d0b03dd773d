"""`embedfleet embed` against a real worker: every input format, output formats, batch files, the bounded
window, resuming after SIGINT and SIGKILL to the same bytes as an uninterrupted run, Ctrl-C mid-submit and on a
frozen Redis, and an existing OUTPUT (refused unless --overwrite)."""

from __future__ import annotations

import base64
import contextlib
import csv
import json
import os
import pty
import re
import signal
import socket
import subprocess
import sys
import threading

import numpy as np
import psutil
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from rq.suspension import resume, suspend

from embedfleet.common.names import PRIORITIES
from embedfleet.common.protocol import scripts
from embedfleet.common.protocol.keys import queue_name
from embedfleet.producer.cli.bulk.checkpoint import Checkpoint, checkpoint_path, records
from tests.commands import ROOT, assert_one_line_error, clean_env, embedfleet, running, wait_for
from tests.crashworker import token, vector
from tests.hashed import MODEL

LINES = 2000


@pytest.fixture
def env(tmp_path, redis_url) -> dict:
    return clean_env(tmp_path / "cache", EMBEDFLEET_REDIS_URL=redis_url)


def texts(count: int = LINES) -> list[str]:
    return [f"text number {i}, with a comma and \"quotes\"" for i in range(count)]


def expected(lines: list[str]) -> np.ndarray:
    return np.stack([vector(token(t)) for t in lines])


def assert_rows(vectors: np.ndarray, lines: list[str]) -> None:
    """Row i is the vector of lines[i] (the worker re-normalises: equal up to float32 rounding)."""
    assert vectors.shape == (len(lines), 8)
    np.testing.assert_allclose(vectors, expected(lines), rtol=0, atol=1e-6)


def write_input(path, lines: list[str], ids: list | None = None) -> None:
    """`lines` in the format of `path`'s suffix; with `ids`, in an id column or field."""
    if path.suffix == ".txt":
        path.write_text("\n".join(lines) + "\n")
    elif path.suffix == ".json":
        path.write_text(json.dumps([{"id": i, "body": t} for i, t in zip(ids, lines)] if ids else lines))
    elif path.suffix == ".jsonl":
        path.write_text("".join(json.dumps({"id": i, "body": t} if ids else t) + "\n"
                                for i, t in zip(ids or lines, lines)))
    elif path.suffix == ".csv":
        with path.open("w", newline="") as handle:
            writer = csv.writer(handle)
            writer.writerow(["id", "body", "other"])
            writer.writerows([i, t, "x"] for i, t in zip(ids, lines))
    else:
        pq.write_table(pa.table({"id": ids, "other": [1] * len(lines), "body": lines}), path, row_group_size=300)


def in_queue(redis_client) -> int:
    """Requests of MODEL queued or being worked on, over every priority level."""
    names = [queue_name(MODEL, p) for p in PRIORITIES]
    pipe = redis_client.pipeline()
    for name in names:
        pipe.llen(f"rq:queue:{name}").zcard(f"rq:wip:{name}")
    return sum(pipe.execute())


def blocked_in(redis_client, pid: int, command: str) -> bool:
    """Whether process `pid` has a connection that Redis holds blocked in `command` (CLIENT LIST: the client's
    last command, flag b), e.g. a BLMOVE: the run waits for a result."""
    ports = {c.laddr.port for c in psutil.Process(pid).net_connections("tcp") if c.laddr}
    return any(c["cmd"] == command and "b" in c["flags"] and int(c["addr"].rsplit(":", 1)[1]) in ports
               for c in redis_client.client_list())


def sigint_in(pid: int, mask: str) -> bool:
    """Whether SIGINT is in a signal mask of process `pid` (/proc): SigCgt, those it has a handler of its own for
    (not the default action); ShdPnd, those sent to it and not yet delivered to one of its threads."""
    found = re.search(rf"^{mask}:\s*([0-9a-f]+)$", open(f"/proc/{pid}/status").read(), re.MULTILINE).group(1)
    return bool(int(found, 16) >> (signal.SIGINT - 1) & 1)


def start_embed(*args: str, env: dict) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "embedfleet.producer.cli", "embed", *args], env=env, cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


class HoldingRelay:
    """A TCP relay to a Redis: what clients send passes through, but for the first write holding `marker`, which
    is held (its client waiting for the reply) from when it comes until `release()`; `held` is set meanwhile."""

    def __init__(self, port: int, marker: bytes):
        self.port, self.marker = port, marker
        self.held, self._go = threading.Event(), threading.Event()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"redis://127.0.0.1:{self._listener.getsockname()[1]}/0"
        threading.Thread(target=self._accept, daemon=True).start()

    def release(self) -> None:
        self._go.set()
        self._listener.close()

    def _accept(self) -> None:
        with contextlib.suppress(OSError):  # the listener closed
            while True:
                client, _ = self._listener.accept()
                server = socket.create_connection(("127.0.0.1", self.port))
                for source, sink, sent in ((client, server, True), (server, client, False)):
                    threading.Thread(target=self._relay, args=(source, sink, sent), daemon=True).start()

    def _relay(self, source: socket.socket, sink: socket.socket, sent: bool) -> None:
        with contextlib.suppress(OSError), source, sink:
            while data := source.recv(1 << 16):
                if sent and self.marker in data and not self._go.is_set():
                    self.held.set()
                    self._go.wait()
                sink.sendall(data)


class DepthSampler:
    """The largest in_queue() seen while it runs (sampled every few ms in a thread)."""

    def __init__(self, redis_client):
        self.redis, self.most, self._stop = redis_client, 0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(5)

    def _run(self):
        while not self._stop.wait(0.003):
            self.most = max(self.most, in_queue(self.redis))


@pytest.mark.parametrize("suffix", [".txt", ".json", ".jsonl", ".csv", ".parquet"])
def test_each_input_format_gives_every_text_in_order_with_its_id(tmp_path, hashed_worker, env, suffix):
    hashed_worker()
    lines = texts()
    ids = None if suffix == ".txt" else [f"doc-{i}" for i in range(LINES)]
    source, out = tmp_path / f"in{suffix}", tmp_path / "out.parquet"
    write_input(source, lines, ids)
    column = [] if suffix == ".txt" else ["--column" if suffix in (".csv", ".parquet") else "--field", "body"]

    done = embedfleet("embed", str(source), str(out), "--chunk", "50", *column, env=env)

    assert done.returncode == 0, done.stderr
    assert f"embedded {LINES} texts" in done.stdout and f"({LINES}, 8)" in done.stdout
    table = pq.read_table(out)
    assert table.column_names == ["id", "embedding"]
    assert table.column("id").to_pylist() == (ids or list(range(LINES)))
    assert_rows(np.array(table.column("embedding").to_pylist(), np.float32), lines)
    assert not checkpoint_path(out).exists()


def test_npy_and_jsonl_outputs_hold_the_same_vectors(tmp_path, hashed_worker, env):
    hashed_worker()
    lines = texts(300)
    source = tmp_path / "in.txt"
    write_input(source, lines)
    for out in (tmp_path / "out.npy", tmp_path / "out.jsonl"):
        done = embedfleet("embed", str(source), str(out), "--chunk", "64", env=env)
        assert done.returncode == 0, done.stderr
    assert_rows(np.load(tmp_path / "out.npy"), lines)
    rows = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert [r["id"] for r in rows] == list(range(300))
    assert_rows(np.array([r["embedding"] for r in rows], np.float32), lines)


def test_an_openai_batch_file_in_and_out(tmp_path, hashed_worker, env):
    hashed_worker()
    requests = [{"custom_id": f"req-{i}", "method": "POST", "url": "/v1/embeddings",
                 "body": {"model": MODEL, "input": [f"first {i}", f"second {i}"]}} for i in range(30)]
    requests[4]["body"]["dimensions"] = 4
    requests[7]["body"]["encoding_format"] = "base64"
    requests[9]["body"]["temperature"] = 1  # refused on its own line; the other lines are answered
    requests[11]["body"]["model"] = "no-such-model"
    source, out = tmp_path / "batch.jsonl", tmp_path / "answers.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in requests))

    done = embedfleet("embed", str(source), str(out), env=env)

    assert done.returncode == 0, done.stderr
    assert "answered 30 batch requests (2 failed" in done.stdout
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert [line["custom_id"] for line in lines] == [r["custom_id"] for r in requests]
    first = lines[0]["response"]
    assert first["status_code"] == 200 and first["body"]["object"] == "list"
    assert_rows(np.array([d["embedding"] for d in first["body"]["data"]], np.float32), ["first 0", "second 0"])
    assert len(lines[4]["response"]["body"]["data"][0]["embedding"]) == 4
    packed = base64.b64decode(lines[7]["response"]["body"]["data"][1]["embedding"])
    assert_rows(np.frombuffer(packed, "<f4")[None], ["second 7"])
    refused = lines[9]["response"]
    assert refused["status_code"] == 400 and "temperature" in refused["body"]["error"]["message"]
    assert lines[11]["response"]["status_code"] == 404 and lines[11]["error"]["code"] == "model_not_found"
    assert lines[0]["error"] is None


@pytest.mark.parametrize(("stop", "suffix"), [(signal.SIGKILL, ".parquet"), (signal.SIGINT, ".npy")],
                         ids=["SIGKILL-parquet", "SIGINT-npy"])
def test_killed_mid_run_it_resumes_to_the_same_bytes_and_never_queues_more_than_its_window(
        tmp_path, hashed_worker, env, redis_client, stop, suffix):
    window, chunk = 4, 16
    hashed_worker(seconds_per_text=0.0015)
    lines = texts()
    source = tmp_path / "in.csv"
    write_input(source, lines, [f"doc-{i}" for i in range(LINES)])
    args = ["--chunk", str(chunk), "--window", str(window), "--column", "body"]
    reference = tmp_path / f"reference{suffix}"
    assert embedfleet("embed", str(source), str(reference), *args, env=env).returncode == 0

    out = tmp_path / f"out{suffix}"
    log = checkpoint_path(out)
    with DepthSampler(redis_client) as depth:
        suspend(redis_client)  # no worker takes anything: the run fills its window and waits
        run = start_embed(str(source), str(out), *args, env=env)
        wait_for(lambda: in_queue(redis_client) == window, what="a full window")
        wait_for(lambda: blocked_in(redis_client, run.pid, "blmove"), what="the run waiting for a result")
        assert in_queue(redis_client) == window  # a full window, and no more, once the run has gone on to wait
        resume(redis_client)
        wait_for(lambda: log.exists() and sum(kind == "D" for kind, _ in records(log)) >= 30, what="progress")
        suspend(redis_client)  # no worker takes more: the run cannot finish before the signal reaches it
        run.send_signal(stop)
        _, stderr = run.communicate(timeout=60)
        assert run.returncode == (130 if stop == signal.SIGINT else -signal.SIGKILL), stderr
        if stop == signal.SIGINT:
            assert "interrupted" in stderr and "rerun the same command to resume" in stderr
        assert not out.exists() and log.exists()
        done_before = {unit for kind, unit in records(log) if kind == "D"}
        assert 30 <= len(done_before) < LINES // chunk

        resume(redis_client)
        again = embedfleet("embed", str(source), str(out), *args, env=env)

    assert again.returncode == 0, again.stderr
    assert f"{len(done_before)} of {-(-LINES // chunk)} requests done" in again.stderr
    assert out.read_bytes() == reference.read_bytes()
    assert not log.exists()
    assert depth.most == window, f"the queue held {depth.most} of the run's requests; its window is {window}"


def test_ctrl_c_during_a_submit_lets_it_finish_then_cancels_all_it_queued(tmp_path, hashed_worker, env,
                                                                          redis_client, redis_server):
    """The SIGINT lands while the run's enqueue is on its way to Redis (held by a relay, the run waiting for its
    reply): the submit ends, its ids are logged, and every request the run queued is cancelled (none is left in the
    queue unknown to the checkpoint). Before, Ctrl-C was raised inside the Redis client: requests queued and not
    logged, or a segfault in hiredis's packing of the next command."""
    hashed_worker()
    suspend(redis_client)  # nothing taken: what the run queued and did not cancel stays in the queue
    source, out = tmp_path / "in.txt", tmp_path / "out.npy"
    write_input(source, texts(200))
    relay = HoldingRelay(redis_server.port, scripts.ENQUEUE.sha.encode())
    try:
        run = start_embed(str(source), str(out), "--chunk", "8", "--window", "4", env={**env, "EMBEDFLEET_REDIS_URL":
                                                                                     relay.url})
        assert relay.held.wait(60), "the run never enqueued"
        run.send_signal(signal.SIGINT)
        wait_for(lambda: not sigint_in(run.pid, "ShdPnd"), what="the Ctrl-C delivered")
    finally:
        relay.release()
    _, stderr = run.communicate(timeout=60)

    assert run.returncode == 130, stderr
    assert "interrupted: 0 of 25 requests done" in stderr and "rerun the same command to resume" in stderr
    logged = [unit for kind, unit in records(checkpoint_path(out)) if kind == "S"]
    assert sorted(logged) == [0, 1, 2, 3] and in_queue(redis_client) == 0, (logged, in_queue(redis_client))
    resume(redis_client)
    again = embedfleet("embed", str(source), str(out), "--chunk", "8", "--window", "4", env=env)
    assert again.returncode == 0, again.stderr
    assert "0 of 25 requests done, 4 in flight" in again.stderr  # cancelled by the Ctrl-C: submitted again
    assert_rows(np.load(out), texts(200))


def test_a_second_ctrl_c_ends_a_run_stuck_on_a_frozen_redis_at_once(tmp_path, hashed_worker, env, redis_client,
                                                                   redis_server):
    """The first Ctrl-C is acted on between steps, and a step on a Redis that does not answer lasts until the
    socket timeout: the second Ctrl-C ends the process at once (the default action), and the checkpoint it leaves
    resumes as after a kill."""
    hashed_worker()
    suspend(redis_client)
    source, out = tmp_path / "in.txt", tmp_path / "out.npy"
    write_input(source, texts(200))
    run = start_embed(str(source), str(out), "--chunk", "8", "--window", "4", env=env)
    wait_for(lambda: blocked_in(redis_client, run.pid, "blmove"), 60, "the run waiting for a result")
    os.kill(redis_server.process.pid, signal.SIGSTOP)
    try:
        run.send_signal(signal.SIGINT)
        wait_for(lambda: not sigint_in(run.pid, "SigCgt"), 45, "the first Ctrl-C taken")
        assert running(run.pid)  # its step waits on the frozen Redis
        run.send_signal(signal.SIGINT)
        returncode = run.wait(10)
    finally:
        os.kill(redis_server.process.pid, signal.SIGCONT)
    assert returncode == -signal.SIGINT, run.communicate()[1]

    resume(redis_client)
    again = embedfleet("embed", str(source), str(out), "--chunk", "8", "--window", "4", env=env)
    assert again.returncode == 0, again.stderr
    assert "0 of 25 requests done, 4 in flight" in again.stderr
    assert_rows(np.load(out), texts(200))


def test_bad_files_and_columns_are_one_line_and_leave_no_output(tmp_path, hashed_worker, env):
    hashed_worker()
    out = tmp_path / "out.parquet"
    table = tmp_path / "in.csv"
    write_input(table, ["a", "b"], [1, 2])
    assert_one_line_error(embedfleet("embed", str(table), str(out), "--column", "text", env=env), 1,
                          "no column 'text'", "id, body, other", "--column")
    broken = tmp_path / "in.jsonl"
    broken.write_text('"fine"\n{"no": \n')
    assert_one_line_error(embedfleet("embed", str(broken), str(out), env=env), 1, f"{broken}:2", "not valid JSON")
    objects = tmp_path / "objects.json"
    objects.write_text(json.dumps([{"body": "x"}]))
    assert_one_line_error(embedfleet("embed", str(objects), str(out), env=env), 1, "no field 'text'", "--field")
    fake = tmp_path / "fake.parquet"
    fake.write_text("not parquet")
    assert_one_line_error(embedfleet("embed", str(fake), str(out), env=env), 1, "not a readable Parquet file")
    assert_one_line_error(embedfleet("embed", str(table), str(tmp_path / "out.csv"), "--column", "body", env=env), 1,
                          "unknown output format", ".npy, .parquet, .jsonl")
    assert not out.exists() and not list(tmp_path.glob(".out*"))


def test_an_existing_output_is_refused_before_anything_is_queued_and_replaced_with_overwrite(
        tmp_path, hashed_worker, env, redis_client):
    hashed_worker()
    suspend(redis_client)  # a request queued by mistake would stay in the queue, seen
    source, out = tmp_path / "in.txt", tmp_path / "out.npy"
    write_input(source, texts(40))
    out.write_bytes(b"vectors of another run")

    refused = embedfleet("embed", str(source), str(out), "--chunk", "8", env=env)
    assert_one_line_error(refused, 1, f"{out} exists", "pass --overwrite to replace it", "another OUTPUT")
    assert out.read_bytes() == b"vectors of another run"
    assert in_queue(redis_client) == 0 and not redis_client.keys("rq:job:*"), redis_client.keys("*")
    assert not checkpoint_path(out).exists() and not list(tmp_path.glob(".out.npy.*"))  # nor a temp file

    resume(redis_client)
    for how in ({"args": ["--overwrite"]}, {"env": {"EMBEDFLEET_OVERWRITE": "1"}}):
        out.write_bytes(b"vectors of another run")
        done = embedfleet("embed", str(source), str(out), "--chunk", "8", *how.get("args", []),
                          env={**env, **how.get("env", {})})
        assert done.returncode == 0, (how, done.stderr)
        assert_rows(np.load(out), texts(40))
        assert not checkpoint_path(out).exists() and not list(tmp_path.glob(".out.npy.*"))


def test_overwrite_never_replaces_the_input_itself_nor_a_folder(tmp_path, hashed_worker, env, redis_client):
    """An OpenAI batch file in and out are both .jsonl: the same path for both is refused, --overwrite or not."""
    hashed_worker()
    batch = tmp_path / "batch.jsonl"
    batch.write_text(json.dumps({"custom_id": "a", "method": "POST", "url": "/v1/embeddings",
                                 "body": {"model": MODEL, "input": "a text"}}) + "\n")
    before = batch.read_bytes()
    for args in ([], ["--overwrite"]):
        done = embedfleet("embed", str(batch), str(batch), *args, env=env)
        assert_one_line_error(done, 1, f"{batch} is the input itself", "choose another OUTPUT")
    assert batch.read_bytes() == before
    folder = tmp_path / "vectors.npy"
    folder.mkdir()
    source = tmp_path / "in.txt"
    write_input(source, texts(3))
    done = embedfleet("embed", str(source), str(folder), "--overwrite", env=env)
    assert_one_line_error(done, 1, f"{folder} is a folder", "name the output file")
    assert in_queue(redis_client) == 0 and not redis_client.keys("rq:job:*")


def test_a_run_begun_with_overwrite_resumes_without_it_and_replaces_output_only_when_whole(
        tmp_path, hashed_worker, env, redis_client):
    hashed_worker()
    source, out = tmp_path / "in.txt", tmp_path / "out.npy"
    write_input(source, texts(64))
    out.write_bytes(b"vectors of another run")
    args = ["--chunk", "8", "--window", "2"]
    suspend(redis_client)
    done = embedfleet("embed", str(source), str(out), *args, "--timeout", "1", "--overwrite", env=env)
    assert_one_line_error(done, 1, "no result for request", "after 1 s (status: queued)",
                          "rerun the same command to resume")
    assert out.read_bytes() == b"vectors of another run" and checkpoint_path(out).exists()

    resume(redis_client)
    done = embedfleet("embed", str(source), str(out), *args, env=env)  # "the same command", less --overwrite
    assert done.returncode == 0, done.stderr
    assert "0 of 8 requests done, 2 in flight" in done.stderr
    assert_rows(np.load(out), texts(64))


def test_a_checkpoint_of_another_run_is_refused_until_no_resume(tmp_path, hashed_worker, env):
    hashed_worker()
    source, out = tmp_path / "in.txt", tmp_path / "out.npy"
    write_input(source, texts(40))
    checkpoint_path(out).write_bytes(b"")  # a run killed before its first record: simply started over
    assert embedfleet("embed", str(source), str(out), "--chunk", "8", env=env).returncode == 0
    stale = Checkpoint(checkpoint_path(out), {"version": 1, "input_sha256": "0" * 64})
    stale.open(resume=False)
    stale.close()
    done = embedfleet("embed", str(source), str(out), "--chunk", "8", env=env)
    assert_one_line_error(done, 1, "checkpoint of another run", "input_sha256", "--no-resume")
    done = embedfleet("embed", str(source), str(out), "--chunk", "8", "--no-resume", env=env)
    assert_one_line_error(done, 1, f"{out} exists", "--overwrite")  # not resuming: the first run's OUTPUT is there
    done = embedfleet("embed", str(source), str(out), "--chunk", "8", "--no-resume", "--overwrite", env=env)
    assert done.returncode == 0, done.stderr
    assert_rows(np.load(out), texts(40))


def test_a_fleet_that_stops_answering_ends_the_run_with_its_progress_kept(tmp_path, hashed_worker, env, redis_client):
    hashed_worker()
    source, out = tmp_path / "in.txt", tmp_path / "out.npy"
    write_input(source, texts(64))
    suspend(redis_client)
    done = embedfleet("embed", str(source), str(out), "--chunk", "8", "--window", "2", "--timeout", "1", env=env)
    assert_one_line_error(done, 1, "no result for request", "0 of 8 requests done are kept in",
                          "rerun the same command to resume")
    assert not out.exists() and in_queue(redis_client) == 2
    resume(redis_client)
    done = embedfleet("embed", str(source), str(out), "--chunk", "8", "--window", "2", env=env)
    assert done.returncode == 0, done.stderr
    assert "0 of 8 requests done, 2 in flight" in done.stderr
    assert_rows(np.load(out), texts(64))


def test_the_progress_bar_moves_as_results_land_and_ends_on_done(tmp_path, hashed_worker, env):
    """The bar on a terminal (a pty, as a user's shell gives it): each frame's count of texts done, in order,
    steps up as results land, and the last frame says done, with nothing left in flight."""
    hashed_worker(seconds_per_text=0.0005)
    source, out = tmp_path / "in.txt", tmp_path / "out.npy"
    write_input(source, texts())
    parent, child = pty.openpty()
    process = subprocess.Popen([sys.executable, "-m", "embedfleet.producer.cli", "embed", str(source), str(out),
                                "--chunk", "50", "--progress"], env={**env, "COLUMNS": "120", "TERM": "xterm"},
                               stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=child, text=True)
    os.close(child)
    shown = b""
    while True:  # until the child closes its end of the pty
        try:
            chunk = os.read(parent, 65536)
        except OSError:  # EIO: the child is gone
            break
        if not chunk:
            break
        shown += chunk
    os.close(parent)
    assert process.wait(60) == 0, shown[-2000:]
    frames = [re.sub(r"\x1b\[[0-9;?]*[a-zA-Z]", "", frame).strip()
              for frame in re.split(r"[\r\n]", shown.decode("utf-8", "replace"))]
    frames = [frame for frame in frames if frame.startswith("embedding")]
    counts = [int(re.search(r"(\d+)/2000", frame).group(1)) for frame in frames]
    assert counts == sorted(counts) and len(set(counts)) >= 4, counts  # steps, not one jump at the end
    assert frames[-1].startswith("embedding ✓") and re.search(r" 2000/2000 done [\d.,]+ texts/s in 0:\d\d:\d\d$",
                                                              frames[-1]), frames[-1]
    assert not [frame for frame in frames if "2000/2000" in frame and "in flight" in frame], frames[-3:]
