"""Where a worker's time goes per request, one stage at a time: a null-model round of --round one-text requests
taken, prepared, forwarded, answered and stored on one thread (no stage waits for another, no GIL is shared),
with the Redis CPU of the take and finish scripts beside them. What bench/nullmodel.py measures as a whole, cut
into its parts: the figures a change to one stage moves.

    PYTHONPATH=. .venv/bin/python bench/stagecost.py [--rounds 200] [--round 64] [--gap 0] [--corpus FILE]

Each row is the median over rounds (the first tenth left out: imports and first calls) of microseconds per
request: `take` and `store` are round trips (the client's wait included: Redis's script time, the reply and its
parsing), the rest is the worker's Python alone. Redis rows come from INFO commandstats (EVALSHA time of each
script, per job) and INFO cpu (the server's main thread, all of it) over the same rounds; one private
redis-server.

--gap S leaves Redis and the worker idle S seconds before each round, as one request at a time does (a sync
client): a script that runs after an idle gap finds its core's caches cold and costs Redis 2-3x what it costs
back to back (`--round 1 --gap 0.003` against `--round 1`: issue 38's note).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import redis

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import RedisServer, describe_machine, load_corpus, prefill, short_texts, table

from embedfleet.worker.engine.engine import Engine
from embedfleet.worker.engine.models.nullmodel import NullModel
from embedfleet.worker.serving import rounds
from embedfleet.worker.serving.builder import build_worker
from embedfleet.worker.serving.config import given_settings
from embedfleet.worker.serving.rounds import Round

NAME = "null"


def redis_cpu(conn: redis.Redis) -> float:
    cpu = conn.info("cpu")
    return cpu["used_cpu_user_main_thread"] + cpu["used_cpu_sys_main_thread"]


def script_usec(conn: redis.Redis) -> float:
    return conn.info("commandstats").get("cmdstat_evalsha", {}).get("usec", 0)


def measure(texts: list[str], rounds_n: int, size: int, gap: float = 0.0) -> dict[str, list[float]]:
    stages: dict[str, list[float]] = {name: [] for name in
                                      ("take (round trip)", "prepare", "forward", "answers", "store (round trip)")}
    scripts = {"take script (Redis)": [], "finish script (Redis)": [], "Redis main thread (INFO calls included)": []}
    with RedisServer() as server:
        conn = redis.Redis.from_url(server.url)
        prefill(server.url, NAME, [[texts[i % len(texts)]] for i in range(rounds_n * size)])
        engine = Engine(NullModel("null:384", served_name=NAME), max_batch_tokens=1 << 20, max_batch_size=4096)
        worker = build_worker(given_settings(max_jobs=size, poll_timeout=1), engine, conn)
        for _ in range(rounds_n):
            if gap:
                time.sleep(gap)
            usec, cpu = script_usec(conn), redis_cpu(conn)
            began = time.perf_counter()
            _, taken = worker.levels.take(size, None)
            took = time.perf_counter()
            took_usec = script_usec(conn)  # (outside the timed stages)
            resumed = time.perf_counter()
            round_ = Round(time.time())
            worker.ledger.hold(taken, round_.began)
            worker.taking.prepare(round_, taken)
            prepared = time.perf_counter()
            worker.forwarding._forward(round_)
            forwarded = time.perf_counter()
            written = rounds.answers_of(round_, rounds.results(round_, worker.steps.finish, NAME), NAME)
            answered = time.perf_counter()
            answered_usec = script_usec(conn)
            resumed_store = time.perf_counter()
            worker.store.write(written, answered - began)
            stored = time.perf_counter()
            worker.finishing.release(round_)
            per = 1e6 / max(len(taken), 1)
            for name, seconds in zip(stages, (took - began, prepared - resumed, forwarded - prepared,
                                              answered - forwarded, stored - resumed_store)):
                stages[name].append(seconds * per)
            scripts["take script (Redis)"].append((took_usec - usec) / max(len(taken), 1))
            scripts["finish script (Redis)"].append((script_usec(conn) - answered_usec) / max(len(taken), 1))
            scripts["Redis main thread (INFO calls included)"].append((redis_cpu(conn) - cpu) * per)
        conn.close()
    return {**stages, **scripts}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--round", type=int, default=64, help="requests per round (the worker's --max-jobs)")
    parser.add_argument("--gap", type=float, default=0.0, help="idle seconds before each round")
    parser.add_argument("--corpus", type=Path, default=None)
    args = parser.parse_args()
    texts = short_texts(load_corpus(args.corpus))
    print(f"{describe_machine()}; null model, rounds of {args.round} one-text requests"
          f"{f', {args.gap:g} s idle before each' if args.gap else ''}", flush=True)
    measured = measure(texts, args.rounds, args.round, args.gap)
    skip = args.rounds // 10
    rows = [[name, statistics.median(values[skip:]), statistics.mean(values[skip:])]
            for name, values in measured.items()]
    worker = sum(row[1] for row in rows[:5])
    rows.append(["worker, all five stages (medians summed)", worker, float("nan")])
    print(table(["stage", "median us/request", "mean us/request"], rows,
                "Per-request cost of each stage, one thread (bench/nullmodel.py runs them as three)"))


if __name__ == "__main__":
    main()
