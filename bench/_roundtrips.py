"""Redis round trips counted on the client side: every redis-py `send_packed_command` (one command, or one
whole pipeline / transaction / EVALSHA) is one round trip. In this process via `install()`; in a child process
via `child_hook()`, which puts a sitecustomize on its PYTHONPATH that installs the counter and rewrites a small
file with the running count every few milliseconds (read it with `read()`)."""

from __future__ import annotations

import os
import tempfile
import threading
from pathlib import Path

ENV = "EMBEDFLEET_BENCH_ROUND_TRIPS"
count = 0
_installed = False


def install() -> None:
    """Count round trips of every redis-py connection, sync and asyncio, in this process."""
    global _installed
    if _installed:
        return
    import redis.asyncio.connection as aconn
    import redis.connection as conn

    def wrap(cls, is_async: bool) -> None:
        send = cls.send_packed_command

        if is_async:
            async def counted(self, *args, **kwargs):
                global count
                count += 1
                return await send(self, *args, **kwargs)
        else:
            def counted(self, *args, **kwargs):
                global count
                count += 1
                return send(self, *args, **kwargs)
        cls.send_packed_command = counted

    wrap(conn.AbstractConnection, False)
    wrap(aconn.AbstractConnection, True)
    _installed = True


def report_to(path: str, interval: float = 0.005) -> None:
    """Install, then keep `path` holding the running count (a daemon thread)."""
    install()

    def loop() -> None:
        last = None
        while True:
            if count != last:
                last = count
                tmp = f"{path}.tmp"
                Path(tmp).write_text(str(last))
                os.replace(tmp, path)
            threading.Event().wait(interval)

    threading.Thread(target=loop, name="bench-round-trips", daemon=True).start()


def child_hook() -> tuple[Path, Path]:
    """(a folder to put first on a child Python's PYTHONPATH, the file its count lands in); the child also
    needs ENV set to that file."""
    hook = Path(tempfile.mkdtemp(prefix="bench-roundtrips-"))
    (hook / "sitecustomize.py").write_text(
        "import os, sys\n"
        f"sys.path.insert(0, {str(Path(__file__).resolve().parent)!r})\n"
        "import _roundtrips\n"
        f"_roundtrips.report_to(os.environ[{ENV!r}])\n")
    out = hook / "count"
    out.write_text("0")
    return hook, out


def read(path: Path) -> int:
    try:
        return int(path.read_text() or 0)
    except (FileNotFoundError, ValueError):
        return 0
