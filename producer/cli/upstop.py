"""`up`'s ordered stop: the gateway, then the workers (each finishes its batch and withdraws its advert), then
Redis (its AOF flushed); a child that does not stop within STOP_TIMEOUT is killed. And how `up` speaks (`say`)."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time

from embedfleet.common import fleetstate

STOP_TIMEOUT = 60.0  # seconds a child may take to stop (a worker finishes its batch) before it is killed


class FleetStop:
    """The part of a Fleet (upstart.py) that lists its children and stops them in order."""

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
            say("stopping the gateway")
            _terminate([self.gateway])
        if self.workers:
            say(f"stopping {len(self.workers)} worker(s); each finishes its batch")
            _terminate(self.workers)
        if self.redis is not None:
            say("stopping Redis")
            self.redis.stop()
        if self._lock is not None:
            os.close(self._lock)
        if self.redis is not None or self.workers:
            say("stopped")


def _terminate(children: list[subprocess.Popen]) -> None:
    for child in children:
        if child.poll() is None:
            child.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + STOP_TIMEOUT
    for child in children:
        try:
            child.wait(max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            say(f"pid {child.pid} did not stop within {STOP_TIMEOUT:g} s; killed")
            os.killpg(child.pid, signal.SIGKILL)  # and its session; its engines get SIGTERM as it dies
            child.wait()


def say(message: str) -> None:
    print(f"embedfleet: {message}", flush=True)


class StopSignal(threading.Event):
    """Set by SIGINT or SIGTERM; `signum` is the first of them. After Ctrl-C `up` exits 130 (the shell's code, as
    the worker does), after SIGTERM (docker, systemd: a stop asked for) 0."""

    signum: int | None = None

    def received(self, signum: int, _frame=None) -> None:
        self.signum = self.signum or signum
        self.set()


def install_stop_handler() -> StopSignal:
    stop = StopSignal()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, stop.received)
    return stop
