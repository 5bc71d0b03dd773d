"""What a worker's heartbeat thread does each beat (worker/serving/heartbeat.py runs it).

Every job a worker holds is in rq's started registry under a lease (common/protocol/keys.py) that the heartbeat
renews every third of the lease, also during a long forward pass; the same beat requeues any worker's lapsed
claims (common/protocol/claims.py `recover`) and runs the watchdog: a forward pass past its deadline (from
its token count) ends the process with WATCHDOG_EXIT so that its supervisor restarts it, and its jobs are
recovered by their lapsed leases. A job whose workers died with it MAX_DELIVERIES times is failed as poison
when it is taken again, never run (worker/serving/rounds.py).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from embedfleet.common.policy import RECOVER_LIMIT
from embedfleet.worker.engine.seam import ServingEngine
from embedfleet.worker.serving.advertise import Advertiser
from embedfleet.worker.serving.heartbeat import Watchdog
from embedfleet.worker.serving.ledger import Ledger
from embedfleet.worker.serving.levels import Levels
from embedfleet.worker.serving.lifecycle import WATCHDOG_EXIT, Lifecycle, exit_now
from embedfleet.worker.serving.livestats import LiveStats

log = logging.getLogger("embedfleet.worker")


class Upkeep:
    """One worker's beat: `beat()` every third of the lease, on the heartbeat thread; its advert every `interval`
    seconds. `rq_beat()`: rq's own worker heartbeat (its registration's TTL), sent with the advert while jobs are
    held. `recovered` counts the
    jobs of dead workers this worker requeued (written by the beat alone)."""

    def __init__(self, name: str, levels: Levels, engine: ServingEngine, *, ledger: Ledger, lifecycle: Lifecycle,
                 live: LiveStats, interval: float, rq_beat: Callable[[], None], info: dict | None = None,
                 stats: Callable[[], dict] | None = None, watchdog: Watchdog | None = None, inflight=None):
        self.name = name
        self.levels = levels
        # the advert: this worker's facts (`info`), its live state (`live_facts`) and counters (`stats`)
        self.advertiser = Advertiser(levels.connection, engine.caps, name, info=info, live=self.live_facts,
                                     stats=stats)
        self.ledger = ledger
        self.lifecycle = lifecycle
        self.live = live
        self.interval = interval  # seconds between two adverts
        self.rq_beat = rq_beat
        self.engine = engine
        self.watchdog = watchdog
        self.inflight = inflight
        self.recovered = 0
        self.advertised_at = float("-inf")

    def beat(self) -> None:
        """The watchdog, renew the leases of the jobs held (each only until its timeout), requeue other workers'
        lapsed claims; every advert interval, the advert."""
        if self.watchdog is not None and (overdue := self.watchdog.overdue()):
            log.critical("worker %s: a forward pass over %d padded tokens has run %.0f s, past its %.0f s "
                         "deadline; exiting with %d so that the supervisor restarts the worker (the leases "
                         "recover its jobs)", self.name, *overdue, WATCHDOG_EXIT)
            exit_now(WATCHDOG_EXIT)
        stamp = time.time()
        held = self.ledger.renewable(stamp)
        if held:
            self.levels.refresh(held)
        if self.inflight is not None:
            self.inflight.renew()  # the markers of the requests it computes: their followers keep waiting
        if stamp - self.advertised_at >= self.interval:
            self.advertiser.advertise()
            if held:
                self.rq_beat()
            self.advertised_at = stamp
        else:
            self.advertiser.publish_live()
        self.recover()

    def recover(self) -> int:
        """Requeue every lapsed claim of this model's queue (a dead worker's jobs); returns how many."""
        recovered = self.levels.recover(RECOVER_LIMIT)
        if recovered:
            self.recovered += len(recovered)
            owners = sorted({r.worker or "?" for r in recovered})
            log.warning("worker %s: requeued %d jobs of %s, whose lease lapsed (up to %.1f s ago)", self.name,
                        len(recovered), ", ".join(owners), max(r.overdue for r in recovered))
        return len(recovered)

    def live_facts(self) -> dict:
        """The advert's changing part: idle, busy (holding taken jobs) or draining, and worker.serving.livestats'."""
        state = "draining" if self.lifecycle.draining.is_set() else "busy" if len(self.ledger) else "idle"
        shaper = self.engine.shaper  # the shape in use and its measured rate
        return {"state": state, **self.live.facts(), **(shaper.facts() if shaper is not None else {})}
