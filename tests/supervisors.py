"""`embedfleet worker --replicas ...` supervisors of the null model, served as MODEL, and the engines of MODEL
that Redis shows alive."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys

from embedfleet.common.protocol import keys
from embedfleet.producer.client.core import parse_worker_info
from tests.commands import ROOT, children_of, clean_env

MODEL = "replicas"
LEASE = 2.0


@contextlib.contextmanager
def supervisor(redis_url: str, tmp_path, *flags: str, **env: str):
    """`embedfleet worker --replicas ...` on the null model; its output goes to a file (read on failure)."""
    log = tmp_path / "worker.log"
    env = clean_env(tmp_path, EMBEDFLEET_REDIS_URL=redis_url, **env)
    with open(log, "w") as out:
        parent = subprocess.Popen([sys.executable, "-m", "embedfleet.producer.cli", "worker", "--model", "null:4",
                                   "--served-model-name", MODEL, "--lease-seconds", str(LEASE), "--max-jobs", "8",
                                   "--no-cache", *flags], env=env, cwd=ROOT, stdin=subprocess.DEVNULL,
                                  stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    started: set[int] = set()  # its engines: each in a session of its own, out of reach of a killpg

    def engine_pids() -> set[int]:
        """Its engines now, remembered for the clean-up (once it is dead, they are nobody's children)."""
        now = set(children_of(parent.pid))
        started.update(now)
        return now

    try:
        yield parent, log, engine_pids
    finally:
        started.update(children_of(parent.pid))
        if parent.poll() is None:
            parent.send_signal(signal.SIGTERM)
            try:
                parent.wait(30)
            except subprocess.TimeoutExpired:
                parent.kill()
        for pid in started:  # whatever the test left running
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def engines(conn) -> dict[str, dict]:
    """The live engines of MODEL: name -> advertised facts."""
    names = [n.decode() for n in conn.zrange(keys.model_workers_key(MODEL), 0, -1)]
    facts = {n: parse_worker_info(n, conn.get(keys.worker_info_key(n))) for n in names}
    return {n: f for n, f in facts.items() if f is not None}
