"""`up`'s watch: a Redis, worker or gateway that dies is said in one line and started again after a pause that
doubles with each quick failure (common/restarts.py); one that keeps failing stops the fleet (exit 1)."""

from __future__ import annotations

import threading
import time

import redis
from rq import SimpleWorker

from embedfleet.common import fleetstate
from embedfleet.common.errors import InternalError, StartupError
from embedfleet.common.protocol import keys
from embedfleet.common.redisclient import connect
from embedfleet.common.serializer import MsgpackSerializer
from embedfleet.common.restarts import Restarts, exit_reason
from embedfleet.producer.cli.upstop import say

WATCH_INTERVAL = 0.5  # seconds between looks at the children


def is_engine_of(worker_name: str, advertised: str) -> bool:
    """The worker itself, or one of its engines (worker/serving/gpus.py names them <name>-<label>)."""
    return advertised == worker_name or advertised.startswith(worker_name + "-")


class FleetWatch:
    """The part of a Fleet (upstart.py) that watches its children and starts each that dies again."""

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
                say(f"{label} {death}; starting it again in {delay:g} s (restart {plan.failures} of at most "
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
        say(said)

    def _forget_worker(self, worker_name: str) -> None:
        """A dead worker's advert and rq registration, so that neither `status` nor `rq info` count it."""
        try:
            connection = connect(self.url)
            try:
                listed = connection.zrange(keys.model_workers_key(self.name), 0, -1)
                engines = [n for n in listed if is_engine_of(worker_name, n.decode())]
                if engines:
                    connection.zrem(keys.model_workers_key(self.name), *engines)
                for worker in SimpleWorker.all(connection=connection, serializer=MsgpackSerializer):
                    if is_engine_of(worker_name, worker.name):
                        worker.register_death()
            finally:
                connection.close()
        except redis.RedisError as exc:  # Redis is down too: the registration expires by itself
            say(f"could not unregister dead worker {worker_name} ({exc}); it expires by itself")

    def _publish(self) -> None:
        self.state_file = fleetstate.write({"redis_url": self.url, "gateway_url": self.gateway_url,
                                            "model": self.name, "pids": self.pids()})
