"""What Producer and AsyncProducer offer, written once: every public method, its signature and its docstring.

A shared method builds its step with no I/O (a read of producer/client/reads.py, a request) and hands it to a
hook the client implements: `_read(read)` runs a read, `_ask(timeout, inputs, model, **submit)` submits one
request and waits for its result, `_then(step, fn)` is `fn` of a step's value (`fn` may return another step),
and a few `_..._at` hooks do one client's own round trip. Producer's hooks block and return the value;
AsyncProducer's return awaitables, and `AsyncProducer(Surface, awaits=True)` makes each shared method that does
I/O (`@io`) a coroutine. What cannot be shared honestly (submits and waits move their bytes differently: a
script per partition and BLMOVE/XREAD, against coalesced sends and a reply-stream hub) is declared here, with its
docstring, and written per client with the same signature. tests/unit/test_client_surface.py holds the two
surfaces equal, but for its list of intended differences (docs/python.md says them too).
"""

from __future__ import annotations

import abc
import functools
import inspect
import time
from collections.abc import Callable
from operator import attrgetter, itemgetter
from typing import Any

import numpy as np
import redis
import redis.asyncio as aioredis

from embedfleet.common.capabilities import ModelCapabilities
from embedfleet.common.errors import UnavailableError
from embedfleet.common.params import PoolingParams
from embedfleet.common.result import Result, SparseVector
from embedfleet.common.shards import ShardMap
from embedfleet.producer.client import fleetview, reads
from embedfleet.producer.client.core import Served, not_submitted, pick_model
from embedfleet.producer.client.remembered import Placements
from embedfleet.producer.client.fleet import LevelStats, level_stats
from embedfleet.producer.client.tasks import check_rerank, rank, score_pairs

Connection = redis.Redis | aioredis.Redis  # the client's own kind: blocking (Producer) or asyncio
Step = Any  # a hook's answer: the value itself (Producer), or an awaitable of it (AsyncProducer)


def io(method):
    """Marks a method that does I/O through the hooks: a coroutine in AsyncProducer."""
    method.does_io = True
    return method


def _as_coroutine(method):
    @functools.wraps(method)
    async def awaited(self, *args, **kwargs):
        step = method(self, *args, **kwargs)
        return (await step) if inspect.isawaitable(step) else step  # (a fast path answers at once)
    return awaited


class Surface(abc.ABC):
    """A client of the fleet: `submit` enqueues, `get`/`wait` read results, `embed` does both."""

    redis_url: str  # resolved once (the argument, EMBEDFLEET_REDIS_URL, the running `embedfleet up`'s, the default)
    shards: ShardMap
    redis: Connection  # the default Redis's client
    links: dict[str, Connection]  # the command connections of each Redis (shard), the default one first
    max_queue_depth: int | None  # submits refused (QueueFullError) while a model's queue holds this many jobs
    where: str  # named by a NoWorkerError: which Redis had no worker (core.looked_at)
    _served: Served
    _placed: Placements

    def __init_subclass__(cls, awaits: bool = False, **kwargs):
        """`awaits`: the client's hooks return awaitables, so each shared method that does I/O is made a coroutine."""
        super().__init_subclass__(**kwargs)
        for name, declared in vars(Surface).items():
            if name.startswith("_") or not callable(declared):
                continue
            own = getattr(cls, name)
            if own is declared:
                if awaits and getattr(declared, "does_io", False):
                    setattr(cls, name, _as_coroutine(declared))
            elif own.__doc__ is None:  # a client's own method: the docstring is the one declared here
                own.__doc__ = declared.__doc__

    # -- the hooks each client implements ----------------------------------------------------------
    @abc.abstractmethod
    def _read(self, read: reads.Read) -> Step:
        """Run a read of producer/client/reads.py (producer/client/exchanges.py)."""

    @abc.abstractmethod
    def _then(self, step: Step, fn: Callable[[Any], Any]) -> Step:
        """`fn` of `step`'s value; `fn` may return another step, whose value it then is."""

    @abc.abstractmethod
    def _ask(self, timeout: float, inputs, model: str | None = None, **submit) -> Step:
        """`submit(inputs, model, **submit)`, then `wait(id, timeout)`: the Result (its error raised)."""

    @abc.abstractmethod
    def _read_adverts(self) -> Step:
        """Read the adverts into `_served` (models())."""

    @abc.abstractmethod
    def _result_at(self, url: str, request_id: str) -> Step:
        """get() on the Redis at `url`."""

    @abc.abstractmethod
    def _results_at(self, urls: list[str], request_ids: list[str]) -> Step:
        """get_many() of ids on those Redis, one round trip each."""

    @abc.abstractmethod
    def _cancel_at(self, target: reads.Cancel, request_id: str) -> Step:
        """cancel()'s write (common.protocol.answering.cancel)."""

    @abc.abstractmethod
    def _exists(self, request_id: str) -> Step:
        """Whether the request has a job or a result (one round trip)."""

    # -- start and stop ----------------------------------------------------------------------------------
    @io
    @abc.abstractmethod
    def close(self) -> None:
        """Drop every connection (AsyncProducer: fail pending waits first, each step bounded, so that a Redis
        that stopped answering cannot hang a shutdown)."""

    @io
    @abc.abstractmethod
    def check(self) -> list[UnavailableError]:
        """Fail now, in one line, on a wrong password, a missing ACL permission or a certificate that does
        not verify, on any shard (common.redisclient.AccessError); an unreachable Redis raises as usual, but for
        a partition whose models have others (ShardMap.spare): returned, named (placement.unavailable), as the
        fleet goes on without it (submits go to the others, reads sum them)."""

    # -- models ------------------------------------------------------------------------------------
    @io
    def models(self, refresh: bool = True) -> dict[str, ModelCapabilities]:
        """Models served by at least one live worker, with their capabilities (read again when `refresh`, else
        trusted for core.CAPS_CACHE_SECONDS). AsyncProducer's concurrent callers share one read in flight."""
        if not self._served.stale(refresh):
            return self._served.models
        return self._then(self._read_adverts(), lambda _: self._served.models)

    def known_models(self) -> set[str]:
        """Every model ever advertised, served now or not (as of the last `models()` read): a model scaled
        to zero keeps its queues."""
        return set(self._served.known)

    @io
    def live_workers(self, model: str) -> int:
        """How many live workers serve `model`, over its partitions that answer."""
        return self._read(reads.live_workers(self.shards, model, time.time()))

    @io
    def workers(self, model: str) -> list[dict]:
        """The live workers of `model` with what each advertised (device, dtype, batch budget)."""
        return self._read(reads.workers(self.shards, model, time.time()))

    @io
    def fleet(self) -> dict:
        """Models, their queues per priority, live workers and recent failures (producer.client.fleetview)."""
        return self._read(fleetview.snapshot(self.shards))

    @io
    def queue_depth(self, model: str) -> int:
        """Requests queued for `model` at the default priority, over its partitions that answer."""
        return self._read(reads.queue_depth(self.shards, model))

    @io
    def level_stats(self, model: str) -> list[LevelStats]:
        """Per priority level of `model`: depth, estimated queued tokens, oldest job's age (producer.client.fleet)."""
        return self._read(level_stats(self.shards, model))

    # -- where requests go ------------------------------------------------------------------------------
    def urls(self) -> list[str]:
        """The URL of each Redis (shard) this producer talks to, the default one first."""
        return list(self.links)

    def connection_at(self, url: str) -> Connection:
        """The client (command connections) of the Redis at `url`, one of `urls()`."""
        return self.links[url]

    def connection_for_model(self, model: str | None) -> Connection:
        """The client of `model`'s Redis (of a partitioned model: its first partition's)."""
        return self.links[self.shards.url_for(model)]

    @io
    def url_for_submit(self, model: str | None) -> str:
        """The shard a submit for `model` goes to (None: the only served model's); of a partitioned model, its first
        partition (each submit is placed on one of them: producer/client/placement.py)."""
        if not self.shards or model is not None:
            return self.shards.url_for(model)
        return self._then(self.models(refresh=False), lambda served: self.shards.url_for(
            pick_model(None, served, self._served.known, self.where).name))

    @io
    def url_of(self, request_id: str) -> str:
        """The shard that holds `request_id`: where it was sent, else whichever has its result or job (the default
        Redis, unless sharded)."""
        return self._read(reads.locate(self.shards, self._placed, request_id))

    @io
    def connection_of(self, request_id: str) -> Connection:
        """The client of the shard that holds `request_id` (the only one, unless sharded)."""
        return self._then(self.url_of(request_id), self.connection_at)

    # -- submit ----------------------------------------------------------------------------------
    @io
    def submit(self, inputs, model: str | None = None, *, params: PoolingParams | None = None,
               reply_to: str | None = None, text_pair: list[str] | None = None, request_id: str | None = None,
               **fields) -> str:
        """Enqueue one request and return its id (`request_id`: the caller's own, see submit_many).

        `inputs`: a text, a list of texts, a token-id list or a list of token-id lists. `fields` are
        PoolingParams fields (dimensions, use_activation, truncate_prompt_tokens, embed_dtype, ...), `cache=False`
        to compute afresh (neither read from nor written to the fleet's vector cache, nor attached to an identical
        request in flight), and submit_many's `priority`, `deadline` and `timeout`.
        Unknown models, parameters the model cannot honour and full queues fail here, before enqueue.
        `task` (a field) picks the request kind; task "score" pairs each input with `text_pair`'s text.
        """
        return self._then(self.submit_many([inputs], model, params=params, reply_to=reply_to, text_pair=text_pair,
                                           request_ids=None if request_id is None else [request_id], **fields),
                          itemgetter(0))

    @io
    @abc.abstractmethod
    def submit_many(self, batches: list, model: str | None = None, *, params: PoolingParams | None = None,
                    reply_to: str | None = None, text_pair: list[str] | None = None,
                    priority: str | int | None = None, deadline: float | None = None, timeout: float | None = None,
                    request_ids: list[str] | None = None, **fields) -> list[str]:
        """Enqueue one request per element of `batches` (the other arguments as `submit`'s), in one round trip per
        partition they go to (one, unless the model is partitioned: placement.py); returns their ids.
        AsyncProducer's concurrent submits share their round trips (producer/client/asubmit.py).

        `request_ids`: the caller's own ids, one per request (core.chosen_ids): a submit repeated with the
        same ids is refused with DuplicateRequestError and enqueues nothing, so it is safe to retry.

        `priority`: "interactive" (default), "bulk", or vLLM's integer (<= 0 interactive, >= 1 bulk).
        `deadline` (unix time) / `timeout` (seconds from now): a request still queued then is answered
        `expired` (ExpiredError) and never computed. See common/scheduling.py.
        """

    # -- results ---------------------------------------------------------------------------------
    @io
    def get(self, request_id: str) -> Result | None:
        """The result if it has landed (ok or error), else None."""
        return self._then(self.url_of(request_id), lambda url: self._result_at(url, request_id))

    @io
    def get_many(self, request_ids: list[str]) -> list[Result | None]:
        """`get` for many ids in one round trip per shard: each result that has landed, else None."""
        ids = list(request_ids)
        return self._then(self._read(reads.locate_all(self.shards, self._placed, ids)),
                          lambda urls: self._results_at(urls, ids))

    @io
    @abc.abstractmethod
    def wait(self, request_id: str, timeout: float = 60.0) -> Result:
        """Block until the result lands, without polling, on the request's own wake-up path (its notify list or
        the reply stream it was submitted with); the result, or its own error raised.

        Raises NotFoundError for an id with neither a job nor a result (at once, or within the first look at an
        id this producer submitted), UnavailableError (retryable) when both vanish while it waits (Redis lost the
        request: restarted without its data, flushed, or it evicted the job), ResultTimeoutError (a built-in
        TimeoutError) after `timeout` seconds. A wake-up counts only once its result is there (anyone who can
        write to Redis can forge one). AsyncProducer's wait has no round trip of its own (it joins the producer's
        coalesced reads) and rides out a Redis outage shorter than its timeout; Producer's raises
        UnavailableError.
        """

    @io
    def status(self, request_id: str) -> str:
        """queued | started | finished | failed | cancelled | not_found; `started` too for a long request
        spread over the fleet whose parts still run."""
        return self._read(reads.status(self.shards, self._placed, request_id))

    @io
    def cancel(self, request_id: str) -> bool:
        """Cancel a request that no worker has taken yet; True if it was pending and is now cancelled."""
        return self._then(self._read(reads.cancel(self.shards, self._placed, request_id)),
                          lambda target: False if target is None else self._cancel_at(target, request_id))

    @io
    def raise_if_unknown(self, request_id: str) -> None:
        """NotFoundError for an id that was never submitted (or whose job and result both expired)."""
        return self._then(self._exists(request_id), functools.partial(_known, request_id))

    # -- submit and wait ----------------------------------------------------------------------------
    @io
    def embed(self, inputs, model: str | None = None, *, timeout: float = 60.0, **fields) -> np.ndarray:
        """Submit and wait: the embeddings as a numpy array of shape (n, d). `fields`: as `submit`'s."""
        return self._then(self._ask(timeout, inputs, model, **fields), _EMBEDDINGS)

    # the other tasks (common.params.Task): submit with a task, wait, read its part of the result
    @io
    def score(self, text_1, text_2, model: str | None = None, *, timeout: float = 60.0, **fields) -> np.ndarray:
        """Scores of (text_1, text_2) pairs, one text against many or two lists pairwise: a cross-encoder's
        (through its activation), the cosine of two embeddings, or MaxSim of token vectors (ColBERT)."""
        firsts, seconds = score_pairs(text_1, text_2)
        return self._then(self._ask(timeout, firsts, model, text_pair=seconds, task="score", **fields), _SCORES)

    @io
    def rerank(self, query: str, documents: list[str], model: str | None = None, *, top_n: int | None = None,
               return_documents: bool = False, timeout: float = 60.0, **fields) -> list[dict]:
        """`documents` best first for `query`: [{index, relevance_score[, document]}], the first `top_n`."""
        documents = check_rerank(query, documents, top_n)
        return self._then(self.score(query, documents, model, timeout=timeout, **fields),
                          lambda scores: rank(scores, documents, top_n, return_documents))

    @io
    def classify(self, inputs, model: str | None = None, *, timeout: float = 60.0, **fields) -> Result:
        """`.scores` (n, labels): probabilities (raw logits with use_activation=False); `.labels` names them."""
        return self._ask(timeout, inputs, model, task="classify", **fields)

    @io
    def token_embed(self, inputs, model: str | None = None, *, timeout: float = 60.0, **fields) -> list[np.ndarray]:
        """One (tokens, d) array per input: every token's vector (multi-vector, ColBERT-style)."""
        return self._then(self._ask(timeout, inputs, model, task="token_embed", **fields), _MULTI_VECTORS)

    @io
    def sparse_embed(self, inputs, model: str | None = None, *, timeout: float = 60.0,
                     **fields) -> list[SparseVector]:
        """One sparse vector per input (bge-m3's lexical weights, a SPLADE model's): `.indices` (vocabulary ids,
        ascending) and `.values`; `sparse_top_k` and `sparse_threshold` keep fewer."""
        return self._then(self._ask(timeout, inputs, model, task="sparse_embed", **fields), _SPARSE)

    @io
    def encode(self, inputs, model: str | None = None, *, outputs=("dense", "sparse", "colbert"),
               timeout: float = 60.0, **fields) -> Result:
        """Several outputs of one forward pass of a multi-head model (bge-m3), in one result: `.dense` (n, d),
        `.sparse` (SparseVector per input), `.colbert` ((tokens, d) per input), as `outputs` asks."""
        return self._ask(timeout, inputs, model, outputs=list(outputs), **fields)

    @io
    def tokenize(self, inputs, model: str | None = None, *, timeout: float = 60.0, **fields) -> list[dict]:
        """Per text, by the model's own tokenizer: {ids, tokens, offsets, special}."""
        return self._then(self._ask(timeout, inputs, model, task="tokenize", **fields), _ITEMS)

    @io
    def detokenize(self, token_ids, model: str | None = None, *, timeout: float = 60.0, **fields) -> list[str]:
        """Per token-id list, its text."""
        return self._then(self._ask(timeout, token_ids, model, task="detokenize", **fields), _ITEMS)


_EMBEDDINGS, _SCORES, _MULTI_VECTORS, _SPARSE, _ITEMS = map(attrgetter, ("embeddings", "scores", "multi_vectors",
                                                                         "sparse", "items"))


def _known(request_id: str, found: bool) -> None:
    if not found:
        raise not_submitted(request_id)
