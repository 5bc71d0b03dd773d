"""Claiming batches: every gateway replica runs a Runner that claims unfinished batches with a lease in Redis,
renews the lease while it drives each (drive.py: validating -> in_progress -> finalizing -> completed; failed;
cancelling -> cancelled; expired) and gives it back when it stops, so that another replica takes the batch over.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid

import redis

from embedfleet.common.errors import EmbedfleetError
from embedfleet.common.protocol import batchkeys
from embedfleet.producer.gateway.batches.drive import Drive
from embedfleet.producer.gateway.batches.store import BatchGone, LeaseLost, Store

log = logging.getLogger(__name__)


class Runner:
    """This replica's batch runner: claims batches (up to `max_running` at a time) and drives them."""

    def __init__(self, gw, store: Store):
        settings = gw.settings
        self.gw = gw
        self.store = store
        self.token = uuid.uuid4().hex  # this replica's name on its leases
        self.lease = settings.batch_lease_seconds
        self.in_flight = settings.batch_in_flight
        self.poll = settings.batch_poll_seconds
        self.max_running = settings.batch_max_running
        self.output_ttl = batchkeys.FILE_TTL
        self.driving: dict[str, asyncio.Task] = {}
        self._wakeup = asyncio.Event()
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        if self.max_running > 0:
            self._task = asyncio.get_running_loop().create_task(self._loop(), name="embedfleet batches")

    def poke(self) -> None:
        """Look for batches now (a batch was created on this replica)."""
        self._wakeup.set()

    async def close(self) -> None:
        """Stop driving; each lease is given back so that another replica (or this one restarted) takes the
        batch over at once rather than after the lease."""
        tasks = [t for t in [self._task, *self.driving.values()] if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _loop(self) -> None:
        failing = False  # a Redis outage is logged once, not once per look
        while True:
            try:
                await self._claim()
                if failing:
                    log.info("batches: Redis answers again; looking for batches to run")
                failing = False
            except (redis.RedisError, OSError, EmbedfleetError) as exc:
                if not failing:
                    log.warning("batches: cannot look for batches to run (%s); trying every %g s", exc, self.poll)
                failing = True
            except Exception:  # the loop must outlive any one bad pass, loudly
                log.exception("batches: unexpected error while looking for batches to run")
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._wakeup.wait(), self.poll)
            self._wakeup.clear()

    async def _claim(self) -> None:
        for batch_id in await self.store.active():
            if len(self.driving) >= self.max_running:
                return
            if batch_id not in self.driving and await self.store.claim(batch_id, self.token, self.lease):
                self.driving[batch_id] = asyncio.get_running_loop().create_task(
                    self._drive(batch_id), name=f"embedfleet batch {batch_id}")

    async def _drive(self, batch_id: str) -> None:
        driver = asyncio.current_task()
        renewer = asyncio.get_running_loop().create_task(self._renew(batch_id, driver))
        try:
            await Drive(self, batch_id).run()
        except LeaseLost:
            log.warning("batch %s: this replica's lease lapsed; another replica drives it now", batch_id)
        except BatchGone:
            await self.store.forget(batch_id)
        except asyncio.CancelledError:
            pass
        except Exception:  # logged; the lease is given back and the batch taken up again
            log.exception("batch %s: driving it failed; it is taken up again on the next look", batch_id)
        finally:
            renewer.cancel()
            with contextlib.suppress(Exception):
                await asyncio.shield(self.store.release(batch_id, self.token))
            self.driving.pop(batch_id, None)

    async def _renew(self, batch_id: str, driver: asyncio.Task) -> None:
        """Renew the lease every third of it; stop the driver once it cannot be renewed in time."""
        renewed = time.monotonic()
        while True:
            await asyncio.sleep(self.lease / 3)
            try:
                held = await self.store.renew(batch_id, self.token, self.lease)
            except (redis.RedisError, OSError) as exc:
                held = time.monotonic() - renewed < self.lease  # Redis away: the lease still runs
                log.warning("batch %s: cannot renew the lease (%s)", batch_id, exc)
            else:
                renewed = time.monotonic() if held else renewed
            if not held:
                log.warning("batch %s: the lease is lost; stopping", batch_id)
                driver.cancel()
                return
