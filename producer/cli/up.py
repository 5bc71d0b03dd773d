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

import sys

from embedfleet.producer.cli.upsettings import UpSettings
from embedfleet.producer.cli.upstart import Fleet
from embedfleet.producer.cli.upstop import install_stop_handler


def run(settings: UpSettings) -> int:
    stop = install_stop_handler()
    fleet = Fleet(settings)
    try:
        return fleet.serve(stop)
    finally:
        fleet.stop()


if __name__ == "__main__":
    from embedfleet.common import console

    sys.exit(console.run(lambda argv: run(UpSettings.from_args(argv, "embedfleet up", __doc__)), sys.argv[1:]))
