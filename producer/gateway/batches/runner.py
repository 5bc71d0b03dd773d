"""Running batches: every gateway replica runs a Runner that claims unfinished batches with a lease in Redis
and drives each through its lifecycle (validating -> in_progress -> finalizing -> completed; failed;
cancelling -> cancelled; expired).

A line runs as request `<batch_id>-<index>` at `bulk` priority through the same queues as every request,
at most --batch-in-flight lines of a batch at a time. Because the id is fixed before the submit and the
enqueue script refuses an id already in use, a replica that takes a batch over (its driver died: the lease
lapsed) simply submits every line not yet collected again: a line already queued, running or answered is
refused as a duplicate and waited for, one never submitted is submitted now. Nothing runs twice, nothing is
lost. Answers are collected into Redis as they land (store.collect, once per line), so a takeover redoes
nothing but the waiting.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import time
import uuid
from collections import deque

import redis

from embedfleet.common.errors import (DuplicateRequestError, EmbedfleetError, NoWorkerError, NotFoundError,
                                      QueueFullError, UnavailableError)
from embedfleet.common.protocol import keys
from embedfleet.producer.client import traced
from embedfleet.producer.client.core import pick_model
from embedfleet.producer.gateway.core import encoding
from embedfleet.producer.gateway.batches import lines as batchlines, objects
from embedfleet.producer.gateway.batches.lines import Line
from embedfleet.producer.gateway.batches.output import write_outputs
from embedfleet.producer.gateway.batches.store import BatchGone, LeaseLost, Store, now

log = logging.getLogger(__name__)

CHECK_SECONDS = 0.5  # how often a driver re-reads its batch's status (a cancel) and the clock (expiry)
RETRY_SECONDS = 1.0  # pause before a line refused for now (queue full, no worker, Redis away) is tried again
TRANSIENT = (QueueFullError, NoWorkerError, UnavailableError)
Collected = tuple[int, bool, int, bytes]  # index, answered with a 2xx, prompt tokens, the output line


class Unstorable(Exception):
    """Redis refuses what a batch must store while it answers (Drive.stored): the batch fails."""

    def __init__(self, what: str, error: Exception):
        super().__init__(what, error)
        self.what = what
        self.error = error


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
        self.output_ttl = keys.FILE_TTL
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


class Drive:
    """One replica driving one batch, from whatever state it finds the batch in."""

    def __init__(self, runner: Runner, batch_id: str):
        self.runner = runner
        self.store = runner.store
        self.gw = runner.gw
        self.batch_id = batch_id
        self.token = runner.token
        self.lines: list[Line] | None = None
        self.stopping: str | None = None  # "cancelled" or "expired": queued lines are cancelled, none submitted
        self.waiting: set[str] = set()  # request ids submitted and waited for
        self.trace: tuple[str | None, str | None] = (None, None)  # the creating request's span, each line's link

    async def run(self) -> None:
        while True:
            batch = await self.store.batch(self.batch_id)
            if batch is None:
                raise BatchGone(self.batch_id)
            status = batch["status"]
            self.trace = (batch["meta"].get("traceparent"), batch["meta"].get("tracestate"))
            if status in objects.ENDED:
                await self.store.forget(self.batch_id)
                return
            if status == "validating":
                if expired(batch):  # past its window whatever its state: never validated, nothing to write
                    await self.store.transition(self.batch_id, ("validating",), "expired", token=self.token,
                                                end=True, expired_at=now())
                else:
                    await self.validate()
                continue
            lines = await self.load()
            try:
                await self.advance(batch, lines)
            except Unstorable as refused:
                await self.fail_unstorable(len(lines), refused)

    async def advance(self, batch: dict, lines: list[Line]) -> None:
        """Run the lines of an in_progress or cancelling batch, or write the files of a finalizing one."""
        if batch["status"] == "finalizing":
            await self.end(batch, lines, ("finalizing",), "expired" if expired(batch) else "completed")
            return
        reason = "cancelled" if batch["status"] == "cancelling" else "expired" if expired(batch) else None
        reason = await self.process(lines, reason)
        if reason is None:
            await self.store.transition(self.batch_id, ("in_progress",), "finalizing", token=self.token,
                                        finalizing_at=now())
        else:
            await self.end(batch, lines, ("cancelling",) if reason == "cancelled" else ("in_progress",), reason)

    async def stored(self, write, what: str):
        """`write()`'s result. A write that Redis refuses while it answers (a value over its proto-max-bulk-len,
        out of memory) is tried once more, then raises Unstorable: trying again later would not help, and the
        batch fails with the reason instead of being retaken forever. Redis not answering is an outage: the
        error goes up and the batch is taken up again once Redis is back."""
        for attempt in (1, 2):
            try:
                return await write()
            except (redis.RedisError, OSError) as exc:
                if not await self.store.answers():
                    raise
                if attempt == 2:
                    raise Unstorable(what, exc) from exc
                log.warning("batch %s: storing %s failed while Redis answers (%s); trying once more", self.batch_id,
                            what, exc)
        raise AssertionError("unreachable")  # pragma: no cover

    async def fail_unstorable(self, total: int, refused: Unstorable) -> None:
        log.error("batch %s: %s cannot be stored (%s); the batch fails", self.batch_id, refused.what,
                  refused.error)
        reason = batchlines.FileError("output_not_stored", f"the batch's {refused.what} could not be stored in "
                                      f"Redis ({refused.error}); its answers are lost. Split the batch into "
                                      "smaller ones, or ask the operator to lower --file-part-bytes below "
                                      "Redis's proto-max-bulk-len or give Redis more memory")
        await self.store.transition(self.batch_id, ("in_progress", "finalizing", "cancelling"), "failed",
                                    token=self.token, end=True, total=total, failed_at=now(),
                                    errors=json.dumps([reason.as_dict()]))

    async def read_input(self) -> tuple[list[Line], list[batchlines.FileError]]:
        """The input file's lines, read part by part (a missing input is the file's error)."""
        reader = batchlines.Reader(max_body_bytes=self.gw.settings.max_body_bytes,
                                   max_body_keys=self.gw.settings.max_body_keys)
        try:
            async for part in self.store.input_parts(self.batch_id):
                reader.feed(part)
        except FileNotFoundError:
            return [], [batchlines.FileError("file_missing", "the batch's input is gone (expired)")]
        return reader.finish()

    async def load(self) -> list[Line]:
        if self.lines is None:
            self.lines, errors = await self.read_input()
            if errors and errors[0].code == "file_missing":
                raise BatchGone(self.batch_id)
        return self.lines

    async def validate(self) -> None:
        found, errors = await self.read_input()
        if errors:
            await self.store.transition(self.batch_id, ("validating",), "failed", token=self.token, end=True,
                                        failed_at=now(), errors=json.dumps([e.as_dict() for e in errors]))
            return
        models = {line.body.model for line in found if line.body is not None}
        await self.store.transition(self.batch_id, ("validating",), "in_progress", token=self.token,
                                    in_progress_at=now(), total=len(found),
                                    model=models.pop() if len(models) == 1 and None not in models else "")
        self.lines = found

    # -- the lines ----------------------------------------------------------------------------------
    async def process(self, lines: list[Line], stopping: str | None) -> str | None:
        """Run (or, once stopping, settle) every line not collected yet; returns why it stopped early
        ("cancelled" / "expired") or None when every line was answered."""
        self.stopping = stopping
        done = await self.store.collected(self.batch_id)
        pending = deque(line for line in lines if line.index not in done)
        if pending:
            log.info("batch %s: %d of %d lines to run", self.batch_id, len(pending), len(lines))
        tasks: set[asyncio.Task] = set()
        check = time.monotonic() + CHECK_SECONDS
        try:
            while pending or tasks:
                ready: list[Collected] = []
                while pending and len(tasks) + len(ready) < self.runner.in_flight:  # bad lines count too
                    line = pending.popleft()
                    if line.error is not None:
                        ready.append((line.index, False, 0, batchlines.failed(line, self.request_id(line),
                                                                              line.error)))
                    else:
                        tasks.add(asyncio.get_running_loop().create_task(self.run_line(line)))
                failure = None
                if tasks:
                    finished, tasks = await asyncio.wait(tasks, timeout=CHECK_SECONDS,
                                                         return_when=asyncio.FIRST_COMPLETED)
                    for task in finished:  # every answer is kept before a failure ends this pass
                        if task.exception() is None:
                            ready.append(task.result())
                        else:
                            failure = failure or task.exception()
                if ready:
                    collect = functools.partial(self.store.collect, self.batch_id, self.token, ready)
                    await self.stored(collect, "answers")
                if failure is not None:  # e.g. Redis away for longer than a wait rides out: retaken later
                    raise failure
                if self.stopping is None and time.monotonic() >= check:
                    check = time.monotonic() + CHECK_SECONDS
                    await self.check_stop()
        finally:
            for task in tasks:
                task.cancel()
        return self.stopping

    async def check_stop(self) -> None:
        """Stop on a cancel or past the completion window: the lines waiting in a queue are cancelled (those
        running finish and are kept), none is submitted any more."""
        batch = await self.store.batch(self.batch_id)
        if batch is None:
            raise BatchGone(self.batch_id)
        reason = "cancelled" if batch["status"] == "cancelling" else "expired" if expired(batch) else None
        if reason is None:
            return
        log.info("batch %s: %s; cancelling its queued lines", self.batch_id, reason)
        self.stopping = reason
        for request_id in list(self.waiting):
            with contextlib.suppress(EmbedfleetError):
                await self.gw.producer.cancel(request_id)

    def request_id(self, line: Line, model: str | None = None) -> str:
        partitions = self.gw.producer.shards.partitions(model) if model is not None else []
        return batchlines.request_id_of(self.batch_id, line.index, model, partitions)

    async def model_of(self, line: Line) -> str | None:
        """The line's model; on a Redis Cluster a line without one gets the only served model's (its id carries
        that model's tag), else None (the submit then says why)."""
        if line.body.model is None and self.store.clustered:
            with contextlib.suppress(EmbedfleetError):
                return pick_model(None, await self.gw.producer.models(refresh=False)).name
        return line.body.model

    async def run_line(self, line: Line) -> Collected:
        """A line's answer; with tracing on, in a trace of its own linked to the batch's creation (one trace per
        line: a batch's thousands of lines in one trace would be past what trace viewers show)."""
        request_id = self.request_id(line, await self.model_of(line))
        with traced.linked("batch line", self.trace, {"embedfleet.batch.id": self.batch_id,
                                                      "embedfleet.batch.line": line.index,
                                                      "embedfleet.batch.custom_id": line.custom_id[:128],
                                                      "messaging.message.id": request_id}):
            return await self._run_line(line, request_id)

    async def _run_line(self, line: Line, request_id: str) -> Collected:
        if line.body.truncate_prompt_tokens == 0:  # the route's answer: no rows, nothing queued (service.run)
            try:
                result = await self.gw.no_inputs(line.body.model, line.body.param_fields())
            except EmbedfleetError as err:
                return line.index, False, 0, batchlines.failed(line, request_id, err)
            return self.answered(line, request_id, result)
        if self.stopping is None:
            refused = await self.submit(line, request_id)
            if refused is not None:
                return refused
        if self.stopping is not None:  # settle: cancel it if queued; one never submitted never runs
            unrun = (line.index, False, 0, batchlines.unrun(line, request_id, self.stopping))
            try:
                if await self.gw.producer.cancel(request_id):
                    return unrun
            except NotFoundError:  # never submitted
                return unrun
        self.waiting.add(request_id)
        try:
            result = await self.result_of(request_id)
        finally:
            self.waiting.discard(request_id)
        if result.ok:
            return self.answered(line, request_id, result)
        try:
            result.raise_for_error()
        except EmbedfleetError as err:
            if err.code == "cancelled" and self.stopping is not None:
                return line.index, False, 0, batchlines.unrun(line, request_id, self.stopping)
            return line.index, False, 0, batchlines.failed(line, request_id, err)
        raise AssertionError("a result that is neither ok nor an error")  # pragma: no cover

    @staticmethod
    def answered(line: Line, request_id: str, result) -> Collected:
        body = encoding.embeddings_response(result, line.body.encoding_format, line.body.explicit_layout).body
        return line.index, True, result.usage.prompt_tokens, batchlines.answered(line, request_id, 200, body)

    async def submit(self, line: Line, request_id: str) -> Collected | None:
        """Submit the line as `request_id` at bulk priority; None once it is in the fleet (now or before),
        else its error line (the route's refusal). Refusals for now (queue full, no worker) are retried."""
        while self.stopping is None:
            try:
                await self.gw.submit(line.body, request_id=request_id, priority="bulk")
                return None
            except DuplicateRequestError:
                return None  # submitted before (by a replica that died, or by this one): wait for it
            except TRANSIENT:
                await asyncio.sleep(RETRY_SECONDS)
            except EmbedfleetError as err:
                return line.index, False, 0, batchlines.failed(line, request_id, err)
        return None

    async def result_of(self, request_id: str):
        async for result in self.gw.producer.as_completed([request_id]):
            return result

    # -- the end ------------------------------------------------------------------------------------
    async def end(self, batch: dict, lines: list[Line], before: tuple[str, ...], after: str) -> None:
        """Write the output and error files (ids derived from the batch: a retry writes the same files) and
        set the final status; the batch's work keys go. Files that Redis refuses while it answers (a part
        over its proto-max-bulk-len, out of memory) cannot be stored by trying again: the batch fails with
        the reason (Drive.stored), rather than staying `finalizing` until it expires."""
        write = functools.partial(write_outputs, self.store, self.batch_id, batch["meta"], len(lines),
                                  self.gw.settings.file_part_bytes, self.runner.output_ttl)
        files = await self.stored(write, "output files")
        await self.store.transition(self.batch_id, before, after, token=self.token, end=True,
                                    total=len(lines), **{f"{after}_at": now()}, **files)
        log.info("batch %s: %s (%d lines)", self.batch_id, after, len(lines))


def expired(batch: dict) -> bool:
    return now() >= batch["meta"]["expires_at"]
