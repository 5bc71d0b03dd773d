"""The `embedfleet` command: up, worker, gateway, embed (bulk file), status."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np
from pydantic import Field

from common import keys
from common.config import Settings

USAGE = """usage: embedfleet {up,worker,gateway,embed,status} [options]

  up       embedded Redis + worker(s) + gateway in one command (Ctrl-C stops all)
  worker   serve one model from a Redis queue        (embedfleet worker --help)
  gateway  HTTP gateway: /v1/embeddings, /pooling   (embedfleet gateway --help)
  embed    embed a file of texts into a .npy file    (embedfleet embed --help)
  status   served models, live workers, queue depths
"""


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command in ("worker", "gateway"):
        # Separate programs, so that this CLI never imports torch or the web stack.
        module = "worker" if command == "worker" else "producer.gateway"
        os.execv(sys.executable, [sys.executable, "-m", module, *rest])
    if command == "up":
        from producer import up  # noqa: PLC0415

        return up.run(up.UpSettings.from_args(rest, "embedfleet up", up.__doc__))
    if command == "embed":
        return embed_file(rest)
    if command == "status":
        return status(Settings.from_args(rest, "embedfleet status", "Show what the fleet serves."))
    print(f"embedfleet: unknown command {command!r}\n\n{USAGE}", file=sys.stderr)
    return 2


class EmbedFileSettings(Settings):
    model: str | None = Field(None, description="served model name; default: the only one served")
    chunk: int = Field(64, description="texts per request")
    timeout: float = Field(600.0, description="seconds to wait for each request's result")
    embed_dtype: str = Field("float32", description="output dtype (see PoolingParams)")
    dimensions: int | None = Field(None, description="Matryoshka dimensions")
    truncate_prompt_tokens: int | None = Field(None, description="-1: truncate to the model's max length")


def embed_file(argv: list[str]) -> int:
    """Embed INPUT (one text per line, or a JSON list of texts) into OUTPUT (.npy), in submit order."""
    parser = argparse.ArgumentParser(prog="embedfleet embed", add_help=False)
    parser.add_argument("input", type=Path)
    parser.add_argument("output", type=Path)
    known, rest = parser.parse_known_args(argv)
    settings = EmbedFileSettings.from_args(rest, "embedfleet embed INPUT OUTPUT", embed_file.__doc__)
    texts = _read_texts(known.input)
    if not texts:
        raise SystemExit(f"{known.input}: no texts to embed")
    from producer.client import Producer  # noqa: PLC0415

    fields = {k: v for k, v in {"embed_dtype": settings.embed_dtype, "dimensions": settings.dimensions,
                                "truncate_prompt_tokens": settings.truncate_prompt_tokens}.items() if v is not None}
    with Producer(settings.redis_url) as producer:
        chunks = [texts[i:i + settings.chunk] for i in range(0, len(texts), settings.chunk)]
        ids = producer.submit_many(chunks, settings.model, **fields)
        arrays, tokens = [], 0
        for request_id in ids:
            result = producer.wait(request_id, settings.timeout)
            arrays.append(result.embeddings)
            tokens += result.usage.prompt_tokens
    out = np.concatenate(arrays)
    np.save(known.output, out)
    print(f"embedded {len(texts)} texts ({tokens} tokens) -> {known.output} {out.shape} {out.dtype}")
    return 0


def _read_texts(path: Path) -> list[str]:
    raw = path.read_text(encoding="utf-8")
    if path.suffix == ".json":
        texts = json.loads(raw)
        if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
            raise SystemExit(f"{path}: expected a JSON list of strings")
        return texts
    if path.suffix == ".jsonl":
        return [json.loads(line) for line in raw.splitlines() if line.strip()]
    return [line for line in raw.splitlines() if line.strip()]


def status(settings: Settings) -> int:
    from producer.client import Producer  # noqa: PLC0415

    with Producer(settings.redis_url) as producer:
        served = producer.models()
        if not served:
            print("no model is served (no live worker)")
        for name, caps in sorted(served.items()):
            print(f"{name}: {producer.live_workers(name)} live worker(s), queue depth "
                  f"{producer.queue_depth(name)}, queue {keys.queue_name(name)}, dim {caps.embedding_size}, "
                  f"max length {caps.max_model_len}, pooling {caps.pooling}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
