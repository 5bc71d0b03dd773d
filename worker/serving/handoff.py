"""The hand-offs between a worker's three stages, and the slot that bounds what it prepares ahead.

    take stage --[prepared: one round]--> forward stage --[forwarded: one round]--> finish stage

The take stage takes a round only while it holds the slot (`reserve`), and the slot goes with the round it
offers until the forward stage picks that round up: so at most one prepared round waits for the device, and a
worker holds at most four rounds (one being taken, one waiting, one on the device, one being finished) however
deep the queue is. Every release of the slot is in this class: a round leaves the hand-off through `next_round`
or `keep`, or goes back into it through `put_back` (still holding its slot), and a take that found nothing gives
its reservation up (`unreserve`).

`END` closes a hand-off: the take stage queues it last (it needs no slot: it is no round), the forward stage
passes it on to the finish stage.
"""

from __future__ import annotations

import contextlib
import queue as stdqueue
import threading
from collections.abc import Callable

from embedfleet.worker.engine import stageclock


class _End:
    def __repr__(self) -> str:
        return "END"


END = _End()  # no more rounds


class Handoff:
    """The prepared and forwarded hand-offs of one `work()` run and the slot; safe from any thread."""

    def __init__(self) -> None:
        self._prepared: stdqueue.Queue = stdqueue.Queue(maxsize=1)
        self._forwarded: stdqueue.Queue = stdqueue.Queue(maxsize=1)
        self._slot = threading.Semaphore(1)  # held by the round being taken, then by the prepared one

    # -- the take stage ---------------------------------------------------------------------------------

    def reserve(self, timeout: float) -> bool:
        """The slot for the next round, or False if the previous one is still waiting after `timeout`."""
        return self._slot.acquire(timeout=timeout)

    def unreserve(self) -> None:
        """The take that held the slot brought no round."""
        self._slot.release()

    def offer(self, round_, timeout: float | None = None) -> bool:
        """The prepared round for the forward stage; it keeps the slot its take reserved. False: not taken
        within `timeout` (only once the forward stage is gone)."""
        try:
            self._prepared.put(round_, timeout=timeout)
        except stdqueue.Full:
            return False
        return True

    def close(self, timeout: float | None = None) -> None:
        """END after the last round (by the take stage, or handed back by a drain); not queued if the hand-off
        stays full for `timeout` (only when the forward stage is gone)."""
        with contextlib.suppress(stdqueue.Full):
            self._prepared.put(END, timeout=timeout)

    # -- the forward stage ------------------------------------------------------------------------------

    def next_round(self, timeout: float | None = None):
        """The next prepared round, which leaves the hand-off (its slot is free for the next take); END; or
        None when nothing came within `timeout`."""
        ready = self.look(timeout)
        return self.keep(ready)

    def look(self, timeout: float | None = 0):
        """The prepared round (or END, or None: nothing within `timeout`; 0: do not wait) taken out to decide
        about it: it keeps its slot until it is kept (`keep`) or put back (`put_back`)."""
        try:
            return self._prepared.get(timeout=timeout) if timeout != 0 else self._prepared.get_nowait()
        except stdqueue.Empty:
            return None

    def keep(self, ready):
        """A looked-at round leaves the hand-off (it runs, is set aside or goes back to its queue): the take
        stage may prepare the next one. Returns `ready`."""
        if ready is not None and ready is not END:
            self._slot.release()
        return ready

    def put_back(self, ready) -> bool:
        """A looked-at round (or END) back where it was, still holding its slot: nothing was taken meanwhile,
        since the slot was held. False where the take stage, stopping, queued its END meanwhile (it needs no
        slot): then the round has left the hand-off and goes back to its queue instead."""
        if ready is None:
            return True
        try:
            self._prepared.put_nowait(ready)
        except stdqueue.Full:  # (END is last: nothing follows it)
            self.keep(ready)
            return False
        return True

    def waiting(self) -> list:
        """What waits in the prepared hand-off now (a copy: tests and diagnostics)."""
        with self._prepared.mutex:
            return list(self._prepared.queue)

    def full(self) -> bool:
        return self._prepared.full()

    # -- forward stage -> finish stage ------------------------------------------------------------------

    def pass_on(self, item, alive: Callable[[], bool] = lambda: True) -> bool:
        """A round (or END) to the finish stage; waits while it is busy with the previous one. False: `alive()`
        said no while waiting (the finish stage is gone: the round's jobs stay started and are recovered)."""
        stageclock.lap("other")
        while True:
            try:
                self._forwarded.put(item, timeout=1.0)
                return True
            except stdqueue.Full:
                stageclock.lap("wait: hand-off full")
                if not alive():
                    return False

    def end_finish(self) -> None:
        """END to the finish stage without waiting (the forward stage is ending on a dead stage)."""
        with contextlib.suppress(stdqueue.Full):
            self._forwarded.put_nowait(END)

    def next_finished(self):
        """The next round for the finish stage, or END."""
        return self._forwarded.get()
