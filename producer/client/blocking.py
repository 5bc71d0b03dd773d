"""Producer: submit embedding requests to the fleet and collect their results (blocking API)."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Mapping

import numpy as np
import redis

from embedfleet.common import tracing
from embedfleet.common.capabilities import ModelCapabilities
from embedfleet.common.errors import UnavailableError
from embedfleet.common.fleetstate import resolve_redis_url
from embedfleet.common.params import PoolingParams
from embedfleet.common.protocol import keys, operations, scripts, slotmoves
from embedfleet.common.redisclient import block_for, check_access, cluster_tag, connect
from embedfleet.common.request import EmbedRequest
from embedfleet.common.result import Result, SparseVector
from embedfleet.common.shards import ShardMap, resolve_shards
from embedfleet.producer.client import fleetview, reads, traced
from embedfleet.producer.client.placement import Placer, naming, place, unavailable
from embedfleet.producer.client.core import (Placements, Sent, Served, build_request, chosen_ids, enqueue_args,
                                             looked_at, pick_model, queue_full, read_result,
                                             redis_errors as _redis_errors, resolve_target, tagged_ids)
from embedfleet.producer.client.fleet import LevelStats, level_stats
from embedfleet.producer.client.exchanges import run
from embedfleet.producer.client.syncwait import FIRST_BLOCK, SyncWaits
from embedfleet.producer.client.tasks import check_rerank, rank, score_pairs


class Producer(SyncWaits):
    """A client of the fleet: `submit` enqueues, `get`/`wait` read results, `embed` does both. What it reads
    and what that means is producer/client/reads.py, shared with AsyncProducer; this class moves the bytes.

    Args:
        redis_url: the Redis the workers listen on; default: EMBEDFLEET_REDIS_URL, else the running
            `embedfleet up`'s, else redis://127.0.0.1:6379/0 (see common.fleetstate). Any URL form of
            common.redisclient: a password and ACL user, rediss:// with TLS files, redis+sentinel://.
        shards: {model: Redis URL, or a list of them} for models on Redis shards of their own, or partitioned
            over several (common.shards); the others live on `redis_url`. Default: EMBEDFLEET_REDIS_SHARDS (as every
            command reads it), else none.
        max_queue_depth: refuse submits (QueueFullError) while a model's queue holds this many jobs.
    """

    def __init__(self, redis_url: str | None = None, *, shards: Mapping[str, str] | None = None,
                 max_queue_depth: int | None = None, connection: redis.Redis | None = None):
        self.redis_url = resolve_redis_url(redis_url)
        self.redis = connection or connect(self.redis_url)
        self.shards = ShardMap(self.redis_url, resolve_shards(shards))
        self.links = {url: self.redis if url == self.redis_url else connect(url) for url in self.shards.urls()}
        self.max_queue_depth = max_queue_depth
        self.where = looked_at(self.shards.urls())  # named by a NoWorkerError: which Redis had no worker
        self._served = Served()
        self._placed = Placements()
        self._placer = Placer(self.shards)
        self._sent = Sent()  # ids this producer submitted, with the stream each wakes on (None: its notify list)
        self._announced: set[tuple[str, str]] = set()  # (Redis URL, queue) this producer listed in rq:queues

    def close(self) -> None:
        for connection in self.links.values():
            connection.close()

    def check(self) -> list[UnavailableError]:
        """Fail now, in one line, on a wrong password, a missing ACL permission or a certificate that does
        not verify, on any shard (common.redisclient.AccessError); an unreachable Redis raises as usual, but for
        a partition whose models have others (ShardMap.spare): returned, named (placement.unavailable), as the
        fleet goes on without it (submits go to the others, reads sum them)."""
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

    def _read(self, read: reads.Read):
        return run(self.links, read, self.shards)

    # -- models --------------------------------------------------------------------------------
    def models(self, refresh: bool = True) -> dict[str, ModelCapabilities]:
        """Models served by at least one live worker, with their capabilities."""
        if self._served.stale(refresh):
            self._served.update(self._read(reads.models(self.shards)))
        return self._served.models

    def known_models(self) -> set[str]:
        """Every model ever advertised, served now or not (as of the last `models()` read): a model scaled
        to zero keeps its queues."""
        return set(self._served.known)

    def live_workers(self, model: str) -> int:
        return self._read(reads.live_workers(self.shards, model, time.time()))

    def workers(self, model: str) -> list[dict]:
        """The live workers of `model` with what each advertised (device, dtype, batch budget)."""
        return self._read(reads.workers(self.shards, model, time.time()))

    def fleet(self) -> dict:
        """Models, their queues per priority, live workers and recent failures (producer.client.fleetview)."""
        return self._read(fleetview.snapshot(self.shards))

    def queue_depth(self, model: str) -> int:
        return self._read(reads.queue_depth(self.shards, model))

    def level_stats(self, model: str) -> list[LevelStats]:
        """Per priority level of `model`: depth, estimated queued tokens, oldest job's age (producer.client.fleet)."""
        return self._read(level_stats(self.shards, model))

    # -- shards ----------------------------------------------------------------------------------
    def connection_for_model(self, model: str | None) -> redis.Redis:
        return self.links[self.shards.url_for(model)]

    def url_for_submit(self, model: str | None) -> str:
        """The shard a submit for `model` goes to (None: the only served model's); of a partitioned model, its first
        partition (each submit is placed on one of them: producer/client/placement.py)."""
        if not self.shards or model is not None:
            return self.shards.url_for(model)
        return self.shards.url_for(pick_model(None, self.models(refresh=False), self._served.known, self.where).name)

    def url_of(self, request_id: str) -> str:
        """The shard that holds `request_id`: where it was sent, else whichever has its result or job."""
        return self._read(reads.locate(self.shards, self._placed, request_id))

    def connection_of(self, request_id: str) -> redis.Redis:
        return self.links[self.url_of(request_id)]

    # -- submit ----------------------------------------------------------------------------------
    def submit(self, inputs, model: str | None = None, *, params: PoolingParams | None = None,
               reply_to: str | None = None, text_pair: list[str] | None = None, request_id: str | None = None,
               **fields) -> str:
        """Enqueue one request and return its id (`request_id`: the caller's own, see submit_many).

        `inputs`: a text, a list of texts, a token-id list or a list of token-id lists. `fields` are
        PoolingParams fields (dimensions, use_activation, truncate_prompt_tokens, embed_dtype, ...), and
        `cache=False` to compute afresh (neither read from nor written to the fleet's vector cache, nor
        attached to an identical request in flight).
        Unknown models, parameters the model cannot honour and full queues fail here, before enqueue.
        `task` (a field) picks the request kind; task "score" pairs each input with `text_pair`'s text.
        """
        return self.submit_many([inputs], model, params=params, reply_to=reply_to, text_pair=text_pair,
                                request_ids=None if request_id is None else [request_id], **fields)[0]

    @traced.submits
    def submit_many(self, batches: list, model: str | None = None, *, params: PoolingParams | None = None,
                    reply_to: str | None = None, text_pair: list[str] | None = None,
                    priority: str | int | None = None, deadline: float | None = None, timeout: float | None = None,
                    request_ids: list[str] | None = None, **fields) -> list[str]:
        """Enqueue one request per element of `batches`, in one round trip per partition they go to (one, unless
        the model is partitioned: placement.py); returns their ids.

        `request_ids`: the caller's own ids, one per request (core.chosen_ids): a submit repeated with the
        same ids is refused with DuplicateRequestError and enqueues nothing, so it is safe to retry.

        `priority`: "interactive" (default), "bulk", or vLLM's integer (<= 0 interactive, >= 1 bulk).
        `deadline` (unix time) / `timeout` (seconds from now): a request still queued then is answered
        `expired` (ExpiredError) and never computed. See common/scheduling.py.
        """
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
                 fields) -> tuple[str, list[str | None], Callable[[str, list[int]], tuple[operations.Enqueue,
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
        built: dict[tuple[str, tuple[int, ...]], tuple[operations.Enqueue, list[EmbedRequest]]] = {}

        def build(url: str, indices: list[int]) -> tuple[operations.Enqueue, list[EmbedRequest]]:
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

    def _enqueue_args(self, url: str, work: operations.Enqueue) -> tuple[list, list]:
        """The enqueue script's KEYS and ARGV (rq:queues is told of the queue on its first use)."""
        return operations.round_args([work], announce=(url, work.queue) not in self._announced)

    def _enqueued(self, name: str, url: str, work: operations.Enqueue, requests: list[EmbedRequest],
                  reply_to: str | None, reply: list) -> list[str]:
        """The ids, once the script's reply says they are enqueued; else QueueFullError or DuplicateRequestError."""
        try:
            operations.check_enqueued(reply)
        except operations.QueueFull as full:
            raise queue_full(name, full.depth, self.max_queue_depth) from None
        if (url, work.queue) not in self._announced and keys.tag_of(work.queue):  # the script could not
            with _redis_errors():
                self.links[url].sadd(keys.RQ_QUEUES, keys.rq_queue_key(work.queue))  # (another slot)
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

    def _ask_exchange(self, url: str, work: operations.Enqueue, requests: list[EmbedRequest], timeout: float) -> tuple:
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

    # -- results ---------------------------------------------------------------------------------
    def get(self, request_id: str) -> Result | None:
        """The result if it has landed (ok or error), else None."""
        url = self.url_of(request_id)
        with naming(self.shards, url), _redis_errors():
            raw = self.links[url].get(keys.result_key(request_id))
        return read_result(request_id, raw)

    def get_many(self, request_ids: list[str]) -> list[Result | None]:
        """`get` for many ids in one round trip per shard: each result that has landed, else None."""
        by_url: dict[str, list[int]] = {}
        for i, request_id in enumerate(request_ids):
            by_url.setdefault(self.url_of(request_id), []).append(i)
        found: list[Result | None] = [None] * len(request_ids)
        for url, positions in by_url.items():
            link, wanted = self.links[url], [keys.result_key(request_ids[i]) for i in positions]
            with naming(self.shards, url), _redis_errors():  # (several keys: refused while their slot moves)
                raw = slotmoves.while_moving(functools.partial(link.mget, wanted), link) if slotmoves.is_cluster(link) \
                    else link.mget(wanted)
            for i, blob in zip(positions, raw):
                found[i] = read_result(request_ids[i], blob)
        return found

    def embed(self, inputs, model: str | None = None, *, timeout: float = 60.0, **fields) -> np.ndarray:
        """Submit and wait: the embeddings as a numpy array of shape (n, d)."""
        return self._ask(timeout, inputs, model, **fields).embeddings

    # -- the other tasks (common.params.Task): submit with a task, wait, read its part of the result --------
    def score(self, text_1, text_2, model: str | None = None, *, timeout: float = 60.0, **fields) -> np.ndarray:
        """Scores of (text_1, text_2) pairs, one text against many or two lists pairwise: a cross-encoder's
        (through its activation), the cosine of two embeddings, or MaxSim of token vectors (ColBERT)."""
        firsts, seconds = score_pairs(text_1, text_2)
        return self._ask(timeout, firsts, model, text_pair=seconds, task="score", **fields).scores

    def rerank(self, query: str, documents: list[str], model: str | None = None, *, top_n: int | None = None,
               return_documents: bool = False, timeout: float = 60.0, **fields) -> list[dict]:
        """`documents` best first for `query`: [{index, relevance_score[, document]}], the first `top_n`."""
        documents = check_rerank(query, documents, top_n)
        return rank(self.score(query, documents, model, timeout=timeout, **fields), documents, top_n,
                    return_documents)

    def classify(self, inputs, model: str | None = None, *, timeout: float = 60.0, **fields) -> Result:
        """`.scores` (n, labels): probabilities (raw logits with use_activation=False); `.labels` names them."""
        return self._ask(timeout, inputs, model, task="classify", **fields)

    def token_embed(self, inputs, model: str | None = None, *, timeout: float = 60.0,
                    **fields) -> list[np.ndarray]:
        """One (tokens, d) array per input: every token's vector (multi-vector, ColBERT-style)."""
        return self._ask(timeout, inputs, model, task="token_embed", **fields).multi_vectors

    def sparse_embed(self, inputs, model: str | None = None, *, timeout: float = 60.0,
                     **fields) -> list[SparseVector]:
        """One sparse vector per input (bge-m3's lexical weights, a SPLADE model's): `.indices` (vocabulary ids,
        ascending) and `.values`; `sparse_top_k` and `sparse_threshold` keep fewer."""
        return self._ask(timeout, inputs, model, task="sparse_embed", **fields).sparse

    def encode(self, inputs, model: str | None = None, *, outputs=("dense", "sparse", "colbert"),
               timeout: float = 60.0, **fields) -> Result:
        """Several outputs of one forward pass of a multi-head model (bge-m3), in one result: `.dense` (n, d),
        `.sparse` (SparseVector per input), `.colbert` ((tokens, d) per input), as `outputs` asks."""
        return self._ask(timeout, inputs, model, outputs=list(outputs), **fields)

    def tokenize(self, inputs, model: str | None = None, *, timeout: float = 60.0, **fields) -> list[dict]:
        """Per text, by the model's own tokenizer: {ids, tokens, offsets, special}."""
        return self._ask(timeout, inputs, model, task="tokenize", **fields).items

    def detokenize(self, token_ids, model: str | None = None, *, timeout: float = 60.0, **fields) -> list[str]:
        """Per token-id list, its text."""
        return self._ask(timeout, token_ids, model, task="detokenize", **fields).items

    def status(self, request_id: str) -> str:
        """queued | started | finished | failed | cancelled | not_found; `started` too for a long request
        spread over the fleet whose parts still run."""
        return self._read(reads.status(self.shards, self._placed, request_id))

    def cancel(self, request_id: str) -> bool:
        """Cancel a request that no worker has taken yet; True if it was pending and is now cancelled."""
        target = self._read(reads.cancel(self.shards, self._placed, request_id))
        if target is None:  # answered already
            return False
        with _redis_errors():
            return operations.cancel(self.links[target.url], target.queue, target.answer, target.reply_to)

