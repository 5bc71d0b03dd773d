"""Driving one batch through its lifecycle (validating -> in_progress -> finalizing -> completed; failed;
cancelling -> cancelled; expired), from whatever state it finds the batch in: validating its input, running its
lines (dispatch.py) and writing its output and error files, or failing it when Redis refuses what it must store.
"""

from __future__ import annotations

import functools
import json
import logging
from typing import Any, Protocol

import redis

from embedfleet.producer.gateway.batches import lines as batchlines, objects
from embedfleet.producer.gateway.batches.dispatch import Dispatch, expired
from embedfleet.producer.gateway.batches.lines import Line
from embedfleet.producer.gateway.batches.output import write_outputs
from embedfleet.producer.gateway.batches.store import BatchGone, Store, now


class Runner(Protocol):
    """What a Drive reads of the replica's runner.Runner (named here, not imported: the runner imports Drive)."""

    gw: Any
    store: Store
    token: str
    in_flight: int
    output_ttl: int

log = logging.getLogger(__name__)


class Unstorable(Exception):
    """Redis refuses what a batch must store while it answers (Drive.stored): the batch fails."""

    def __init__(self, what: str, error: Exception):
        super().__init__(what, error)
        self.what = what
        self.error = error


class Drive(Dispatch):
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
