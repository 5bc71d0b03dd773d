"""Producer: the blocking client of the fleet. Its methods and their docstrings are producer/client/surface.py's,
shared with AsyncProducer; this module holds what it alone does: submits (one enqueue script run per partition),
one round trip for a request submitted and waited for, and the hooks that run the shared steps blocking. Its
waits are producer/client/syncwait.py's."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Mapping

import redis

from embedfleet.common import tracing
from embedfleet.common.errors import UnavailableError
from embedfleet.common.fleetstate import resolve_redis_url
from embedfleet.common.names import tag_of
from embedfleet.common.params import PoolingParams
from embedfleet.common.protocol import answering, enqueueing, keys, rqkeys, scripts, slotmoves
from embedfleet.common.redisclient import block_for, check_access, cluster_tag, connect
from embedfleet.common.request import EmbedRequest
from embedfleet.common.result import Result
from embedfleet.common.shards import ShardMap, resolve_shards
from embedfleet.producer.client import reads, traced
from embedfleet.producer.client.placement import Placer, naming, place, unavailable
from embedfleet.producer.client.core import (Served, build_request, by_url, chosen_ids, enqueue_args, looked_at,
                                             queue_full, read_result, resolve_target, tagged_ids)
from embedfleet.producer.client.redisfaults import redis_errors as _redis_errors
from embedfleet.producer.client.remembered import Placements, Sent
from embedfleet.producer.client.exchanges import run
from embedfleet.producer.client.surface import Surface
from embedfleet.producer.client.syncwait import FIRST_BLOCK, SyncWaits


class Producer(SyncWaits, Surface):
    """A client of the fleet: `submit` enqueues, `get`/`wait` read results, `embed` does both; every method blocks
    (AsyncProducer: the same methods as coroutines).

    Args:
        redis_url: the Redis the workers listen on; default: EMBEDFLEET_REDIS_URL, else the running
            `embedfleet up`'s, else redis://127.0.0.1:6379/0 (see common.fleetstate). Any URL form of
            common.redisclient: a password and ACL user, rediss:// with TLS files, redis+sentinel://.
        shards: {model: Redis URL, or a list of them} for models on Redis shards of their own, or partitioned
            over several (common.shards); the others live on `redis_url`. Default: EMBEDFLEET_REDIS_SHARDS (as every
            command reads it), else none.
        max_queue_depth: refuse submits (QueueFullError) while a model's queue holds this many jobs.
        connection: a ready redis.Redis for `redis_url` (Producer only; the tests hand it a worker's).
    """

    def __init__(self, redis_url: str | None = None, *, shards: Mapping[str, str] | None = None,
                 max_queue_depth: int | None = None, connection: redis.Redis | None = None):
        self.redis_url = resolve_redis_url(redis_url)
        self.redis = connection or connect(self.redis_url)
        self.shards = ShardMap(self.redis_url, resolve_shards(shards))
        self.links = {url: self.redis if url == self.redis_url else connect(url) for url in self.shards.urls()}
        self.max_queue_depth = max_queue_depth
        self.where = looked_at(self.shards.urls())
        self._served = Served()
        self._placed = Placements()
        self._placer = Placer(self.shards)
        self._sent = Sent()  # ids this producer submitted, with the stream each wakes on (None: its notify list)
        self._announced: set[tuple[str, str]] = set()  # (Redis URL, queue) this producer listed in rq:queues

    def close(self) -> None:
        for connection in self.links.values():
            connection.close()

    def check(self) -> list[UnavailableError]:
        down = []
        for url, connection in self.links.items():
            try:
                check_access(connection, url)
            except (redis.ConnectionError, redis.TimeoutError) as exc:
                if not self.shards.spare(url):
                    raise
                down.append(unavailable(self.shards, url, exc))
        return down

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- the hooks of the shared methods (surface.py), blocking ----------------------------------------
    def _read(self, read: reads.Read):
        return run(self.links, read, self.shards)

    @staticmethod
    def _then(step, fn):
        return fn(step)

    def _read_adverts(self) -> None:
        self._served.update(self._read(reads.models(self.shards)))

    def _result_at(self, url: str, request_id: str) -> Result | None:
        with naming(self.shards, url), _redis_errors():
            raw = self.links[url].get(keys.result_key(request_id))
        return read_result(request_id, raw)

    def _results_at(self, urls: list[str], request_ids: list[str]) -> list[Result | None]:
        found: list[Result | None] = [None] * len(request_ids)
        for url, positions in by_url(urls).items():
            link, wanted = self.links[url], [keys.result_key(request_ids[i]) for i in positions]
            with naming(self.shards, url), _redis_errors():  # (several keys: refused while their slot moves)
                raw = slotmoves.while_moving(functools.partial(link.mget, wanted), link) if slotmoves.is_cluster(link) \
                    else link.mget(wanted)
            for i, blob in zip(positions, raw):
                found[i] = read_result(request_ids[i], blob)
        return found

    def _cancel_at(self, target: reads.Cancel, request_id: str) -> bool:
        with _redis_errors():
            return answering.cancel(self.links[target.url], target.queue, target.answer, target.reply_to)

    # -- submit (and one request submitted and waited for in one round trip) ---------------------------
    @traced.submits
    def submit_many(self, batches: list, model: str | None = None, *, params: PoolingParams | None = None,
                    reply_to: str | None = None, text_pair: list[str] | None = None,
                    priority: str | int | None = None, deadline: float | None = None, timeout: float | None = None,
                    request_ids: list[str] | None = None, **fields) -> list[str]:
        name, chosen, build = self._prepare(batches, model, params, reply_to, text_pair, priority, deadline,
                                            timeout, request_ids, fields)
        ids: list[str] = [""] * len(batches)
        for order, indices in self._placer.plan(name, chosen):
            url, reply = place(self._placer, order, lambda url, indices=indices: scripts.ENQUEUE(
                self.links[url], *self._enqueue_args(url, build(url, indices)[0])))
            work, requests = build(url, indices)
            for index, request_id in zip(indices, self._enqueued(name, url, work, requests, reply_to, reply[0])):
                ids[index] = request_id
        return ids

    def _prepare(self, batches, model, params, reply_to, text_pair, priority, deadline, timeout, request_ids,
                 fields) -> tuple[str, list[str | None], Callable[[str, list[int]], tuple[enqueueing.Enqueue,
                                                                                         list[EmbedRequest]]]]:
        """(model name, the caller's ids, (URL, indices of `batches`) -> the enqueue and the requests there) of a
        submit, checked; no I/O but the adverts. The requests are built per URL they are placed on (once each): on a
        Redis Cluster their ids and queue carry the URL's hash tag (the model's, or its partition's:
        redisurls.cluster_tag)."""
        chosen = chosen_ids(request_ids, len(batches))
        served = self.models(refresh=False)
        if model not in served:  # a worker may have come up since the cached read
            served = self.models()
        caps, level, when = resolve_target(model, served, self._served.known, priority, deadline, timeout,
                                           self.where)
        name = caps if isinstance(caps, str) else caps.name
        built: dict[tuple[str, tuple[int, ...]], tuple[enqueueing.Enqueue, list[EmbedRequest]]] = {}

        def build(url: str, indices: list[int]) -> tuple[enqueueing.Enqueue, list[EmbedRequest]]:
            if (url, tuple(indices)) not in built:
                tag = cluster_tag(url, name)
                ids = tagged_ids([chosen[i] for i in indices], tag)
                requests = [build_request(batches[i], caps, params, fields, reply_to, text_pair, when, request_id)
                            for i, request_id in zip(indices, ids)]
                built[url, tuple(indices)] = (enqueue_args(keys.queue_name(name, level, tag), requests,
                                                           max_depth=self.max_queue_depth, fresh=request_ids is None),
                                              requests)
            return built[url, tuple(indices)]

        return name, chosen, build

    def _enqueue_args(self, url: str, work: enqueueing.Enqueue) -> tuple[list, list]:
        """The enqueue script's KEYS and ARGV (rq:queues is told of the queue on its first use)."""
        return enqueueing.round_args([work], announce=(url, work.queue) not in self._announced)

    def _enqueued(self, name: str, url: str, work: enqueueing.Enqueue, requests: list[EmbedRequest],
                  reply_to: str | None, reply: list) -> list[str]:
        """The ids, once the script's reply says they are enqueued; else QueueFullError or DuplicateRequestError."""
        try:
            enqueueing.check_enqueued(reply)
        except enqueueing.QueueFull as full:
            raise queue_full(name, full.depth, self.max_queue_depth) from None
        if (url, work.queue) not in self._announced and tag_of(work.queue):  # the script could not
            with _redis_errors():
                self.links[url].sadd(rqkeys.RQ_QUEUES, rqkeys.rq_queue_key(work.queue))  # (another slot)
        self._announced.add((url, work.queue))
        ids = [r.id for r in requests]
        self._sent.remember(ids, reply_to)
        if self.shards:
            self._placed.remember(ids, url)
        return ids

    def _ask(self, timeout: float, inputs, model: str | None = None, **submit) -> Result:
        """submit + wait. A new request on its notify list, which no queue-depth limit can refuse, goes in one
        round trip: its enqueue, the first wait for its wake-up (FIRST_BLOCK at most) and the read of its
        result, sent together; a slower answer is waited for as `wait` does."""
        if self.max_queue_depth is not None or submit.get("reply_to") or submit.get("request_id") or \
                tracing.client_on():  # the caller's traces have their submit and wait spans (producer/client/traced.py)
            return self.wait(self.submit(inputs, model, **submit), timeout)
        deadline = time.monotonic() + timeout
        params, text_pair = submit.pop("params", None), submit.pop("text_pair", None)
        priority, request_deadline = submit.pop("priority", None), submit.pop("deadline", None)
        name, _, build = self._prepare([inputs], model, params, None, text_pair, priority, request_deadline, None,
                                       None, submit)
        url, (reply, raw) = place(self._placer, self._placer.order(name),
                                  lambda url: self._ask_exchange(url, *build(url, [0]), timeout))
        work, requests = build(url, [0])
        connection, request_id = self.links[url], requests[0].id
        self._enqueued(name, url, work, requests, None, reply[0])
        result = read_result(request_id, raw)
        if result is None:
            result = self._follow_list(connection, request_id, deadline, timeout)
        result.raise_for_error()
        return result

    def _ask_exchange(self, url: str, work: enqueueing.Enqueue, requests: list[EmbedRequest], timeout: float) -> tuple:
        """(the enqueue's reply, the result if it landed within FIRST_BLOCK) of `_ask`'s one round trip."""
        request_id = requests[0].id
        connection, notify = self.links[url], keys.notify_key(request_id)

        def exchange() -> list:  # sent again while its enqueue meets a slot being moved (it wrote nothing)
            pipe = connection.pipeline(transaction=False)
            scripts.ENQUEUE.queue(pipe, *self._enqueue_args(url, work))
            replies = pipe.blmove(notify, notify, min(block_for(timeout), FIRST_BLOCK), "LEFT", "LEFT") \
                .get(keys.result_key(request_id)).execute(raise_on_error=False)
            if isinstance(replies[0], Exception) and slotmoves.slot_moving(replies[0]):
                raise replies[0]
            return replies

        reply, _, raw = slotmoves.while_moving(exchange, connection) if slotmoves.is_cluster(connection) \
            else exchange()
        if isinstance(reply, redis.exceptions.NoScriptError):  # a new or restarted server: by source
            reply, raw = scripts.ENQUEUE(connection, *self._enqueue_args(url, work)), None
        for answer in (reply, raw):
            if isinstance(answer, Exception):
                raise answer
        return reply, raw
