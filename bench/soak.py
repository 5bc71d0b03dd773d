"""Soak: mixed load against K worker processes that are killed (SIGKILL, SIGTERM) and restarted at random,
with one Redis (AOF) restart; prints what was accepted, completed, failed (by code), lost, wrong, delivered
twice, the worst recovery time and each process's RSS.

    PYTHONPATH=. python bench/soak.py --minutes 10 [--workers 3] [--rate 60] [--lease 6] [--seed 1]

Workers are tests/crashworker.py processes: the real BatchWorker, Engine, queue and Lua path, with a model
whose vector is a fixed function of the text (a clean run's vectors, computed here) and ~2 ms of "device"
time per input, so a kill lands mid-batch and a wrong vector would show. Requests: 1-16 inputs, some with
`dimensions` or float16 output; ~5% cancelled right after submit; ~2% hostile (junk job data, ids with no
job). Recovery time: from a SIGKILL to the moment the last claim the dead worker held is requeued.
"""

from __future__ import annotations

import argparse
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
import zlib
from collections import Counter
from pathlib import Path

import numpy as np
import redis

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from embedfleet.common.errors import EmbedfleetError, UnavailableError  # noqa: E402
from embedfleet.common.policy import LEASE_SECONDS  # noqa: E402
from embedfleet.common.protocol import keys  # noqa: E402
from embedfleet.common.redisserver import RedisServer  # noqa: E402
from embedfleet import Producer  # noqa: E402
from tests.crashworker import token, vector  # noqa: E402

MODEL = "soak"
WIP = f"rq:wip:{keys.queue_name(MODEL)}"


def rss_mb(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


def expected(texts: list[str], fields: dict) -> np.ndarray:
    rows = np.stack([vector(token(t)) for t in texts])
    if fields.get("dimensions"):
        rows = rows[:, :fields["dimensions"]]
        rows = rows / np.linalg.norm(rows, axis=1, keepdims=True)
    return rows


class Soak:
    def __init__(self, args):
        self.args = args
        self.rng = random.Random(args.seed)
        self.stop = threading.Event()
        self.accepted: dict[str, tuple[list[str], dict]] = {}
        self.cancelled: set[str] = set()
        self.hostile: list[str] = []
        self.refused = Counter()
        self.recoveries: list[float] = []
        self.events: list[str] = []
        self.procs: dict[int, subprocess.Popen] = {}
        self.rss_start: dict[str, float] = {}
        self.rss_end: dict[str, float] = {}
        self.lock = threading.Lock()

    def spawn(self, slot: int) -> None:
        self.procs[slot] = subprocess.Popen(
            [sys.executable, "-m", "tests.crashworker", self.url, MODEL, "--lease", str(self.args.lease),
             "--max-jobs", "32"], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def run(self) -> None:
        with tempfile.TemporaryDirectory() as data:
            self.server = RedisServer(Path(data) / "redis", appendonly=True).start()
            self.url = self.server.url
            try:
                self._run()
            finally:
                for proc in self.procs.values():
                    if proc.poll() is None:
                        proc.kill()
                        proc.wait()
                self.server.stop()

    def _run(self) -> None:
        args = self.args
        conn = redis.Redis.from_url(self.url)
        for slot in range(args.workers):
            self.spawn(slot)
        while conn.zcard(keys.model_workers_key(MODEL)) < args.workers:
            time.sleep(0.2)
        time.sleep(1)
        self.rss_start = {f"worker{s}": rss_mb(p.pid) for s, p in self.procs.items()}
        self.rss_start["redis"] = rss_mb(self.server.process.pid)
        started = time.monotonic()
        end = started + args.minutes * 60
        load = threading.Thread(target=self.load, daemon=True)
        load.start()
        restarted_redis = False
        while time.monotonic() < end:
            time.sleep(self.rng.uniform(10, 30))
            if time.monotonic() >= end:
                break
            if not restarted_redis and time.monotonic() > started + args.minutes * 30:
                self.events.append(f"{time.monotonic() - started:.0f}s redis restart")
                self.server.restart()
                restarted_redis = True
                continue
            slot = self.rng.randrange(args.workers)
            proc = self.procs[slot]
            how = self.rng.choice([signal.SIGKILL, signal.SIGKILL, signal.SIGTERM])
            held = self.claims(conn, proc.pid)
            proc.send_signal(how)
            killed = time.monotonic()
            self.events.append(f"{killed - started:.0f}s {how.name} worker{slot} holding {len(held)}")
            if how == signal.SIGKILL and held:
                threading.Thread(target=self.watch_recovery, args=(held, killed), daemon=True).start()
            proc.wait(60)
            time.sleep(self.rng.uniform(0.5, 3))
            self.spawn(slot)
        self.stop.set()
        load.join(30)
        self.rss_end = {f"worker{s}": rss_mb(p.pid) for s, p in self.procs.items()}
        self.rss_end["redis"] = rss_mb(self.server.process.pid)
        self.report(conn, time.monotonic() - started)

    def claims(self, conn, pid: int) -> set[bytes]:
        try:
            members = conn.zrange(WIP, 0, -1)
            return {m for m in members
                    if f"-{pid}-" in (conn.hget(b"rq:execution:" + m, "worker_name") or b"").decode()}
        except redis.RedisError:
            return set()

    def watch_recovery(self, held: set[bytes], killed: float) -> None:
        conn = redis.Redis.from_url(self.url)
        while time.monotonic() - killed < 120:
            try:
                if all(conn.zscore(WIP, m) is None for m in held):
                    self.recoveries.append(time.monotonic() - killed)
                    return
            except redis.RedisError:
                pass
            time.sleep(0.05)
        self.recoveries.append(float("inf"))

    def load(self) -> None:
        producer = Producer(self.url)
        conn = redis.Redis.from_url(self.url)
        n = 0
        while not self.stop.is_set():
            tick = time.monotonic()
            for _ in range(max(1, self.args.rate // 10)):
                n += 1
                self.one(producer, conn, n)
            time.sleep(max(0.0, 0.1 - (time.monotonic() - tick)))

    def one(self, producer: Producer, conn, n: int) -> None:
        roll = self.rng.random()
        try:
            if roll < 0.02:  # hostile: an id with no job, and a job whose data is junk
                conn.rpush(f"rq:queue:{keys.queue_name(MODEL)}", f"nosuchjob{n}")
                request_id = producer.submit([f"hostile {n}"], MODEL)
                conn.hset(f"rq:job:{request_id}", "data", zlib.compress(b"\xc1junk"))
                self.hostile.append(request_id)
                return
            texts = [f"soak {n} input {i} " + "x" * self.rng.randrange(0, 200)
                     for i in range(self.rng.randint(1, 16))]
            fields = self.rng.choice([{}, {}, {"dimensions": 4}, {"embed_dtype": "float16"}])
            request_id = producer.submit(texts, MODEL, **fields)
            self.accepted[request_id] = (texts, fields)
            if roll > 0.95 and producer.cancel(request_id):
                self.cancelled.add(request_id)
        except (UnavailableError, redis.ConnectionError) as exc:  # the raw hostile writes meet it unmapped
            self.refused[f"redis_unavailable ({type(exc).__name__})"] += 1
            time.sleep(0.2)
        except EmbedfleetError as exc:
            self.refused[exc.code] += 1

    def report(self, conn, seconds: float) -> None:
        producer = Producer(self.url)
        deadline = time.monotonic() + 180
        codes, lost, wrong, completed = Counter(), [], 0, 0
        for request_id, (texts, fields) in self.accepted.items():
            try:
                result = producer.wait(request_id, timeout=max(0.1, deadline - time.monotonic()))
            except EmbedfleetError as exc:
                if exc.code == "timeout":
                    lost.append(request_id)
                else:
                    codes[exc.code] += 1
                continue
            completed += 1
            if not np.allclose(result.embeddings.astype(np.float32), expected(texts, fields), atol=2e-3):
                wrong += 1
        for request_id in self.hostile:
            try:
                producer.wait(request_id, timeout=5)
            except EmbedfleetError as exc:
                codes[f"hostile:{exc.code}"] += 1
        pipe = conn.pipeline(transaction=False)
        for request_id in self.accepted:
            pipe.hget(f"rq:job:{request_id}", "deliveries")
        deliveries = [int(d) for d in pipe.execute() if d is not None]
        twice = sum(1 for d in deliveries if d > 1)
        worst = max(self.recoveries, default=float("nan"))
        print(f"soak: {seconds / 60:.1f} min, {self.args.workers} workers, lease {self.args.lease:g} s, "
              f"seed {self.args.seed}")
        print("events: " + "; ".join(self.events))
        print(f"accepted {len(self.accepted)} (+{len(self.hostile)} hostile), refused at submit {dict(self.refused)}")
        print(f"completed {completed}, failed by code {dict(codes)}, lost {len(lost)}, wrong vectors {wrong}")
        print(f"delivered more than once {twice}, cancelled {len(self.cancelled)}, still started "
              f"{conn.zcard(WIP)}, queued {conn.llen(f'rq:queue:{keys.queue_name(MODEL)}')}")
        print(f"recoveries after SIGKILL {len(self.recoveries)}: worst {worst:.2f} s, "
              f"median {np.median(self.recoveries) if self.recoveries else float('nan'):.2f} s")
        print("RSS MB start -> end: " + ", ".join(f"{k} {self.rss_start.get(k, float('nan')):.0f} -> {v:.0f}"
                                                  for k, v in self.rss_end.items()))
        if lost:
            print(f"LOST: {lost[:10]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=10)
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--rate", type=int, default=60, help="requests submitted per second")
    parser.add_argument("--lease", type=float, default=LEASE_SECONDS)
    parser.add_argument("--seed", type=int, default=1)
    Soak(parser.parse_args()).run()


if __name__ == "__main__":
    main()
