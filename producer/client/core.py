"""What the sync and async producers share, with no I/O: building and routing requests, picking models,
decoding results and job states (what they read from Redis, and what it means: producer/client/reads.py)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from pydantic import ValidationError as PydanticValidationError
from rq.job import JobStatus

from embedfleet.common.chat import CHAT_INPUT
from embedfleet.common.capabilities import ModelCapabilities
from embedfleet.common.codec import unpackb
from embedfleet.common.errors import (NO_WORKER_HINT, DecodeError, NotFoundError, NoWorkerError, QueueFullError,
                                      UnavailableError, UnknownModelError, ValidationError, echo, invalid_request)
from embedfleet.common.fleetstate import DEFAULT_REDIS_URL
from embedfleet.common.names import (MAX_REQUEST_ID_LENGTH, PRIORITIES, tag_of, tagged_request_id, untagged,
                                     valid_request_id)
from embedfleet.common.params import PoolingParams
from embedfleet.common.protocol import enqueueing, keys
from embedfleet.common.redisclient import cluster_tag, redact
from embedfleet.common.request import EmbedRequest, normalize_inputs
from embedfleet.common.scheduling import DEFAULT_PRIORITY, priority_level, resolve_deadline
from embedfleet.common.result import Result
from embedfleet.common.serializer import MsgpackSerializer
from embedfleet.producer.client import traced

SERIALIZER = MsgpackSerializer
CAPS_CACHE_SECONDS = 2.0  # how long a producer trusts the advertised capabilities before re-reading them


def parse_models(names: list[str], raw_caps: list[bytes | None]) -> dict[str, ModelCapabilities]:
    """Models whose advertisement has not expired, i.e. served by at least one live worker."""
    return {name: ModelCapabilities.decode(raw) for name, raw in zip(names, raw_caps) if raw is not None}


@dataclass
class Served:
    """A client's last read of the adverts (its `models()`): the models served then, every name ever
    advertised (in Redis, or seen by this client), and when it was read (trusted for CAPS_CACHE_SECONDS)."""

    models: dict[str, ModelCapabilities] = field(default_factory=dict)
    known: set[str] = field(default_factory=set)
    read_at: float = float("-inf")

    def stale(self, refresh: bool) -> bool:
        return refresh or time.monotonic() - self.read_at > CAPS_CACHE_SECONDS

    def update(self, found: tuple[dict[str, ModelCapabilities], set[str]]) -> None:
        # Names seen before stay known: a Redis restarted empty (or failed over) has lost its registry until
        # the workers advertise again, and a model served a moment ago is then 503 no_worker (retry), never
        # 404 unknown (a client's mistake, not retried).
        models, known = found
        self.known = set(known) | self.known | set(self.models) | set(models)
        self.models = models
        self.read_at = time.monotonic()


WORKER_FIELDS = {"model": str, "device": str, "dtype": str, "max_batch_tokens": int, "max_batch_size": int,
                 "budget_source": str, "max_jobs": int, "host": str, "pid": int, "cuda_visible_devices": str,
                 # the engine (worker/engine/backends) and its probe cosine against float32 torch
                 "engine": str, "fidelity": (int, float),
                 # packed or padded forward (worker/engine/packed.py); which of a device's --replicas ("2/4")
                 "forward": str, "replica": str,
                 # what changes, refreshed with each advert (worker/serving/livestats.py): status, /dashboard
                 "state": str, "current_requests": int, "current_texts": int, "texts_per_s": (int, float),
                 "texts_history": list, "history_bucket_s": int, "rounds": int, "texts_done": int,
                 "started_at": (int, float), "cache_hits": int, "cache_misses": int,
                 "pass_tokens_per_s": (int, float),  # the learned shape's measured rate (worker/engine/shaper.py)
                 # the forward pass's CPU threads, why that many, and how they wait (worker/engine/cpus.py)
                 "threads": int, "threads_source": str, "omp_wait_policy": str, "omp_spin_count": str}


def parse_worker_info(name: str, raw: bytes | None) -> dict | None:
    """A worker's advertised facts (worker/serving/advertise.py), the known fields of the right type only: what
    Redis holds is input. None when the worker's advert has expired or is unreadable."""
    if raw is None:
        return None
    try:
        data = unpackb(raw)
    except Exception:  # noqa: BLE001 - any undecodable advert reads as absent
        return None
    if not isinstance(data, dict):
        return None
    return {"name": name, **{field: data[field] for field, kind in WORKER_FIELDS.items()
                             if isinstance(data.get(field), kind) and not isinstance(data.get(field), bool)}}


def pick_model(model: str | None, served: dict[str, ModelCapabilities],
               known: set[str] = frozenset(), where: str | None = None) -> ModelCapabilities:
    """The capabilities of `model` (or of the only served model), or the error that explains why not.

    `known` holds every model ever advertised: one of those without a live worker is a NoWorkerError
    (retry later), a name never seen an UnknownModelError (the caller's mistake). `where`: the Redis the
    adverts were read from (`looked_at`), named in the message when no worker is alive there; None (the
    gateway, whose clients do not choose a Redis): not named.
    """
    if model is None:
        if len(served) == 1:
            return next(iter(served.values()))
        if not served:
            if where is None:
                raise NoWorkerError("no model is served: no worker is alive (start one with "
                                    "`embedfleet worker --model ...`)", param="model")
            raise NoWorkerError(f"no model is served on {where}: no worker is alive there; {NO_WORKER_HINT}",
                                param="model")
        raise ValidationError(f"several models are served, name one with `model`: {sorted(served)}",
                              param="model")
    if model in served:
        return served[model]
    if model in known:
        there = f" on {where}" if where is not None else ""
        raise NoWorkerError(f"model '{echo(model)}' has no live worker{there}: start one with "
                            f"`embedfleet worker --served-model-name {echo(model)}`", param="model")
    if not served and where is not None:  # nothing is served there at all: the wrong Redis, or no fleet yet
        raise UnknownModelError(f"model '{echo(model)}' is not served on {where}: no worker is alive there; "
                                f"{NO_WORKER_HINT}", param="model")
    listed = sorted(served) or "none (no worker is running)"
    raise UnknownModelError(f"model '{echo(model)}' is not served by any live worker; served models: {listed}",
                            param="model")


def looked_at(urls: list[str]) -> str:
    """The Redis a client reads (its default URL, then any shards'), for messages: passwords hidden, and the
    fallback URL said to be one (it is often some other program's Redis)."""
    named = ", ".join(redact(url) for url in urls)
    if urls[0] == DEFAULT_REDIS_URL:
        named += (" (the fallback URL: no redis_url or --redis-url was given, EMBEDFLEET_REDIS_URL is unset, and no "
                  "`embedfleet up` is running)")
    return f"Redis {named}"


def resolve_target(model: str | None, served: dict[str, ModelCapabilities], known: set[str],
                   priority: str | int | None, deadline: float | None, timeout: float | None,
                   where: str | None = None) -> tuple[ModelCapabilities | str, str, float | None]:
    """(the model's capabilities, or only its name for bulk work waiting for a worker scaled from zero;
    the priority level; the absolute deadline) of a submit. Raises what pick_model raises otherwise."""
    level = priority_level(priority)
    when = resolve_deadline(deadline, timeout, time.time())
    try:
        caps = pick_model(model, served, known, where)
    except NoWorkerError:
        if level == DEFAULT_PRIORITY or model is None:
            raise
        caps = model  # bulk work waits for a worker scaled from zero (deploy/autoscaling.md)
    return caps, level, when


def build_request(inputs, caps: ModelCapabilities | str, params: PoolingParams | None, fields: dict,
                  reply_to: str | None = None, text_pair: list[str] | None = None,
                  deadline: float | None = None, request_id: str | None = None,
                  trace: tuple[str | None, str | None] | None = None) -> EmbedRequest:
    """A request checked against the advertised capabilities (the worker checks again).

    The request carries the params as the caller gave them, so the worker merges its own defaults.
    `caps` may be only a model's name (a bulk request for a model scaled to zero, whose capabilities no
    live worker advertises): then only the request's own shape is checked here, and the worker verifies
    the rest when it starts.
    `request_id`: the caller's own id (checked by `chosen_ids`); None: a new random one.
    `trace`: (traceparent, tracestate) the request carries; None: the current span's, where the application
    traces (the client's submit span, producer/client/traced.py), else none.
    `fields` may hold `cache` (False: bypass the fleet's vector cache) and `chat` (a ChatInput, or its dict: one
    conversation the worker renders with the model's chat template; `inputs` None) besides the PoolingParams
    fields.
    """
    fields = dict(fields)
    trace = traced.current() if trace is None else trace
    cache = fields.pop("cache", True)
    chat = fields.pop("chat", None)  # a conversation (common/chat.py): its inputs are the one placeholder
    if chat is not None and inputs is None:
        inputs = [CHAT_INPUT]
    try:
        if params is not None:  # fields override the given params, and are validated like them
            fields = {**params.model_dump(exclude_unset=True), **fields}
        request = EmbedRequest(model=caps if isinstance(caps, str) else caps.name, inputs=normalize_inputs(inputs),
                               params=PoolingParams(**fields), reply_to=reply_to, text_pair=text_pair,
                               deadline=deadline, cache=cache, chat=chat, traceparent=trace[0],
                               tracestate=trace[1], **({"id": request_id} if request_id else {}))
    except PydanticValidationError as exc:  # the gateway's schema errors meet the same formatter
        raise invalid_request(_public_names(exc.errors())) from exc
    if not isinstance(caps, str):
        request.resolve(caps)
    return request


def _public_names(errors: list[dict]) -> list[dict]:
    """EmbedRequest's `inputs` is the `input` of the routes (OpenAI's name, and our input_too_long's param)."""
    return [{**err, "loc": ("input", *err["loc"][1:])} if tuple(err.get("loc", ()))[:1] == ("inputs",) else err
            for err in errors]


def tagged_ids(chosen: list[str | None], tag: str) -> list[str | None]:
    """On a Redis Cluster (`tag`: the model's hash tag, names.slot_tag): new ids in the model's slot, and a
    chosen id must carry the tag; on a plain Redis (`tag` '') `chosen` as it is."""
    if not tag:
        return chosen
    wrong = [i for i in chosen if i is not None and tag_of(i) != tag]
    if wrong:
        raise ValidationError(f"request id {wrong[0]!r} lacks its model's hash tag {tag}: on a Redis Cluster a "
                              f"chosen id is {tag} followed by [A-Za-z0-9_-] (names.slot_tag)", param="request_ids")
    return [tagged_request_id(tag) if i is None else i for i in chosen]


def chosen_ids(request_ids: list[str] | None, count: int) -> list[str | None]:
    """The caller's own ids for `count` requests (None each: new random ones), checked before any I/O.

    A chosen id makes a submit idempotent: the enqueue script refuses an id that already names a job or a
    result (DuplicateRequestError, nothing enqueued), so a caller that cannot know whether its earlier submit
    reached Redis (it crashed, or the connection dropped) submits again with the same id and learns which."""
    if request_ids is None:
        return [None] * count
    if len(request_ids) != count:
        raise ValidationError(f"{len(request_ids)} request ids for {count} requests: give one id per request",
                              param="request_ids")
    bad = [i for i in request_ids if not valid_request_id(i)]
    if bad:
        raise ValidationError(f"request id {echo(repr(bad[0]))} is not valid: 1 to {MAX_REQUEST_ID_LENGTH} "
                              "letters, digits, '_' or '-'", param="request_ids")
    if len(set(request_ids)) != count:
        raise ValidationError("the request ids repeat: each request needs its own id", param="request_ids")
    return list(request_ids)


def enqueue_args(queue: str, requests: list[EmbedRequest], max_depth: int | None = None,
                 fresh: bool = False) -> enqueueing.Enqueue:
    """The enqueue of `requests` on `queue` (common/protocol/enqueueing.py); `fresh`: their ids are new random
    ones (none chosen by the caller), which the script does not look up. A request that cannot be encoded
    fails here, as the caller's own ValidationError, before any I/O."""
    try:
        return enqueueing.enqueue_args(queue, requests, max_depth=max_depth, fresh=fresh)
    except (OverflowError, TypeError, ValueError) as exc:  # msgpack refused a value the models let through
        raise ValidationError(f"the request cannot be encoded: {exc}", param="input") from exc


def queue_full(model: str, depth: int, limit: int | None) -> QueueFullError:
    return QueueFullError(f"the queue of model '{model}' holds {depth} requests, the limit is {limit}: retry later")


PENDING = ("queued", "started")  # job states in which a result is still to come


def lost_error(request_id: str) -> UnavailableError:
    """A request known to be there (submitted by us, or found when its wait began) that now has neither a job
    nor a result: Redis lost it. Retryable (503): sending the same request again is the whole remedy."""
    return UnavailableError(f"request {request_id} is gone from Redis before its result was stored (Redis "
                            "restarted without its data, was flushed, or evicted or deleted its job); "
                            "send it again")


def not_submitted(request_id: str) -> NotFoundError:
    """An id with neither a job nor a result, not known to be lost: never submitted, or expired."""
    return NotFoundError(f"no request with id {request_id} (never submitted, or it expired)", param="id")


def by_url(urls: list[str]) -> dict[str, list[int]]:
    """The positions of each URL in `urls` (where each of many ids lies): one round trip per Redis."""
    positions: dict[str, list[int]] = {}
    for index, url in enumerate(urls):
        positions.setdefault(url, []).append(index)
    return positions


def read_result(request_id: str, raw: bytes | None) -> Result | None:
    """The result blob stored for `request_id`, decoded; one that names another request is refused (it
    was not written for this request, whoever wrote it)."""
    if raw is None:
        return None
    result = Result.decode(raw)
    if result.id != request_id:
        raise DecodeError(f"the result stored for request {request_id} names request {echo(repr(result.id))}: it "
                          "was not written for this request", raw)
    return result


def job_state(status: JobStatus | None) -> str:
    """Collapse rq's job statuses into the few a producer reports before a result exists."""
    if status is None:
        return "not_found"
    if status in (JobStatus.QUEUED, JobStatus.DEFERRED, JobStatus.SCHEDULED):
        return "queued"
    if status == JobStatus.CANCELED:
        return "cancelled"
    if status == JobStatus.STARTED:
        return "started"
    return status.value


def result_state(result: Result) -> str:
    if result.ok:
        return "finished"
    return "cancelled" if result.error_code == "cancelled" else "failed"


def model_queue(url: str, model: str, priority: str = "interactive") -> str:
    """`model`'s queue at `priority` on the Redis at `url` (with the model's hash tag on a Redis Cluster)."""
    return keys.queue_name(model, priority, cluster_tag(url, model))


def model_of_queue(queue: str) -> str:
    queue = untagged(queue)  # (a Redis Cluster's queue names carry the model's hash tag)
    prefix = keys.queue_name("")
    model = queue[len(prefix):] if queue.startswith(prefix) else queue
    for level in PRIORITIES[1:]:  # a lower level's queue: <queue>@<level>
        if queue == keys.queue_name(model.removesuffix(f"@{level}"), level):
            return model.removesuffix(f"@{level}")
    return model

