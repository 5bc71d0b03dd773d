"""`embedfleet embed` on the null model, side by side in one run: the bounded window (default 16 requests in
flight) vs every request at once (the first version's way, --window larger than the file), and a run killed
by SIGKILL half-way then resumed: texts/s (wall clock of the command, start-up included) and the most
requests of the run seen queued or in progress at once (sampled every 2 ms).

    PYTHONPATH=. .venv/bin/python bench/bulk.py [--lines 50000] [--chunk 64] [--window 16] [--minilm 400]

With --minilm N, also: the first N corpus texts through the bundled all-MiniLM-L6-v2 worker with three
chunkings (8 texts x window 2, 64 x 16, 1 x 64): whether the .npy files are byte-identical, i.e. whether this
machine's worker gives the same bits for a text whatever round it lands in (what a resumed run relies on
to match an uninterrupted one with a real model).

The corpus's texts (repeated up to --lines) go in a .txt file; the output is .npy. One private redis-server
and one `python -m embedfleet.worker --model null:384` serve every row.
"""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import redis

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (REPO, RedisServer, describe_machine, load_corpus, model_path, ratio, start_worker,
                     table)

from embedfleet.common.names import PRIORITIES
from embedfleet.common.protocol.keys import queue_name

MODEL = "null"


class Peak:
    """The most requests of MODEL queued or taken at once, while the block runs."""

    def __init__(self, url: str):
        self.conn, self.most, self._stop = redis.Redis.from_url(url), 0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(5)

    def _run(self):
        names = [queue_name(MODEL, p) for p in PRIORITIES]
        while not self._stop.wait(0.002):
            pipe = self.conn.pipeline()
            for name in names:
                pipe.llen(f"rq:queue:{name}").zcard(f"rq:wip:{name}")
            self.most = max(self.most, sum(pipe.execute()))


def embed(url: str, source: Path, out: Path, *flags: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "embedfleet.producer.cli", "embed", str(source), str(out),
                             "--redis-url", url, "--no-progress", *flags], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(run: subprocess.Popen) -> None:
    _, stderr = run.communicate(timeout=600)
    if run.returncode != 0:
        raise SystemExit(f"embed failed ({run.returncode}): {stderr}")


def same_bits_with_minilm(texts: list[str]) -> str:
    chunkings = ((8, 2), (64, 16), (1, 64))
    with tempfile.TemporaryDirectory() as folder, RedisServer(Path(folder) / "redis") as server:
        source = Path(folder) / "texts.txt"
        source.write_text("\n".join(texts) + "\n")
        worker = start_worker(server.url, model_path(), "minilm")
        try:
            outputs = []
            for chunk, window in chunkings:
                out = Path(folder) / f"{chunk}.npy"
                finish(embed(server.url, source, out, "--chunk", str(chunk), "--window", str(window),
                             "--truncate-prompt-tokens", "-1"))
                outputs.append(out.read_bytes())
        finally:
            worker.stop()
    same = all(o == outputs[0] for o in outputs)
    shapes = ", ".join(f"{chunk} x {window}" for chunk, window in chunkings)
    return f"all-MiniLM-L6-v2, {len(texts)} corpus texts, chunk x window {shapes}: byte-identical .npy: {same}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lines", type=int, default=50_000)
    parser.add_argument("--chunk", type=int, default=64)
    parser.add_argument("--window", type=int, default=16)
    parser.add_argument("--minilm", type=int, default=0, help="texts for the real-model byte check (0: skip)")
    args = parser.parse_args()
    corpus = [" ".join(t.split()) for t in load_corpus() if t.strip()]
    lines = [corpus[i % len(corpus)] for i in range(args.lines)]
    requests = -(-args.lines // args.chunk)
    rows = []
    with tempfile.TemporaryDirectory() as folder, RedisServer(Path(folder) / "redis") as server:
        source = Path(folder) / "texts.txt"
        source.write_text("\n".join(lines) + "\n")
        worker = start_worker(server.url, f"null:{384}", MODEL)
        try:
            for label, window in ((f"window {args.window}", args.window), ("all at once", requests)):
                flags = ["--chunk", str(args.chunk), "--window", str(window)]
                with Peak(server.url) as peak:
                    began = time.perf_counter()
                    finish(embed(server.url, source, Path(folder) / f"{window}.npy", *flags))
                    seconds = time.perf_counter() - began
                rows.append([label, args.lines, seconds, args.lines / seconds, peak.most])
            flags = ["--chunk", str(args.chunk), "--window", str(args.window)]
            out = Path(folder) / "killed.npy"
            with Peak(server.url) as peak:
                began = time.perf_counter()
                run = embed(server.url, source, out, *flags)
                log = out.with_name(out.name + ".embedfleet-checkpoint")
                while not log.exists() or log.stat().st_size < args.lines * 384 * 4 // 2:
                    time.sleep(0.005)  # about half the vectors (384 float32 each) logged
                run.send_signal(signal.SIGKILL)
                run.wait()
                finish(embed(server.url, source, out, *flags))
                seconds = time.perf_counter() - began
            same = out.read_bytes() == (Path(folder) / f"{args.window}.npy").read_bytes()
            rows.append([f"window {args.window}, SIGKILL half-way + resume (same bytes: {same})", args.lines, seconds,
                         args.lines / seconds, peak.most])
        finally:
            worker.stop()
    if args.minilm:
        print(same_bits_with_minilm(corpus[:args.minilm]))
    print(describe_machine())
    print(table(["run", "texts", "seconds", "texts/s", "most requests in the queue"], rows,
                title=f"embedfleet embed, null:384, {args.chunk} texts per request ({requests} requests)"))
    print(f"\nwindow / all at once, texts/s: {ratio(rows[0][3], rows[1][3]):.2f}x; queue held: {rows[0][4]} vs "
          f"{rows[1][4]} requests")


if __name__ == "__main__":
    main()
