"""What the routes share: the producer, the settings and the metrics, and the submit/wait steps."""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass, field

from fastapi import Request

from common.protocol import keys, operations
from common.errors import EmbedfleetError, ResultTimeoutError, ValidationError
from common.request import normalize_inputs
from common.result import Result
from producer import AsyncProducer
from producer.client.core import redis_errors
from producer.gateway.apikeys import KeyLimiter
from producer.gateway.metrics import Metrics
from producer.gateway.owners import may_see, no_such_job
from producer.gateway.schemas import EmbedBody
from producer.gateway.settings import GatewaySettings


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
        inputs = normalize_inputs(body.input)
        if len(inputs) > self.settings.max_inputs:
            raise ValidationError(f"{len(inputs)} inputs in one request; this gateway allows at most "
                                  f"{self.settings.max_inputs} (split the request)", param="input")
        fields = body.request_fields()
        if priority is not None:
            fields["priority"] = priority
        return await self.producer.submit(inputs, body.model, reply_to=reply_to, request_id=request_id, **fields)

    async def run(self, body: EmbedBody) -> Result:
        """Submit and wait up to the request timeout; a request that timed out is cancelled if still queued,
        so that no worker spends time on an answer nobody reads."""
        return await self.settle(await self.submit(body))

    async def run_task(self, inputs, model: str | None, task: str, fields: dict,
                       text_pair: list[str] | None = None) -> Result:
        """A request of `task` (producer.gateway.taskroutes), submitted and waited for like `run`'s."""
        inputs = normalize_inputs(inputs)
        if len(inputs) > self.settings.max_inputs:
            raise ValidationError(f"{len(inputs)} inputs in one request; this gateway allows at most "
                                  f"{self.settings.max_inputs} (split the request)", param="input")
        return await self.settle(await self.producer.submit(inputs, model, text_pair=text_pair, task=task,
                                                            **fields))

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
        if getattr(body, "webhook", None):  # a JobBody's: where the result goes (producer/gateway/webhooks.py)
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
            with redis_errors():
                raw = await self.producer.connection_at(url).mget([keys.job_options_key(i) for i in ids])
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


async def save_job_options(connection, request_id: str, options: str) -> None:
    """Keep a job's answer options until its result expires (the protocol's publish gives them the result's
    TTL when it lands; see common/protocol/keys.py)."""
    await operations.save_job_options(connection, request_id, options)


def gateway(request: Request) -> Gateway:
    """FastAPI dependency: the app's Gateway, built once in create_app."""
    return request.app.state.gateway
