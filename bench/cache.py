"""Texts/s on a corpus with 50% repeats, the vector cache on vs off, side by side on one worker.

    PYTHONPATH=. .venv/bin/python bench/cache.py [--limit 600] [--chunk 16] [--max-jobs 16] [--repeat 2]
        [--device cpu|cuda] [--corpus FILE]

The corpus: --limit texts, then the same texts again in a shuffled order (seeded), so half of what is
embedded repeats an earlier text, the way a bulk job re-embeds a corpus that barely changed. Each repeat
takes the next --limit texts of the file, so that neither the cache in Redis nor the worker's memory of
recent vectors holds any of them when its "on" run starts.

Requests of --chunk texts are submitted at once (Producer.submit_many) to one `python -m embedfleet.worker` on a
private redis-server and waited for. "off" sends every request with cache=False (still deduplicated within
a round, as every request is); in "on" the first occurrences are misses and fill the cache. --max-jobs
(requests per round) is small so that a repeat seldom shares a round with its first occurrence: what is
measured is the cache, not in-round dedup. "off" and "on" alternate on the same texts, --repeat times, and
each row keeps its best run. Bounded by --limit and --repeat.
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (RedisServer, Timer, add_corpus_flags, describe_machine, load_corpus, model_path, ratio,
                     start_worker, table)


def run(producer, batches: list[list[str]], cache: bool) -> float:
    with Timer() as timer:
        ids = producer.submit_many(batches, "bench", truncate_prompt_tokens=-1, cache=cache)
        for request_id in ids:
            producer.wait(request_id, timeout=3600)
    return timer.seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_corpus_flags(parser, limit=600)
    parser.add_argument("--chunk", type=int, default=16, help="texts per request")
    parser.add_argument("--max-jobs", type=int, default=16, help="the worker's requests per round")
    parser.add_argument("--repeat", type=int, default=2, help="runs of each row (best kept)")
    parser.add_argument("--device", default=None, help="cpu or cuda (default: the worker's choice)")
    args = parser.parse_args()

    import redis

    from embedfleet import Producer

    corpus = load_corpus(args.corpus, args.limit * args.repeat)
    runs = []
    for start in range(0, len(corpus), args.limit):
        unique = corpus[start:start + args.limit]
        repeats = list(unique)
        random.Random(start).shuffle(repeats)
        texts = unique + repeats
        runs.append([texts[i:i + args.chunk] for i in range(0, len(texts), args.chunk)])
    extra = ["--max-jobs", str(args.max_jobs), *(["--device", args.device] if args.device else [])]
    best = {"off": float("inf"), "on": float("inf")}
    with RedisServer() as server, start_worker(server.url, model_path(), "bench", *extra), \
            Producer(server.url) as producer:
        run(producer, [["a warm-up text"] * args.chunk] * 4, cache=False)  # first passes, allocator
        for batches in runs:
            best["off"] = min(best["off"], run(producer, batches, cache=False))
            best["on"] = min(best["on"], run(producer, batches, cache=True))
        conn = redis.Redis.from_url(server.url)
        cached = sum(1 for _ in conn.scan_iter("embedfleet:cache:*", count=1000))
        conn.close()
    print(describe_machine())
    print(f"{cached} vectors cached at the end ({args.limit} distinct texts per run, {len(runs)} runs)")
    texts = 2 * args.limit
    rows = [[f"cache {name}", texts, f"{seconds:.2f}", f"{texts / seconds:.0f}",
             f"{ratio(best['off'], seconds):.2f}"] for name, seconds in best.items()]
    print(table(["path", "texts (50% repeats)", "best s", "texts/s", "x cache off"], rows,
                title=f"bundled all-MiniLM-L6-v2, {args.chunk} texts/request, --max-jobs {args.max_jobs}"))


if __name__ == "__main__":
    main()
