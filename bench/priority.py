"""Interactive latency behind a bulk backlog, side by side in one run: one FIFO (the backlog submitted at
the interactive level, as every request was queued before priority levels) vs priority levels (the
backlog at `bulk`). Real all-MiniLM-L6-v2 worker (in process, one thread per stage), real Redis.

    PYTHONPATH=. .venv/bin/python bench/priority.py [--backlog 60] [--texts 8] [--queries 8] [--interval 1]
                                                    [--max-jobs 4]

Per mode: `--backlog` requests of `--texts` corpus texts each are queued, the worker starts, and once its
first round is answered `--queries` one-text requests are sent, one every `--interval` seconds (open
loop). Printed: their latency (submit to answer stored; p50, max), and the bulk texts served per second
meanwhile.
"""

from __future__ import annotations

import argparse
import logging
import threading
import time
from datetime import datetime, timezone

import redis

from bench._common import Timer, add_corpus_flags, describe_machine, load_corpus, median, model_path, ratio, table
from common.protocol.keys import queue_name
from common.redisserver import RedisServer
from producer import Producer
from worker.engine.engine import Engine
from worker.engine.model import load_model
from worker.serving.pipeline import BatchWorker


def _answered_at(conn, request_id: str) -> float:
    """When the worker stored the answer (rq's ended_at, this machine's clock)."""
    stamp = conn.hget(f"rq:job:{request_id}", "ended_at").decode()
    return datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=timezone.utc).timestamp()


def _finished(conn, ids: list[str]) -> int:
    with conn.pipeline(transaction=False) as pipe:
        for request_id in ids:
            pipe.hget(f"rq:job:{request_id}", "status")
        return sum(status == b"finished" for status in pipe.execute())


def run(engine, texts: list[str], queries: list[str], args, backlog_priority: str) -> dict:
    with RedisServer() as server:
        conn = redis.Redis.from_url(server.url)
        worker = BatchWorker(engine, conn, max_jobs=args.max_jobs, poll_timeout=1)
        worker.advertiser.advertise()
        name = engine.caps.name
        with Producer(server.url) as producer:
            chunks = [texts[i * args.texts:(i + 1) * args.texts] for i in range(args.backlog)]
            backlog = producer.submit_many(chunks, name, priority=backlog_priority, truncate_prompt_tokens=-1)
            finished = f"rq:finished:{queue_name(name, backlog_priority)}"
            thread = threading.Thread(target=worker.work, daemon=True)
            thread.start()
            while not conn.zcard(finished):
                time.sleep(0.01)
            served_before = _finished(conn, backlog)
            sent = []
            with Timer() as phase:  # open loop: a query every --interval seconds, whatever the answers
                for query in queries:
                    sent.append((time.time(), producer.submit([query], name)))
                    time.sleep(args.interval)
                latencies = [producer.wait(i, 600) and _answered_at(conn, i) - at for at, i in sent]
            bulk_during = (_finished(conn, backlog) - served_before) * args.texts
            worker.stop()
            thread.join(600)
            left = sum(1 for i in backlog if producer.status(i) != "finished")
    return {"p50": median(latencies), "max": max(latencies), "bulk_texts_per_s": bulk_during / phase.seconds,
            "backlog_left": left}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_corpus_flags(parser, None)
    parser.add_argument("--backlog", type=int, default=60, help="bulk requests queued first")
    parser.add_argument("--texts", type=int, default=8, help="texts per bulk request")
    parser.add_argument("--queries", type=int, default=8, help="interactive one-text requests")
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between two queries (open loop)")
    parser.add_argument("--max-jobs", type=int, default=4, help="requests per worker round")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    corpus = load_corpus(args.corpus, args.limit)
    texts = (corpus * (1 + args.backlog * args.texts // len(corpus)))[:args.backlog * args.texts]
    queries = [t for t in corpus if 10 <= len(t) <= 60][:args.queries]
    engine = Engine(load_model(model_path(), served_name="all-MiniLM-L6-v2"))
    fifo = run(engine, texts, queries, args, "interactive")
    levels = run(engine, texts, queries, args, "bulk")
    print(describe_machine())
    print(table(["backlog queued at", "interactive p50 s", "interactive max s", "bulk texts/s meanwhile",
                 "backlog left when done"],
                [["interactive (one FIFO)", fifo["p50"], fifo["max"], fifo["bulk_texts_per_s"], fifo["backlog_left"]],
                 ["bulk (priority levels)", levels["p50"], levels["max"], levels["bulk_texts_per_s"],
                  levels["backlog_left"]]],
                title=f"{args.backlog} x {args.texts}-text bulk requests queued, then {len(queries)} one-text "
                      f"queries, one every {args.interval:g} s (max_jobs {args.max_jobs})"))
    print(f"\ninteractive p50 ratio FIFO / levels: {ratio(fifo['p50'], levels['p50']):.1f}x, "
          f"max: {ratio(fifo['max'], levels['max']):.1f}x")


if __name__ == "__main__":
    main()
