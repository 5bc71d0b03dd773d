"""Running a batch's lines: each line runs as request `<batch_id>-<index>` at `bulk` priority through the same
queues as every request, at most --batch-in-flight lines of a batch at a time.

Because the id is fixed before the submit and the enqueue script refuses an id already in use, a replica that
takes a batch over (its driver died: the lease lapsed) simply submits every line not yet collected again: a line
already queued, running or answered is refused as a duplicate and waited for, one never submitted is submitted
now. Nothing runs twice, nothing is lost. Answers are collected into Redis as they land (store.collect, once per
line), so a takeover redoes nothing but the waiting.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections import deque

from embedfleet.common.errors import (DuplicateRequestError, EmbedfleetError, NoWorkerError, NotFoundError,
                                      QueueFullError, UnavailableError)
from embedfleet.producer.client import traced
from embedfleet.producer.client.core import pick_model
from embedfleet.producer.gateway.core import encoding
from embedfleet.producer.gateway.batches import lines as batchlines
from embedfleet.producer.gateway.batches.lines import Line
from embedfleet.producer.gateway.batches.store import BatchGone, now

log = logging.getLogger(__name__)

CHECK_SECONDS = 0.5  # how often a driver re-reads its batch's status (a cancel) and the clock (expiry)
RETRY_SECONDS = 1.0  # pause before a line refused for now (queue full, no worker, Redis away) is tried again
TRANSIENT = (QueueFullError, NoWorkerError, UnavailableError)
Collected = tuple[int, bool, int, bytes]  # index, answered with a 2xx, prompt tokens, the output line


class Dispatch:
    """The part of a Drive (drive.py) that runs its lines: submits each, waits for its answer, collects the answers
    into Redis (Drive.stored) and, on a cancel or past the window, settles the lines not run."""

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


def expired(batch: dict) -> bool:
    return now() >= batch["meta"]["expires_at"]
