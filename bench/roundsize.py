"""How big a round must be for length sorting to pay: the engine alone (in process, no Redis) over the corpus's
first `--limit` texts as requests of `--chunk` texts, run in rounds of N requests, at one fixed pass shape.
A round sorts its own inputs by length before cutting passes; the bare loop of bench/throughput.py sorts all
of them at once (the "all" row here). Why a round holds 16 passes of work (worker/serving/yielding.py ROUND_PASSES).

    PYTHONPATH=. .venv/bin/python bench/roundsize.py [--limit 1000] [--chunk 16] [--rounds 2,8,16,32,all]
                                                     [--batch-tokens 1024] [--batch-size 16] [--repeat 2]
"""

from __future__ import annotations

import argparse

from bench._common import Timer, add_corpus_flags, describe_machine, load_corpus, model_path, ratio, table
from embedfleet.common.request import EmbedRequest
from embedfleet.worker.engine.engine import Engine
from embedfleet.worker.engine.models.loader import load_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_corpus_flags(parser, 1000)
    parser.add_argument("--chunk", type=int, default=16, help="texts per request")
    parser.add_argument("--rounds", default="2,8,16,32,all", help="requests per round, comma list ('all': one)")
    parser.add_argument("--batch-tokens", type=int, default=1024, help="padded tokens per forward pass")
    parser.add_argument("--batch-size", type=int, default=16, help="rows per forward pass")
    parser.add_argument("--repeat", type=int, default=2, help="alternating runs; each row keeps its best")
    args = parser.parse_args()
    texts = load_corpus(args.corpus, args.limit)
    model = load_model(model_path(), served_name="m")
    requests = [EmbedRequest(model="m", inputs=texts[i:i + args.chunk], params={"truncate_prompt_tokens": -1})
                for i in range(0, len(texts), args.chunk)]
    sizes = [len(requests) if size == "all" else int(size) for size in args.rounds.split(",")]
    engine = Engine(model, max_batch_tokens=args.batch_tokens, max_batch_size=args.batch_size)
    engine.run(requests[:2])  # warm
    best = dict.fromkeys(sizes, 0.0)
    for _ in range(args.repeat):
        for size in sizes:
            with Timer() as timer:
                for start in range(0, len(requests), size):
                    engine.run(requests[start:start + size])
            best[size] = max(best[size], len(texts) / timer.seconds)
    one = best[len(requests)] if len(requests) in best else max(best.values())
    print(describe_machine())
    print(table(["requests per round", "texts per round", "texts/s", "x one round"],
                [[size, size * args.chunk, f"{rate:.1f}", f"{ratio(rate, one):.2f}"] for size, rate in best.items()],
                f"{len(texts)} texts as {len(requests)} requests of {args.chunk}, passes of {args.batch_tokens} "
                f"tokens / {args.batch_size} rows, best of {args.repeat}"))


if __name__ == "__main__":
    main()
