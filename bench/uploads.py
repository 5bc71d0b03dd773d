"""Gateway peak memory for POST /v1/files: one and four concurrent 64 MiB uploads, per tree (before/after).

    PYTHONPATH=. .venv/bin/python bench/uploads.py [--trees /work/main,.] [--mib 64] [--concurrent 1,4]

For each tree and each concurrency, a private redis-server and a fresh `python -m embedfleet.producer.gateway` from
that tree (so its peak, /proc VmHWM, is this row's alone); its resident memory once it answers /health is
the baseline. The uploads (a JSONL file just under --mib MiB, sent by httpx as the `openai` client sends
it: multipart) go at once from threads of this process; the row gives the gateway's peak resident memory
and the peak's growth over the baseline, in MiB and as a multiple of the bytes uploaded at once. With
--max-concurrent-uploads below the concurrency the extra uploads get 429 (this bench sets it to the
concurrency).
"""

from __future__ import annotations

import argparse
import sys
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import Process, RedisServer, describe_machine, free_port, module_in, rss_mib, table, wait_http


def peak_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def jsonl(size: int) -> bytes:
    line = b'{"custom_id":"r","method":"POST","url":"/v1/embeddings","body":{"input":"' + b"x" * 900 + b'"}}\n'
    return line * (size // len(line))


def run_one(tree: Path, content: bytes, concurrent: int) -> dict:
    import httpx

    with RedisServer() as server:
        port = free_port()
        gateway = Process([sys.executable, "-P", "-m", module_in(tree, "producer.gateway"), "--redis-url", server.url,
                           "--port", str(port), "--log-level", "warning", "--batch-max-running", "0"], "gateway",
                          pythonpath=(tree,), env={"EMBEDFLEET_MAX_CONCURRENT_UPLOADS": str(concurrent)})
        with gateway:
            base = f"http://127.0.0.1:{port}"
            wait_http(gateway, base + "/health", 60, any_status=True)
            baseline = rss_mib(gateway.pid)
            statuses: list[int] = []

            def upload() -> None:
                answer = httpx.post(base + "/v1/files", files={"file": ("big.jsonl", content)},
                                    data={"purpose": "batch"}, timeout=600)
                statuses.append(answer.status_code)
                if answer.status_code == 200:
                    assert answer.json()["bytes"] == len(content), answer.text

            threads = [threading.Thread(target=upload) for _ in range(concurrent)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            peak = peak_mib(gateway.pid)
            if len(statuses) != concurrent:
                raise gateway.fail(f"{concurrent - len(statuses)} uploads failed")
    return {"tree": str(tree), "uploads": concurrent, "statuses": statuses, "baseline": baseline, "peak": peak}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trees", default="/work/main,.")
    parser.add_argument("--mib", type=int, default=64)
    parser.add_argument("--concurrent", default="1,4")
    args = parser.parse_args()
    content = jsonl(args.mib * 1024 * 1024 - 4096)  # under the default --max-file-bytes with the framing
    rows = []
    for concurrent in [int(n) for n in args.concurrent.split(",")]:
        for tree in [Path(t).resolve() for t in args.trees.split(",")]:
            found = run_one(tree, content, concurrent)
            grown = found["peak"] - found["baseline"]
            rows.append([str(tree), concurrent, ",".join(map(str, sorted(set(found["statuses"])))),
                         f"{found['baseline']:.0f}", f"{found['peak']:.0f}", f"{grown:.0f}",
                         f"{grown * 1024 * 1024 / (len(content) * concurrent):.2f}"])
            print(rows[-1], flush=True)
    print(describe_machine())
    print(table(["tree", "uploads at once", "statuses", "RSS before MiB", "peak RSS MiB", "growth MiB",
                 "growth / bytes uploaded"], rows, f"Gateway memory for {args.mib} MiB uploads"))


if __name__ == "__main__":
    main()
