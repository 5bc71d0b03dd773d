"""What a WaitHub (producer/client/waiters.py) does with ids its read found without a result: looks their job up
(an id with neither a job nor a result fails at once; another's job says how it wakes), follows another's id on
its own path (its reply stream, or its notify list), and checks a wake-up that came without its result (forged,
or expired)."""

from __future__ import annotations

import asyncio
import logging

import redis
from rq.job import Job

from embedfleet.common.errors import EmbedfleetError, NotFoundError, UnavailableError
from embedfleet.common.protocol import keys, rqkeys
from embedfleet.producer.client.core import PENDING, lost_error, not_submitted
from embedfleet.producer.client.reads import wrong_type
from embedfleet.producer.client.readsize import READ_CHUNK

log = logging.getLogger(__name__)

OUTAGE_RECHECK = 0.5  # seconds between looks while Redis is unreachable


class Lookups:
    """WaitHub's lookups; the hub supplies its `connection`, `status`, `notify`, `replies`, its id tables (`_own`,
    `_paths`, `_waiters`, `_checks`) and `look_at`, `is_own`, `_fail` and `_look_again` (read again soon)."""

    async def _look_up(self, request_ids: list[str]) -> None:
        """Fail the ids whose job and result are both gone; learn how another's id wakes (its job's
        `reply_to`). Own ids are asked about together: one EXISTS over their jobs, each id only if some is gone
        (answered meanwhile, its job removed, or vanished)."""
        own = [i for i in request_ids if i in self._own]
        foreign = [i for i in request_ids if i not in self._own]
        pipe = self.connection.pipeline(transaction=False)
        chunks = [own[start:start + READ_CHUNK] for start in range(0, len(own), READ_CHUNK)]
        for chunk in chunks:
            pipe.exists(*(Job.key_for(i) for i in chunk))
        for request_id in foreign:
            pipe.hget(Job.key_for(request_id), "reply_to")
            pipe.exists(keys.result_key(request_id), Job.key_for(request_id))
        replies = await pipe.execute(raise_on_error=False)
        for reply in replies[:len(chunks)]:
            if isinstance(reply, Exception):  # (an EXISTS is refused only as a whole: the read's own error)
                raise reply
        suspects = [i for chunk, found in zip(chunks, replies) if found < len(chunk) for i in chunk]
        rest = replies[len(chunks):]
        for request_id, field, found in zip(foreign, rest[::2], rest[1::2]):
            if wrong_type(field):  # its job key holds no hash: Redis is input, no job of ours there
                self._fail(request_id, _not_a_job(request_id, field))
                continue
            for reply in (field, found):
                if isinstance(reply, Exception):
                    raise reply
            self._paths[request_id] = field.decode() if keys.is_reply_stream_key(field) else None
            if not found:
                self._fail(request_id, not_submitted(request_id))
        if suspects:
            await self._fail_vanished(suspects)

    async def _follow(self, request_ids: list[str]) -> None:
        """Another's ids still waited for, without a result: each on its own path (its stream or notify list)."""
        streams: dict[str, list[str]] = {}
        for request_id in request_ids:
            stream = self._paths.get(request_id)
            if stream is None:
                if self.notify is not None:
                    self.notify.add(request_id)
            elif self.replies is not None and not self.replies.watches(request_id):
                streams.setdefault(stream, []).append(request_id)
        if not streams:
            return
        # the stream's last entry first, then one more look at the results: an answer after that look is an
        # entry after that one, which the listener reads
        pipe = self.connection.pipeline(transaction=False)
        for stream in streams:
            pipe.xrevrange(stream, count=1)
        for (stream, ids), newest in zip(streams.items(), await pipe.execute(raise_on_error=False)):
            if isinstance(newest, redis.ResponseError):  # not a stream (Redis is input): looked at, not read
                for request_id in ids:
                    self._poll(request_id)
                continue
            self.replies.watch(stream, ids, newest[0][0] if newest else b"0-0")
        self._look_again([i for ids in streams.values() for i in ids])

    def _poll(self, request_id: str) -> None:
        async def poll() -> None:
            while request_id in self._waiters:
                self.look_at([request_id])
                await asyncio.sleep(OUTAGE_RECHECK)

        task = asyncio.get_running_loop().create_task(poll())
        self._checks.add(task)
        task.add_done_callback(self._checks.discard)

    async def _fail_vanished(self, request_ids: list[str]) -> None:
        """An id with neither a result nor a job: say so at once, as Producer.wait does (raise_if_unknown):
        lost by a Redis restart (retryable), or never submitted, expired, or its job deleted."""
        pipe = self.connection.pipeline(transaction=False)
        for request_id in request_ids:
            pipe.exists(keys.result_key(request_id), Job.key_for(request_id))
        for request_id, found in zip(request_ids, await pipe.execute()):
            if not found:
                self._fail(request_id, self._lost(request_id) or not_submitted(request_id))

    async def _check_pending(self, request_id: str) -> None:
        try:
            status = await self.status(request_id)
        except EmbedfleetError as err:  # Redis went away meanwhile: look again later
            log.warning("request %s: cannot read its status (%s); looking again", request_id, err.message)
            await asyncio.sleep(OUTAGE_RECHECK)
            self._look_again([request_id])
            return
        if status not in PENDING:
            self._fail(request_id, self._lost(request_id)
                       or NotFoundError(f"the result of request {request_id} has expired"))
        elif self.notify is not None and not self.is_own(request_id) and self._paths.get(request_id) is None:
            await self.notify.forged(request_id)  # drop the forged element, then look once more
            self._look_again([request_id])

    def _lost(self, request_id: str) -> UnavailableError | None:
        """For an id with neither a job nor a result: one of ours (submitted less than JOB_TTL ago, its result
        never seen) cannot have expired, and a cancel stores a result, so Redis lost it: restarted without its
        data, flushed, or the job evicted or deleted. That is retryable (503): sending the same request again
        is the whole remedy. None for an id that is not ours."""
        return None if self._own.pop(request_id, None) is None else lost_error(request_id)


def _not_a_job(request_id: str, refusal: Exception) -> NotFoundError:
    """An id whose rq job key holds something else than a job hash: no request of ours has that id."""
    return NotFoundError(f"no request with id {request_id}: its job key {rqkeys.rq_job_key(request_id)} holds no job "
                         f"({refusal})", param="id")
