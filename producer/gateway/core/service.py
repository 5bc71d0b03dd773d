"""What the routes share: the producer, the settings and the metrics, and the submit/wait steps."""

from __future__ import annotations

import contextlib
import functools
import json
from dataclasses import dataclass, field

from fastapi import Request

from pydantic import ValidationError as PydanticValidationError

from embedfleet.common.capabilities import ModelCapabilities
from embedfleet.common.errors import EmbedfleetError, ResultTimeoutError, ValidationError, invalid_request
from embedfleet.common.params import PoolingParams
from embedfleet.common.protocol import answering, keys, slotmoves
from embedfleet.common.request import new_request_id, normalize_inputs
from embedfleet.common.result import Result
from embedfleet import AsyncProducer
from embedfleet.producer.client.placement import naming
from embedfleet.producer.client.core import pick_model
from embedfleet.producer.client.redisfaults import redis_errors
from embedfleet.producer.gateway.core.apikeys import KeyLimiter
from embedfleet.producer.gateway.core.metrics import Metrics
from embedfleet.producer.gateway.core.owners import may_see, no_such_job
from embedfleet.producer.gateway.core.schemas import EmbedBody
from embedfleet.producer.gateway.settings import GatewaySettings


@dataclass
class Gateway:
    settings: GatewaySettings
    producer: AsyncProducer
    metrics: Metrics
    limiter: KeyLimiter | None = None  # built from the settings when not given
    deliveries: dict = field(default_factory=dict)  # Redis URL -> webhooks.Deliveries (app.py starts them)

    def __post_init__(self):
        if self.limiter is None:
            self.limiter = KeyLimiter(self.settings.keys, self.settings.max_in_flight)

    async def submit(self, body: EmbedBody, reply_to: str | None = None, *, request_id: str | None = None,
                     priority: str | None = None) -> str:
        """Enqueue the body's inputs (a fleet with no live worker raises NoWorkerError: a 503).

        request_id: the caller's own id (a batch line's; a repeated id raises DuplicateRequestError);
        priority: overrides the body's (a batch runs its lines at `bulk`)."""
        fields = body.request_fields()
        if priority is not None:
            fields["priority"] = priority
        if body.messages is not None:  # one conversation, rendered by the worker (producer/gateway/core/chat.py)
            return await self.producer.submit(None, body.model, reply_to=reply_to, request_id=request_id,
                                              **fields, **body.chat_fields())
        inputs = normalize_inputs(body.input)
        if len(inputs) > self.settings.max_inputs:
            raise ValidationError(f"{len(inputs)} inputs in one request; this gateway allows at most "
                                  f"{self.settings.max_inputs} (split the request)", param="input")
        return await self.producer.submit(inputs, body.model, reply_to=reply_to, request_id=request_id, **fields)

    async def run(self, body: EmbedBody) -> Result:
        """Submit and wait up to the request timeout; a request that timed out is cancelled if still queued,
        so that no worker spends time on an answer nobody reads."""
        if body.truncate_prompt_tokens == 0:
            return await self.no_inputs(body.model, body.param_fields())
        return await self.settle(await self.submit(body))

    async def run_task(self, inputs, model: str | None, task: str, fields: dict,
                       text_pair: list[str] | None = None) -> Result:
        """A request of `task` (producer.gateway.tasks.routes), submitted and waited for like `run`'s; `fields`
        may hold `chat` (a conversation instead of `inputs`, which are None then: producer/gateway/core/chat.py)."""
        if fields.get("chat") is not None:
            return await self.settle(await self.producer.submit(None, model, task=task, **fields))
        if fields.get("truncate_prompt_tokens") == 0:
            return await self.no_inputs(model, {**fields, "task": task})
        inputs = normalize_inputs(inputs)
        if len(inputs) > self.settings.max_inputs:
            raise ValidationError(f"{len(inputs)} inputs in one request; this gateway allows at most "
                                  f"{self.settings.max_inputs} (split the request)", param="input")
        return await self.settle(await self.producer.submit(inputs, model, text_pair=text_pair, task=task,
                                                            **fields))

    async def capabilities(self, model: str | None) -> ModelCapabilities:
        """The served model `model` names (None: the only one), or the error Producer.submit would raise."""
        served = await self.producer.models(refresh=False)
        if model not in served:  # a worker may have come up since the cached read
            served = await self.producer.models()
        return pick_model(model, served, self.producer.known_models())

    async def no_inputs(self, model: str | None, fields: dict) -> Result:
        """vLLM's `truncate_prompt_tokens: 0`: every input cut to no tokens, which vLLM answers with no rows and
        0 prompt tokens without running the model. The model and the other fields are still verified, so that
        a mistake is not hidden by the 0; nothing is queued."""
        caps = await self.capabilities(model)
        try:
            params = PoolingParams(**{k: v for k, v in fields.items() if k != "truncate_prompt_tokens"}).resolve(caps)
        except PydanticValidationError as exc:
            raise invalid_request(exc.errors()) from exc
        return empty_result(caps, params)

    async def settle(self, request_id: str) -> Result:
        try:
            return await self.producer.wait(request_id, self.settings.request_timeout)
        except ResultTimeoutError:
            with contextlib.suppress(EmbedfleetError):
                await self.producer.cancel(request_id)
            raise

    # -- async jobs: how to answer a job, and whose it is, is kept next to it ------------------------
    async def save_job_options(self, request_id: str, body: EmbedBody, owner: str | None = None) -> None:
        """Keep how to answer the job, where its webhook goes and (with API keys) whose it is (owners.py)."""
        options = {"encoding_format": body.encoding_format, "explicit_layout": body.explicit_layout}
        if getattr(body, "webhook", None):  # a JobBody's: where the result goes (producer/gateway/jobs/webhooks.py)
            options["webhook"] = body.webhook
        if owner is not None:
            options["owner"] = owner
        options = json.dumps(options)
        with redis_errors():
            await save_job_options(await self.producer.connection_of(request_id), request_id, options)

    async def job_options(self, request_id: str) -> dict:
        """The job's stored options, or the defaults when none are stored (webhooks: no URL, no owner)."""
        return (await self.stored_options([request_id]))[request_id] or dict(DEFAULT_OPTIONS)

    async def stored_options(self, request_ids: list[str]) -> dict[str, dict | None]:
        """Each job's stored options (None: none stored), in one MGET per Redis."""
        by_url: dict[str, list[str]] = {}
        for request_id in request_ids:
            by_url.setdefault(await self.producer.url_of(request_id), []).append(request_id)
        found: dict[str, dict | None] = {}
        for url, ids in by_url.items():
            connection, wanted = self.producer.connection_at(url), [keys.job_options_key(i) for i in ids]
            with naming(self.producer.shards, url), redis_errors():  # a partition that is down: which one
                raw = await slotmoves.while_moving_async(functools.partial(connection.mget, wanted))  # (resharding)
            found.update((i, json.loads(r) if r else None) for i, r in zip(ids, raw))
        return found

    async def visible_jobs(self, request_ids: list[str], owner: str | None) -> dict[str, dict]:
        """The options of each job the caller (key fingerprint `owner`) may see; the others are left out."""
        keyed = bool(self.settings.keys)
        return {i: options or dict(DEFAULT_OPTIONS)
                for i, options in (await self.stored_options(request_ids)).items()
                if may_see(options, owner, keyed)}

    async def visible_job(self, request_id: str, owner: str | None) -> dict:
        """The job's options if the caller may see it; else the NotFoundError of an id with no job."""
        options = (await self.visible_jobs([request_id], owner)).get(request_id)
        if options is None:
            raise no_such_job(request_id)
        return options


DEFAULT_OPTIONS = {"encoding_format": "float", "explicit_layout": False}


def empty_result(caps: ModelCapabilities, params: PoolingParams) -> Result:
    """A result of no rows, laid out as `params.task` lays out its rows (common/result.py)."""
    task = params.task
    if task == "score":
        shape: tuple[int, ...] = (0,)
    elif task in ("classify", "token_classify"):
        shape = (0, len(caps.labels))
    else:
        shape = (0, params.output_size(caps))
    result = Result(id=new_request_id(), model=caps.name, shape=shape, embed_dtype=params.embed_dtype,
                    endianness="little")
    if task == "embed":
        return result
    return result.with_task(task, parts=() if task.startswith("token_") else None,
                            labels=caps.labels if task in ("classify", "token_classify") else ())


async def save_job_options(connection, request_id: str, options: str) -> None:
    """Keep a job's answer options until its result expires (the protocol's publish gives them the result's
    TTL when it lands; see common/protocol/keys.py)."""
    await answering.save_job_options(connection, request_id, options)


def gateway(request: Request) -> Gateway:
    """FastAPI dependency: the app's Gateway, built once in create_app."""
    return request.app.state.gateway
