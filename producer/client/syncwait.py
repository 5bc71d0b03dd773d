"""Producer's waits (producer/client/blocking.py): a request is waited for on its own wake-up path, its notify
list (a BLMOVE of the list onto itself, sent with the GET of the result: the wake-up stays for every other
waiter) or the reply stream it was submitted with (XREAD from the entry that was its last when the wait
looked), never by polling; a wake-up counts only once its result is there."""

from __future__ import annotations

import time

import redis

from embedfleet.common.errors import NotFoundError, ResultTimeoutError
from embedfleet.common.protocol import keys, rqkeys, slotmoves
from embedfleet.common.redisclient import block_for
from embedfleet.common.result import Result
from embedfleet.producer.client import traced
from embedfleet.producer.client.core import PENDING, lost_error, not_submitted, read_result
from embedfleet.producer.client.remembered import Sent, SentTo
from embedfleet.producer.client.redisfaults import redis_errors as _redis_errors
from embedfleet.producer.client.placement import naming
from embedfleet.producer.client.reads import ok, wrong_type

FIRST_BLOCK = 1.0  # seconds the first wait on an id this producer submitted blocks before it looks again


class SyncWaits:
    """What Producer waits with (and its `_exists` hook); the producer supplies `_sent`, `shards`, `links`,
    `url_of`, `connection_of`, `get` and `status`."""

    _sent: Sent

    @traced.waits
    def wait(self, request_id: str, timeout: float = 60.0) -> Result:
        # (its docstring: surface.py's) on the notify list, a BLMOVE of the list onto itself sent with the GET of
        # the result (one round trip per wake-up), or the reply stream it was submitted with (XREAD)
        deadline = time.monotonic() + timeout
        url = self.url_of(request_id)
        connection = self.links[url]
        sent = self._sent.get(request_id)
        with naming(self.shards, url):  # on a partition of a model: which one
            if sent is not None and sent.stream is None:  # ours, on its notify list: no look of its own
                result = self._follow_list(connection, request_id, deadline, timeout, first=True)
            else:
                result, stream = self._first_look(connection, request_id, sent)
                if result is None:
                    result = self._follow_stream(connection, request_id, stream, deadline, timeout) if stream \
                        else self._follow_list(connection, request_id, deadline, timeout)
        result.raise_for_error()
        return result

    def _first_look(self, connection: redis.Redis, request_id: str, sent: SentTo | None
                    ) -> tuple[Result | None, str | None]:
        """(its result if it is in, the stream it wakes on or None for its notify list); NotFoundError for
        an id with neither a job nor a result. One round trip: an id this producer submitted is only looked
        for, another's job also says how it wakes (its `reply_to`)."""
        if sent is not None:
            if not self._exists(request_id):
                raise not_submitted(request_id)
            return None, sent.stream
        with _redis_errors():
            raw, field, job = connection.pipeline(transaction=False).get(keys.result_key(request_id)) \
                .hget(rqkeys.rq_job_key(request_id), "reply_to").exists(rqkeys.rq_job_key(request_id)) \
                .execute(raise_on_error=False)
            if wrong_type(field):  # its job key holds no hash (Redis is input): no job of ours there
                field, job = None, False
            raw, field, job = ok(raw), ok(field), ok(job)
        result = read_result(request_id, raw)
        if result is None and not job:
            raise not_submitted(request_id)
        return result, (field.decode() if result is None and keys.is_reply_stream_key(field) else None)

    def _follow_list(self, connection: redis.Redis, request_id: str, deadline: float, timeout: float,
                     first: bool = False) -> Result:
        """Wait on the notify list: BLMOVE of the list onto itself (the wake-up stays for any other waiter)
        and the GET of the result, sent together. `first`: the look that the id is known (a job or a result)
        goes with the first of them, which waits at most FIRST_BLOCK seconds (an id that is not there is
        not found within that time): a request's whole wait is often that one round trip."""
        notify = keys.notify_key(request_id)
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise self._timed_out(request_id, timeout)
            def look(first: bool = first, left: float = left) -> list:
                pipe = connection.pipeline(transaction=False)
                if first:  # (two keys: refused while their slot is being moved, then sent again)
                    pipe.exists(keys.result_key(request_id), rqkeys.rq_job_key(request_id))
                return ([True] if not first else []) + pipe.blmove(
                    notify, notify, min(block_for(left), FIRST_BLOCK) if first else block_for(left), "LEFT",
                    "LEFT").get(keys.result_key(request_id)).execute()

            with _redis_errors():
                known, woke, raw = slotmoves.while_moving(look, connection) if first else look()
            result = read_result(request_id, raw)
            if result is not None:
                return result
            if not known:
                raise not_submitted(request_id)
            first = False
            if woke is not None:  # a wake-up without its result: expired, forged, or lost with its job
                self._check_pending(request_id)
                with _redis_errors():  # else every BLMOVE would find it again (a result lands with a new one)
                    connection.delete(notify)
            elif not self._exists(request_id):  # it was there when the wait began: Redis lost it
                raise lost_error(request_id)

    def _follow_stream(self, connection: redis.Redis, request_id: str, stream: str, deadline: float,
                       timeout: float) -> Result:
        """Wait on the reply stream the request was submitted with: XREAD from its last entry, read before
        the result is looked at again (an answer after that look is an entry after that one)."""
        with _redis_errors():
            newest, raw = connection.pipeline(transaction=False).xrevrange(stream, count=1) \
                .get(keys.result_key(request_id)).execute()
        result = read_result(request_id, raw)
        last = newest[0][0] if newest else b"0-0"
        wanted = request_id.encode()
        while result is None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise self._timed_out(request_id, timeout)
            with _redis_errors():
                replies = connection.xread({stream: last}, block=int(block_for(left) * 1000))
            woke = False
            for _, entries in replies or ():
                for entry_id, fields in entries:
                    last, woke = entry_id, woke or fields.get(b"id") == wanted
            if woke:
                result = self.get(request_id)
                if result is None:  # an entry without its result: expired, forged, or lost with its job
                    self._check_pending(request_id)
            elif not replies and not self._exists(request_id):
                raise lost_error(request_id)
        return result

    def _check_pending(self, request_id: str) -> None:
        """After a wake-up without its result: raise unless the request is still to be answered."""
        status = self.status(request_id)
        if status == "not_found":
            raise lost_error(request_id)
        if status not in PENDING:
            raise NotFoundError(f"the result of request {request_id} has expired")

    def _timed_out(self, request_id: str, timeout: float) -> ResultTimeoutError:
        return ResultTimeoutError(f"no result for request {request_id} after {timeout:g} s "
                                  f"(status: {self.status(request_id)})")

    def _exists(self, request_id: str) -> bool:
        """Whether the request has a job or a result (one round trip)."""
        connection = self.connection_of(request_id)  # (two keys: refused while their slot is being moved)
        with _redis_errors():
            return bool(slotmoves.while_moving(
                lambda: connection.exists(keys.result_key(request_id), rqkeys.rq_job_key(request_id)), connection))

