"""Interactive latency behind a bulk backlog, side by side in one run: one FIFO (the backlog submitted at
the interactive level, as every request was queued before priority levels) vs priority levels (the
backlog at `bulk`). Real all-MiniLM-L6-v2 worker (in process, one thread per stage), real Redis.

    PYTHONPATH=. .venv/bin/python bench/priority.py [--backlog 40] [--texts 16] [--queries 8] [--interval 1]
                                                    [--max-jobs 64] [--batch-tokens 1024] [--batch-size 16]
                                                    [--min-chars 400]

Per mode: `--backlog` requests of `--texts` corpus texts each are queued, the worker starts, and once its
first round is answered `--queries` one-text requests are sent, one every `--interval` seconds (open
loop). Printed: their latency (submit to answer stored; p50, max, and max in forward passes of bulk alone),
and the bulk texts through the device per second meanwhile, against a run of the backlog alone.
"""

from __future__ import annotations

import argparse
import logging
import threading
import time
from datetime import datetime, timezone

import redis

from bench._common import Timer, add_corpus_flags, describe_machine, load_corpus, median, model_path, ratio, table
from embedfleet.common.protocol.keys import queue_name
from embedfleet.common.redisserver import RedisServer
from embedfleet import Producer
from embedfleet.worker.engine.engine import Engine
from embedfleet.worker.engine.models.loader import load_model
from embedfleet.worker.serving.builder import build_worker
from embedfleet.worker.serving.config import given_settings


def _answered_at(conn, request_id: str) -> float:
    """When the worker stored the answer (rq's ended_at, this machine's clock)."""
    stamp = conn.hget(f"rq:job:{request_id}", "ended_at").decode()
    return datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=timezone.utc).timestamp()


def run(engine, texts: list[str], queries: list[str], args, backlog_priority: str) -> dict:
    """`queries` empty: the backlog alone, over the same window (bulk texts/s with nothing to yield to)."""
    with RedisServer() as server:
        conn = redis.Redis.from_url(server.url)
        # --no-cache: each row pays its forward pass, as the latencies measured behind the backlog assume
        settings = given_settings(max_jobs=args.max_jobs, poll_timeout=1, cache=False)
        worker = build_worker(settings, engine, conn)
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
            rows_before, passes_before = engine.forward_rows, engine.forward_passes
            sent = []
            with Timer() as phase:  # open loop: a query every --interval seconds, whatever the answers
                if queries:  # the first bulk rounds are on the device: queries land behind a busy device
                    time.sleep(args.interval)
                for query in queries:
                    sent.append((time.time(), producer.submit([query], name)))
                    time.sleep(args.interval)
                latencies = [producer.wait(i, 600) and _answered_at(conn, i) - at for at, i in sent]
                if not queries:
                    time.sleep(args.interval * (args.queries + 1))
            # bulk texts through the device meanwhile (not requests finished: a round's requests all finish
            # at its end, and a window of a few seconds would count one round more or less)
            bulk_during = engine.forward_rows - rows_before - len(queries)
            passes = engine.forward_passes - passes_before
            worker.stop()
            thread.join(600)
            left = sum(1 for i in backlog if producer.status(i) != "finished")
    pass_s = phase.seconds / max(passes, 1)  # the device is never idle here: the backlog keeps it busy
    return {"p50": median(latencies) if latencies else float("nan"), "max": max(latencies, default=float("nan")),
            "pass_s": pass_s, "bulk_texts_per_s": bulk_during / phase.seconds, "backlog_left": left}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_corpus_flags(parser, None)
    parser.add_argument("--backlog", type=int, default=40, help="bulk requests queued first")
    parser.add_argument("--texts", type=int, default=16, help="texts per bulk request")
    parser.add_argument("--queries", type=int, default=8, help="interactive one-text requests")
    parser.add_argument("--interval", type=float, default=0.5, help="seconds between two queries (open loop)")
    parser.add_argument("--min-chars", type=int, default=400, help="the backlog's texts are corpus texts of at "
                        "least this many characters (so that it outlasts the queries)")
    parser.add_argument("--max-jobs", type=int, default=64, help="most requests per worker round (rounds are "
                        "also cut by work: 3 forward passes' worth of estimated tokens)")
    parser.add_argument("--batch-tokens", type=int, default=1024, help="padded tokens per forward pass (the "
                        "shape a quiet 2-core start probes for MiniLM)")
    parser.add_argument("--batch-size", type=int, default=16, help="rows per forward pass")
    parser.add_argument("--verbose", action="store_true", help="the worker's log on stderr")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(name)s %(message)s")
    corpus = load_corpus(args.corpus, args.limit)
    # the backlog must keep the device busy for the whole query phase: texts of --min-chars and more
    long = [t for t in corpus if len(t) >= args.min_chars] or corpus
    texts = (long * (1 + args.backlog * args.texts // len(long)))[:args.backlog * args.texts]
    queries = [t for t in corpus if 10 <= len(t) <= 60][:args.queries]
    engine = Engine(load_model(model_path(), served_name="all-MiniLM-L6-v2"), max_batch_tokens=args.batch_tokens,
                    max_batch_size=args.batch_size)
    fifo = run(engine, texts, queries, args, "interactive")
    levels = run(engine, texts, queries, args, "bulk")
    alone = run(engine, texts, [], args, "bulk")
    print(describe_machine())
    rows = [["interactive (one FIFO)", fifo], ["bulk (priority levels)", levels], ["bulk alone, no queries", alone]]
    print(table(["backlog queued at", "interactive p50 s", "interactive max s", "max in passes",
                 "bulk texts/s meanwhile", "x bulk alone", "backlog left when done"],
                [[label, r["p50"], r["max"], r["max"] / alone["pass_s"], r["bulk_texts_per_s"],
                  ratio(r["bulk_texts_per_s"], alone["bulk_texts_per_s"]), r["backlog_left"]] for label, r in rows],
                title=f"{args.backlog} x {args.texts}-text bulk requests queued, then {len(queries)} one-text "
                      f"queries, one every {args.interval:g} s (max_jobs {args.max_jobs}, passes of "
                      f"{args.batch_tokens} tokens / {args.batch_size} rows: "
                      f"{alone['pass_s'] * 1000:.0f} ms each, bulk alone)"))
    print(f"\ninteractive p50 ratio FIFO / levels: {ratio(fifo['p50'], levels['p50']):.1f}x, "
          f"max: {ratio(fifo['max'], levels['max']):.1f}x")


if __name__ == "__main__":
    main()
